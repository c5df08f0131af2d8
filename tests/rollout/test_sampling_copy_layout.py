"""The bfloat16 sampling copy stays off XLA:CPU's float32 detours: the tied head stored
transposed, the embedding gathered by its bits, the cache written by a select.

Each detour converts a whole array to float32 inside the sampler (the embedding table, or a
layer's whole KV cache on every cache write); the compiled turn sampler is checked for those
float32 arrays, and each rewrite against the plain form it replaces."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import low_precision
from agentrl_jax.rollout import sampler as sampler_lib

VOCAB, BATCH, CAPACITY, PROMPT = 300, 4, 24, 8


@pytest.fixture(scope="module")
def tied():
  """A 2-layer Llama-style policy (RoPE, GQA, tied embeddings), as SmolLM2 is."""
  cfg = tfm.tiny(VOCAB, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, position="rope",
                 tie_embeddings=True)
  graphdef, params = tfm.create(cfg, seed=0)
  return cfg, graphdef, params


def _copy(model):
  cfg, graphdef, params = model
  graphdef16, cfg16 = low_precision.sampling_model(graphdef, cfg, "bfloat16")
  return cfg16, graphdef16, low_precision.sampling_params(params, cfg)


def test_tied_head_is_stored_transposed_and_gives_the_tied_logits(tied):
  cfg, graphdef, params = tied
  cfg16, graphdef16, params16 = _copy(tied)
  assert not cfg16.tie_embeddings and cfg16.dtype == "bfloat16"
  embed16 = params16["embed"][...]
  np.testing.assert_array_equal(np.asarray(params16["lm_head"][...]), np.asarray(embed16.T))
  # The copy's logits against the tied bfloat16 twin reading the same bfloat16 table.
  twin_cfg = dataclasses.replace(cfg, dtype="bfloat16")
  twin_graphdef, _ = tfm.create(twin_cfg, seed=0)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (BATCH, PROMPT)), jnp.int32)
  pos = tfm.positions_from_turns(jnp.zeros((BATCH, PROMPT), jnp.int32))
  got, _ = tfm.apply(graphdef16, params16, tokens, pos)
  want, _ = tfm.apply(twin_graphdef, low_precision.bfloat16_copy(params), tokens, pos)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_untied_copy_is_the_plain_cast():
  cfg = tfm.tiny(VOCAB, d_model=32, num_heads=4, mlp_dim=64, position="rope",
                 tie_embeddings=False)
  graphdef, params = tfm.create(cfg, seed=0)
  copy = low_precision.sampling_params(params, cfg)
  assert set(copy.keys()) == set(params.keys())
  np.testing.assert_array_equal(np.asarray(copy["lm_head"][...]),
                                np.asarray(params["lm_head"][...].astype(jnp.bfloat16)))


def _sampler_hlo(model) -> str:
  cfg, graphdef, params = model
  turn = sampler_lib.make_turn_sampler(
      graphdef, sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=3), VOCAB)
  cache = tfm.init_cache(cfg, BATCH, CAPACITY, low_precision.cache_dtype(cfg.dtype))
  obs = jnp.ones((BATCH, PROMPT), jnp.int32)
  return turn.lower(params, cache, obs, jnp.full((BATCH,), PROMPT, jnp.int32),
                    jnp.ones((BATCH,), bool), jnp.int32(0), jax.random.key(0)).compile().as_text()


def _computations(hlo: str) -> dict[str, str]:
  """name -> body of every computation in an HLO module's text."""
  blocks = re.findall(r"^(?:ENTRY )?(%[\w.\-]+) [^\n]*\{\n(.*?)^\}", hlo, re.M | re.S)
  return dict(blocks)


def _materialized(hlo: str, shapes) -> list[str]:
  """The `shapes` that some instruction outside a fusion produces (a buffer in memory)."""
  comps = _computations(hlo)
  outside = [body for name, body in comps.items() if "computation" not in name]
  return [s for s in shapes if any(re.search(rf"= {s}", body) for body in outside)]


def test_bfloat16_sampler_converts_no_table_or_cache_to_float32(tied):
  cfg16, graphdef16, params16 = _copy(tied)
  hlo = _sampler_hlo((cfg16, graphdef16, params16))
  d, kv, dh = cfg16.d_model, cfg16.kv_heads, cfg16.dim_per_head
  table = (rf"f32\[{VOCAB},{d}\]", rf"f32\[{d},{VOCAB}\]")
  cache = (rf"f32\[{BATCH},{kv},{CAPACITY},{dh}\]",)  # the prefill's and each decode step's
  assert not _materialized(hlo, table + cache)
  # The check can see them: the float32 policy's sampler holds both, in its own dtype.
  hlo32 = _sampler_hlo(tied)
  assert _materialized(hlo32, table) and _materialized(hlo32, cache)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("width", [1, 3])
def test_write_cache_equals_the_per_row_dynamic_update_slice(dtype, width):
  rng = np.random.default_rng(width)
  buf = jnp.asarray(rng.normal(size=(3, 2, 10, 4)), dtype)
  new = jnp.asarray(rng.normal(size=(3, 2, width, 4)), jnp.float32)
  start = jnp.array([0, 9, 12], jnp.int32)  # the last one past the end: clamped, as the slice is
  plain = jax.vmap(lambda b, n, s: jax.lax.dynamic_update_slice(b, n, (0, s, 0)))
  want = plain(buf, new.astype(dtype), start)
  got = jax.jit(tfm.write_cache)(buf, new, start)
  assert got.dtype == dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_take_rows_is_take_with_its_gradient(dtype):
  table = jax.random.normal(jax.random.key(0), (20, 6)).astype(dtype)
  idx = jnp.array([[3, 19, 0], [7, 7, 2]])
  np.testing.assert_array_equal(np.asarray(tfm.take_rows(table, idx), np.float32),
                                np.asarray(jnp.take(table, idx, axis=0), np.float32))
  loss = lambda take: lambda w: jnp.sum(take(w).astype(jnp.float32) ** 2)
  got = jax.grad(loss(lambda w: tfm.take_rows(w, idx)))(table)
  want = jax.grad(loss(lambda w: jnp.take(w, idx, axis=0)))(table)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_accelerators_keep_the_tied_head_and_the_in_place_cache_write(tied, monkeypatch):
  cfg, graphdef, params = tied
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  _, cfg16 = low_precision.sampling_model(graphdef, cfg, "bfloat16")
  assert cfg16.tie_embeddings
  assert set(low_precision.sampling_params(params, cfg).keys()) == set(params.keys())
  buf = jnp.zeros((2, 1, 6, 2), jnp.bfloat16)
  write = jax.make_jaxpr(tfm.write_cache)(buf, jnp.ones((2, 1, 1, 2)), jnp.array([1, 5]))
  assert "scatter" in str(write) and "u16" not in str(write)  # the per-row write, no bit view
