"""Attention backends: jax.nn's XLA path equals the blocked kernel; what "auto" resolves to.

On CPU only "blocked" and "xla" run; "cudnn" is resolved here but measured on a GPU
(bench/accelerator.py). The XLA path goes through the same query/mask/bias preparation as cuDNN's
(`attention._dot_product`), so the head ordering and the empty-row handling tested here are the
ones cuDNN gets.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import attention
from agentrl_jax.models import transformer as tfm


def _case(seed, g, b=2, t=7, s=7, kv=2, d=8):
  """Queries, heads-major keys/values, a causal mask with per-query floors and an empty row."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, kv, g, d)).astype(np.float32)
  k = rng.normal(size=(b, kv, s, d)).astype(np.float32)
  v = rng.normal(size=(b, kv, s, d)).astype(np.float32)
  qpos = np.arange(t) + (s - t)
  distance = np.broadcast_to(qpos[:, None] - np.arange(s)[None, :], (b, t, s)).astype(np.float32)
  floor = rng.integers(0, 4, size=(b, t))
  allowed = (distance >= 0) & (np.arange(s)[None, None, :] >= floor[:, :, None])
  allowed[1, t // 2] = False  # a query that may read nothing: uniform over all keys
  slopes = (2.0 ** -rng.integers(1, 5, size=(kv, g))).astype(np.float32)
  return tuple(map(jnp.asarray, (q, k, v, allowed, distance, slopes)))


def _outputs_and_grads(implementation, q, k, v, allowed, extra):
  weights = jax.random.normal(jax.random.key(0), q.shape)

  def loss(q, k, v):
    out = attention.attend(q, k, v, allowed, *extra, block=3, implementation=implementation)
    return jnp.sum(weights * out), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return out, grads


@pytest.mark.parametrize("g,alibi,t,s", [(1, False, 7, 7), (3, False, 7, 7), (2, True, 7, 7),
                                         (3, True, 3, 9)])
def test_xla_equals_blocked_in_values_and_gradients(g, alibi, t, s):
  q, k, v, allowed, distance, slopes = _case(g, g, t=t, s=s)
  extra = (distance, slopes) if alibi else ()
  want, want_grads = _outputs_and_grads("blocked", q, k, v, allowed, extra)
  got, got_grads = _outputs_and_grads("xla", q, k, v, allowed, extra)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  for name, a, b in zip("qkv", got_grads, want_grads):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_an_empty_row_attends_uniformly_to_all_keys_on_the_xla_path():
  q, k, v, allowed, distance, slopes = _case(5, 2)
  for extra in ((), (distance, slopes)):
    out = attention.attend(q, k, v, allowed, *extra, implementation="xla")
    # Row [1, 3] (t // 2) allows no key: every head gets the mean of its kv head's values.
    want = jnp.mean(v[1], axis=1)[:, None, :]  # [KV, 1, D], the same for each of the G heads
    np.testing.assert_allclose(out[1, 3], jnp.broadcast_to(want, out[1, 3].shape), atol=1e-6)


def test_query_head_kv_g_reads_kv_head_kv():
  """Only kv head 1 has nonzero values: exactly the query heads of group 1 see them."""
  q, k, v, allowed, _, _ = _case(6, 3)
  v = v.at[:, 0].set(0.0)
  out = attention.attend(q, k, v, allowed, implementation="xla")  # [B, T, KV, G, D]
  assert float(jnp.abs(out[:, :, 0]).max()) == 0.0
  assert float(jnp.abs(out[:, :, 1]).min(axis=-1).max()) > 0.0
  np.testing.assert_allclose(out, attention.attend(q, k, v, allowed, block=2), atol=1e-5)


def _model(attention_impl, **kw):
  return tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=64, attention=attention_impl, **kw)


@pytest.mark.parametrize("kw", [dict(num_kv_heads=2, qkv_bias=True),
                                dict(position="turn_slot", alibi=True)])
def test_transformer_logits_and_decode_step_match_between_xla_and_blocked(kw):
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 40)
  turns = jnp.asarray(np.repeat([[0] * 4 + [1] * 5], 2, axis=0), jnp.int32)
  pos = tfm.positions_from_turns(turns)
  pos = pos.replace(floor=jnp.asarray([[0] * 9, [0] * 4 + [2] * 5], jnp.int32))
  outs = {}
  for name in ("blocked", "xla"):
    cfg = _model(name, **kw)
    graphdef, params = tfm.create(cfg, seed=0)
    full, _ = tfm.apply(graphdef, params, tokens, pos)
    cache = tfm.init_cache(cfg, batch_size=2, capacity=16)
    prefix = tfm.Positions(*(x[:, :8] for x in pos))
    _, cache = tfm.apply(graphdef, params, tokens[:, :8], prefix, cache)
    cache = cache.replace(length=cache.length + 8)
    step, _ = tfm.apply(graphdef, params, tokens[:, 8:], tfm.Positions(*(x[:, 8:] for x in pos)),
                        cache)
    outs[name] = (full, step)
  np.testing.assert_allclose(outs["xla"][0], outs["blocked"][0], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(outs["xla"][1], outs["blocked"][1], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(outs["xla"][1], outs["blocked"][0][:, 8:], atol=1e-4, rtol=1e-4)


def test_auto_is_the_unchanged_blocked_kernel_on_cpu():
  assert jax.default_backend() == "cpu"
  tokens = jax.random.randint(jax.random.key(2), (2, 6), 0, 40)
  pos = tfm.positions_from_turns(jnp.zeros((2, 6), jnp.int32))
  logits = {}
  for name in ("auto", "blocked"):
    graphdef, params = tfm.create(_model(name), seed=0)
    logits[name] = tfm.apply(graphdef, params, tokens, pos)[0]
  np.testing.assert_array_equal(logits["auto"], logits["blocked"])


@pytest.mark.parametrize("backend,dtype,alibi,shape,want", [
    ("cpu", jnp.bfloat16, False, None, "blocked"),
    ("cpu", jnp.float32, True, None, "blocked"),
    ("gpu", jnp.bfloat16, False, None, "cudnn"),
    ("cuda", jnp.float16, False, (256, 256, 64), "cudnn"),
    ("gpu", jnp.float32, False, None, "xla"),
    ("gpu", jnp.bfloat16, True, None, "xla"),
    ("gpu", jnp.bfloat16, False, (1, 512, 64), "xla"),   # odd query length (a decode step)
    ("gpu", jnp.bfloat16, False, (64, 64, 12), "xla"),   # head dim not a multiple of 8
    ("gpu", jnp.bfloat16, False, (64, 64, 256), "xla"),  # head dim above 128
    ("tpu", jnp.bfloat16, False, None, "xla"),
])
def test_auto_resolves_per_backend_dtype_alibi_and_shape(backend, dtype, alibi, shape, want):
  assert attention.resolve_implementation("auto", dtype, alibi, backend, shape) == want


@pytest.mark.parametrize("name", ["blocked", "xla", "cudnn"])
def test_an_explicit_choice_is_kept_on_any_backend(name):
  for backend in ("cpu", "gpu", "tpu"):
    assert attention.resolve_implementation(name, jnp.float32, True, backend) == name


def test_a_bad_value_is_a_one_line_value_error():
  with pytest.raises(ValueError, match="attention") as err:
    _model("flash")
  assert "\n" not in str(err.value) and "'cudnn'" in str(err.value)
  with pytest.raises(ValueError, match="one of") as err:
    attention.resolve_implementation("flash", jnp.float32, False, "cpu")
  assert "\n" not in str(err.value)
