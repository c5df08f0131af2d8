"""Blocked attention core: values and gradients against a NumPy loop, for every mask it serves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import attention


def _reference(q, k, v, allowed, distance=None, slopes=None):
  """One query, one head at a time: softmax over the allowed keys (all keys if none is).

  k, v: [B, S, KV, D] here (the kernel takes them heads-major, [B, KV, S, D]).
  """
  b, t, kv, g, d = q.shape
  out = np.zeros(q.shape, np.float64)
  for bi in range(b):
    for ti in range(t):
      for h in range(kv):
        for gi in range(g):
          s = k[bi, :, h] @ q[bi, ti, h, gi] / np.sqrt(d)
          if distance is not None:
            s = s - slopes[h, gi] * distance[bi, ti]
          keep = allowed[bi, ti]
          s = np.where(keep, s, -np.inf) if keep.any() else np.zeros_like(s)
          p = np.exp(s - s.max())
          out[bi, ti, h, gi] = (p / p.sum()) @ v[bi, :, h]
  return out


def _heads_major(x):
  return jnp.swapaxes(jnp.asarray(x), 1, 2)


def _case(seed, b=2, t=11, s=11, kv=2, g=3, d=4, cache=False):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, kv, g, d)).astype(np.float32)
  k = rng.normal(size=(b, s, kv, d)).astype(np.float32)
  v = rng.normal(size=(b, s, kv, d)).astype(np.float32)
  qpos = np.arange(t)[None] + (s - t if cache else 0)
  distance = (qpos[:, :, None] - np.arange(s)[None, None, :]).repeat(b, 0)
  allowed = distance >= 0
  floor = rng.integers(0, 4, size=(b, t))  # a context floor, as rollout/context.py sets
  allowed &= np.arange(s)[None, None, :] >= floor[:, :, None]
  allowed[0, 2] = False  # a query that may read nothing
  return q, k, v, allowed, distance.astype(np.float32)


@pytest.mark.parametrize("block", [1, 4, 11, 32])
@pytest.mark.parametrize("alibi", [False, True])
def test_values_match_loop_reference(block, alibi):
  q, k, v, allowed, distance = _case(0)
  slopes = np.array([[0.5, 0.25, 0.125], [1.0, 2.0, 0.0625]], np.float32)
  extra = (distance, slopes) if alibi else ()
  got = attention.attend(jnp.asarray(q), _heads_major(k), _heads_major(v), jnp.asarray(allowed),
                         *map(jnp.asarray, extra), block=block)
  np.testing.assert_allclose(got, _reference(q, k, v, allowed, *extra), atol=1e-5)


def test_queries_over_a_longer_cache_match_loop_reference():
  q, k, v, allowed, distance = _case(1, t=3, s=9, cache=True)
  got = attention.attend(jnp.asarray(q), _heads_major(k), _heads_major(v), jnp.asarray(allowed),
                         block=2)
  np.testing.assert_allclose(got, _reference(q, k, v, allowed), atol=1e-5)


def _plain(q, k, v, allowed, distance=None, slopes=None):
  """The einsum formulation the kernel replaces; its autodiff is the gradient reference."""
  s = jnp.einsum("btkgd,bskd->bkgts", q, k) / np.sqrt(q.shape[-1])
  if distance is not None:
    s = s - slopes[None, :, :, None, None] * distance[:, None, None]
  s = jnp.where(allowed[:, None, None], s, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(s, axis=-1), v)


@pytest.mark.parametrize("block,alibi", [(4, True), (3, False), (16, False)])
def test_gradients_match_autodiff_of_plain_attention(block, alibi):
  q, k, v, allowed, distance = map(jnp.asarray, _case(2))
  slopes = jnp.array([[0.5, 0.25, 0.125], [1.0, 2.0, 0.0625]])
  extra = (distance, slopes) if alibi else ()
  weights = jax.random.normal(jax.random.key(0), q.shape)

  def loss(fn):
    return lambda q, k, v: jnp.sum(weights * fn(q, k, v, allowed, *extra))

  blocked = lambda q, k, v, *a: attention.attend(q, _heads_major(k), _heads_major(v), *a,
                                                 block=block)
  got = jax.jit(jax.grad(loss(blocked), argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(loss(_plain), argnums=(0, 1, 2))(q, k, v)
  for name, g, w in zip("qkv", got, want):
    np.testing.assert_allclose(g, w, atol=2e-5, err_msg=f"d{name}")


def test_bfloat16_gradients_take_bfloat16_operands_and_follow_float32():
  # With bfloat16 inputs the backward's products take bfloat16 operands (XLA:CPU's fast path,
  # and the accelerators' mode); the gradients stay within bfloat16 rounding of the float32 ones.
  q, k, v, allowed, _ = map(jnp.asarray, _case(3, t=12, s=12))
  weights = jax.random.normal(jax.random.key(1), q.shape)

  def loss(q, k, v):
    out = attention.attend(q, _heads_major(k), _heads_major(v), allowed, block=4)
    return jnp.sum(weights * out.astype(jnp.float32))

  half = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
  grad = jax.grad(loss, argnums=(0, 1, 2))
  got, want = jax.jit(grad)(*half), grad(*(x.astype(jnp.float32) for x in half))
  for name, g, w in zip("qkv", got, want):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(g.astype(jnp.float32), w, atol=0.03 * scale, err_msg=f"d{name}")
  scans = [e for e in jax.make_jaxpr(grad)(*half).jaxpr.eqns if e.primitive.name == "scan"]
  backward = scans[-1].params["jaxpr"]  # the last loop is the backward's
  assert "dot_general" in str(backward) and "f32[" in str(backward)
  operand_dtypes = {str(v.aval.dtype) for e in backward.jaxpr.eqns
                    if e.primitive.name == "dot_general" for v in e.invars}
  assert operand_dtypes == {"bfloat16"}, operand_dtypes


def test_default_block_fits_the_scores_in_cache_on_cpu_and_is_whole_off_it(monkeypatch):
  assert attention.default_block(100) == attention.CPU_BLOCK
  assert attention.default_block(5) == 5
  # 16 x 8 heads x 16 queries x 256 keys x 4 bytes = 2 MiB: fits; at 32 x 512, 8 queries do.
  assert attention.default_block(256, batch=16, heads=8) == 16
  assert attention.default_block(512, batch=32, heads=8) == 8
  assert attention.default_block(4, batch=1 << 20, heads=8, keys=4096) == 1
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert attention.default_block(100, batch=32, heads=8) == 100


def test_bad_arguments_are_named():
  q, k, v, allowed, distance = map(jnp.asarray, _case(3))
  k, v = _heads_major(k), _heads_major(v)
  with pytest.raises(ValueError, match="both distance and slopes"):
    attention.attend(q, k, v, allowed, distance)
  with pytest.raises(ValueError, match="block must be positive"):
    attention.attend(q, k, v, allowed, block=0)
