"""Growing KV cache: sizes, growth, and multi-turn samples identical to a full-capacity cache.

Each episode test plays the same turns twice, once with one stacked cache of the full capacity
(the former path) and once with the cache the rollout loop now uses (per layer, starting at 64
slots, grown before a turn that would outgrow it), and compares every turn: greedy tokens
exactly, log-probs to float32 rounding. Rows differ in observation length, in how much of each
action they keep (the cache is rolled back per row) and in when they stop playing, so the rows of
one batch hold different lengths, and the episodes grow through several sizes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import context as context_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

CAPACITY = 420
ACTION_TOKENS = 6
TURNS = 9


def _tiny():
  return tfm.tiny(64, d_model=32, num_heads=4, mlp_dim=64, position="turn_slot", alibi=True,
                  max_turns=16, max_slots=64)


def _smollm2_shaped(layers=2):
  # SmolLM2-135M's widths, heads and vocabulary with random weights and fewer layers.
  return tfm.TransformerConfig(vocab_size=49152, num_layers=layers, d_model=576, num_heads=9,
                               num_kv_heads=3, mlp_dim=1536, position="rope",
                               rope_theta=100000.0, norm_eps=1e-5)


def _episode(config, params, sample, cache, *, growing, steps=2, floors=False, seed=0):
  """Per-turn (tokens, log-probs, num_tokens) of TURNS turns, and the cache sizes used."""
  rng = np.random.default_rng(seed)
  b = cache.length.shape[0]
  history = np.zeros(b, np.int32)
  active = np.ones(b, bool)
  turns, sizes = [], []
  for turn in range(TURNS):
    if turn in (5, 7):
      active[turn % b] = False  # rows leave at different turns, their caches left as they were
    obs_len = rng.integers(12, 33, b).astype(np.int32)
    obs = rng.integers(4, config.vocab_size, (b, 32)).astype(np.int32)
    need = int(np.max(np.where(active, history, 0))) + 32 + ACTION_TOKENS
    if growing:
      cache = sampler_lib.fit_cache(cache, need, CAPACITY, steps)
    sizes.append(cache.capacity)
    # A context floor per row (rollout/context.py): the first position each row may attend to.
    floor = np.minimum(rng.integers(0, 40, b), history).astype(np.int32) if floors else None
    out = sample(params, cache, obs, obs_len, active, np.int32(turn), jax.random.key(turn),
                 floor=floor)
    num = np.asarray(out.num_tokens)
    keep = np.where(active, rng.integers(1, ACTION_TOKENS + 1, b), 0)
    cache = sampler_lib.rolled_back(out.cache, num - keep)
    history = np.where(active, history + obs_len + keep, history)
    np.testing.assert_array_equal(np.asarray(cache.length), history)
    turns.append((np.asarray(out.tokens), np.asarray(out.logprobs), num))
  return turns, sizes


def _compare(config, batch, *, temperature=0.0, steps=2, floors=False, seed=0):
  graphdef, params = tfm.create(config, seed=seed)
  sampling = sampler_lib.SamplingConfig(temperature=temperature, max_action_tokens=ACTION_TOKENS)
  sample = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  whole, whole_sizes = _episode(config, params, sample, tfm.init_cache(config, batch, CAPACITY),
                                growing=False, floors=floors, seed=seed)
  grown, sizes = _episode(config, params, sample,
                          sampler_lib.growing_cache(config, batch, CAPACITY, steps),
                          growing=True, steps=steps, floors=floors, seed=seed)
  assert set(whole_sizes) == {CAPACITY}
  assert len(set(sizes) - {CAPACITY}) >= 3, sizes  # the episode grew through several sizes
  for turn, ((tokens, logp, num), (want_tokens, want_logp, want_num)) in enumerate(
      zip(grown, whole)):
    np.testing.assert_array_equal(num, want_num, err_msg=f"turn {turn}")
    np.testing.assert_array_equal(tokens, want_tokens, err_msg=f"turn {turn}")
    np.testing.assert_allclose(logp, want_logp, atol=1e-5, rtol=0, err_msg=f"turn {turn}")


def test_cache_sizes_grow_from_64_by_about_sqrt2_or_doubling_and_end_at_the_capacity():
  assert sampler_lib.cache_sizes(672) == (64, 96, 128, 192, 256, 384, 512, 672)
  assert sampler_lib.cache_sizes(672, 1) == (64, 128, 256, 512, 672)
  assert sampler_lib.cache_sizes(512, 1) == (64, 128, 256, 512)
  # A size within one alignment step of the capacity would be one more compile for nothing.
  assert sampler_lib.cache_sizes(130) == (64, 96, 130)
  assert sampler_lib.cache_sizes(40) == (40,)
  with pytest.raises(ValueError, match="steps_per_doubling"):
    sampler_lib.cache_sizes(672, 0)
  with pytest.raises(ValueError, match="cache_steps_per_doubling"):
    loop_lib.RolloutConfig(cache_steps_per_doubling=0)


@pytest.mark.parametrize("stacked", [False, True])
def test_fit_cache_grows_to_the_next_size_keeping_contents_form_and_lengths(stacked):
  cfg = tfm.tiny(16, d_model=8, num_heads=2, mlp_dim=16)
  rng = np.random.default_rng(0)
  cache = sampler_lib.growing_cache(cfg, 3, 300)
  assert isinstance(cache.k, tuple) and cache.capacity == 64
  fill = lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype)
  cache = cache.replace(k=jax.tree.map(fill, cache.k), v=jax.tree.map(fill, cache.v),
                        length=jnp.array([5, 64, 0], jnp.int32))
  if stacked:
    cache = cache.stacked()
  assert sampler_lib.fit_cache(cache, 64, 300) is cache  # it holds the turn: untouched
  assert sampler_lib.cache_sizes(300) == (64, 96, 128, 192, 256, 300)
  grown = sampler_lib.fit_cache(cache, 130, 300)
  assert grown.capacity == 192 and isinstance(grown.k, tuple) != stacked
  assert sampler_lib.fit_cache(cache, 130, 300, steps_per_doubling=1).capacity == 256
  np.testing.assert_array_equal(grown.length, cache.length)
  as_array = lambda x: np.asarray(jnp.stack(x) if isinstance(x, tuple) else x)
  for new, old in ((grown.k, cache.k), (grown.v, cache.v)):
    new, old = as_array(new), as_array(old)
    np.testing.assert_array_equal(new[..., :64, :], old)
    assert not new[..., 64:, :].any()
  assert sampler_lib.fit_cache(grown, 1000, 300).capacity == 300  # never past the capacity
  with pytest.raises(ValueError, match="capacity"):
    cache.grown(32)


# Greedy at √2 steps stays in the default suite; sampling and doubling repeat it at more compiles.
@pytest.mark.parametrize("temperature,steps", [
    (0.0, 2), pytest.param(1.0, 2, marks=pytest.mark.slow),
    pytest.param(0.0, 1, marks=pytest.mark.slow)])
def test_tiny_alibi_turn_slot_episode_samples_as_with_the_whole_cache(temperature, steps):
  _compare(_tiny(), 5, temperature=temperature, steps=steps)


@pytest.mark.slow  # the runner test below covers floors through the loop
def test_tiny_episode_with_context_floors_samples_as_with_the_whole_cache():
  _compare(_tiny(), 4, floors=True, seed=1)


def test_smollm2_shaped_rope_gqa_episode_samples_as_with_the_whole_cache():
  _compare(_smollm2_shaped(), 3, seed=2)


def test_a_turn_that_outgrows_an_ungrown_cache_samples_something_else():
  # The comparisons above can fail: a turn that does not fit its cache clamps its writes onto
  # older slots, so its keys sit at the wrong positions.
  config = _tiny()
  graphdef, params = tfm.create(config, seed=0)
  sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=ACTION_TOKENS)
  sample = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  obs = np.random.default_rng(0).integers(4, 64, (2, 32)).astype(np.int32)
  full_len, active = np.full(2, 32, np.int32), np.ones(2, bool)
  small = sampler_lib.growing_cache(config, 2, CAPACITY).replace(length=jnp.full(2, 40, jnp.int32))
  big = sampler_lib.fit_cache(small, 40 + 32 + ACTION_TOKENS, CAPACITY)
  outs = [sample(params, c, obs, full_len, active, np.int32(1), jax.random.key(0))
          for c in (big, small)]
  assert not np.array_equal(np.asarray(outs[0].logprobs), np.asarray(outs[1].logprobs))


@pytest.mark.parametrize("context", [context_lib.ContextConfig(),
                                     context_lib.ContextConfig(policy="last_k", history_turns=1)])
def test_rollout_loop_grows_its_cache_and_collects_what_the_whole_cache_collects(tok, model,
                                                                                 context):
  cfg, graphdef, params = model
  sampling = sampler_lib.SamplingConfig(max_action_tokens=4, stop_token_ids=(tok.end_id,))
  trajectories = []
  for grow in (False, True):
    rollout = loop_lib.RolloutConfig(max_turns=10, max_len=300, obs_buckets=(48,),
                                     sampling=sampling, grow_cache=grow, context=context)
    runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
    envs = [registry.make("frozenlake") for _ in range(4)]
    traj, _ = runner.collect(envs, list(range(4)), list(range(4)), params=params,
                             rng=jax.random.key(11))
    trajectories.append(traj)
  whole, grown = trajectories
  used = (whole.turn_of_token >= 0).sum(axis=1)
  assert used.max() > 128 and len(set(used)) > 1  # several sizes, rows of different lengths
  np.testing.assert_array_equal(grown.tokens, whole.tokens)
  np.testing.assert_array_equal(grown.turn_of_token, whole.turn_of_token)
  np.testing.assert_allclose(grown.sample_logprob, whole.sample_logprob, atol=1e-5, rtol=0)
