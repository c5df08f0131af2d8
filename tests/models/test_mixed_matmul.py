"""The bfloat16 matmul's gradients: bfloat16 operands, float32 sums, float32 weight gradient."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import mixed_matmul
from agentrl_jax.models import transformer as tfm

BF16 = jnp.dtype(jnp.bfloat16)


def _operands(n=24, k=40, m=16):
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (n, k)).astype(jnp.bfloat16)
  w = jax.random.normal(keys[1], (k, m)) * 0.3  # a float32 parameter
  g = jax.random.normal(keys[2], (n, m)).astype(jnp.bfloat16)
  return x, w, g


def _f64(a):
  return np.asarray(a.astype(jnp.float32), np.float64)


def test_forward_is_bfloat16_products_summed_in_float32():
  x, w, _ = _operands()
  y = mixed_matmul.mixed_matmul(x, w, BF16)
  assert y.dtype == BF16
  exact = _f64(x) @ _f64(w.astype(jnp.bfloat16))
  np.testing.assert_allclose(_f64(y), exact, rtol=2 ** -8, atol=1e-6)


def test_gradients_match_the_exact_products_of_the_rounded_values():
  x, w, g = _operands()
  _, vjp = jax.vjp(lambda a, b: mixed_matmul.mixed_matmul(a, b, BF16), x, w)
  dx, dw = jax.jit(vjp)(g)
  assert dx.dtype == BF16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(_f64(dx), _f64(g) @ _f64(w.astype(jnp.bfloat16)).T,
                             rtol=2 ** -8, atol=1e-6)
  # The weight gradient keeps float32 precision: JAX's own transpose of the cast returned it
  # rounded to bfloat16 (relative error up to 2^-9), far outside this tolerance.
  np.testing.assert_allclose(_f64(dw), _f64(x).T @ _f64(g), rtol=1e-5, atol=1e-5)


def test_float32_output_keeps_jaxs_own_gradients():
  x, w, _ = _operands()
  g = jax.random.normal(jax.random.key(3), (x.shape[0], w.shape[1]))

  def plain(a, b):
    return jnp.matmul(a, b.astype(a.dtype), preferred_element_type=jnp.float32)

  ours = jax.vjp(lambda a, b: mixed_matmul.mixed_matmul(a, b, jnp.dtype(jnp.float32)), x, w)
  theirs = jax.vjp(plain, x, w)
  np.testing.assert_array_equal(ours[0], theirs[0])
  for a, b in zip(ours[1](g), theirs[1](g)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (6, 1)])
def test_transposed_is_the_transpose(shape):
  a = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
  np.testing.assert_array_equal(jax.jit(mixed_matmul.transposed)(a), a.T)


def test_bfloat16_transformer_gradients_follow_float32():
  # The whole model: every weight matmul through mixed_matmul, attention and norms as before.
  cfg = tfm.tiny(64, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, qkv_bias=True)
  graphdef, params = tfm.create(cfg, seed=0)
  bf16_graphdef, _ = tfm.create(dataclasses.replace(cfg, dtype="bfloat16"), seed=0)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
  turns = jnp.broadcast_to(jnp.repeat(jnp.arange(2, dtype=jnp.int32), 6), (2, 12))
  pos = tfm.positions_from_turns(turns)

  def loss(graph):
    def fn(p):
      logits, _ = tfm.apply(graph, p, tokens, pos)
      logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
      return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
    return jax.jit(jax.grad(fn))

  full, half = loss(graphdef)(params), loss(bf16_graphdef)(params)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(half)):
    assert b.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(a))) + 1e-6
    assert float(jnp.max(jnp.abs(a - b))) < 0.05 * scale


def _dots(jaxpr):
  """Every dot_general in a jaxpr and the jaxprs nested in its equations (scan, pjit, vjp)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from _dots(inner)


def test_bfloat16_transformer_runs_its_weight_gradients_on_bfloat16_operands():
  cfg = tfm.tiny(64, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, dtype="bfloat16")
  graphdef, params = tfm.create(cfg, seed=0)
  tokens = jnp.zeros((2, 8), jnp.int32)
  pos = tfm.positions_from_turns(jnp.zeros((2, 8), jnp.int32))

  def loss(p):
    return jnp.mean(tfm.apply(graphdef, p, tokens, pos)[0] ** 2)

  dots = list(_dots(jax.make_jaxpr(jax.grad(loss))(params).jaxpr))
  low = [e for e in dots if all(v.aval.dtype == jnp.bfloat16 for v in e.invars)]
  # q, k, v, o, gate, up, down in each layer: the forward and both gradients of each.
  assert len(low) >= 3 * 7 * cfg.num_layers, (len(low), len(dots))


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
def test_gradients_of_a_batch_sharded_input(axis_type):
  # The batch axis sharded over the 8 test devices: an explicitly sharded one cannot be
  # flattened for the CPU transpose, and takes the plain one.
  mesh = jax.make_mesh((8,), ("data",), axis_types=(getattr(jax.sharding.AxisType, axis_type),))
  x, w, g = _operands(n=32)
  x = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
  vjp = lambda a, b: jax.vjp(lambda a, b: mixed_matmul.mixed_matmul(a, b, BF16), a, b)[1](g)
  dx, dw = jax.jit(vjp)(x, w)
  np.testing.assert_allclose(_f64(dw), _f64(x).T @ _f64(g), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(_f64(dx), _f64(g) @ _f64(w.astype(jnp.bfloat16)).T,
                             rtol=2 ** -8, atol=1e-6)
