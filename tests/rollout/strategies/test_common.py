"""The branching machinery every strategy shares: cache rows, forks, token statistics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import context as context_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers as workers_lib
from agentrl_jax.rollout.strategies import common


def _random_cache(b=5, layers=2, s=6, h=2, d=3):
  rng = np.random.default_rng(0)
  return tfm.KVCache(k=jnp.asarray(rng.normal(size=(layers, b, s, h, d)), jnp.float32),
                     v=jnp.asarray(rng.normal(size=(layers, b, s, h, d)), jnp.float32),
                     length=jnp.arange(b, dtype=jnp.int32) + 10)


def test_cache_row_helpers_match_numpy():
  cache = _random_cache()
  k, v, n = (np.asarray(x) for x in (cache.k, cache.v, cache.length))
  got = common.gather_cache_rows(cache, np.array([3, 3, 0]))
  np.testing.assert_array_equal(got.k, k[:, [3, 3, 0]])
  np.testing.assert_array_equal(got.length, n[[3, 3, 0]])
  other = jax.tree.map(lambda x: x * 2, cache)
  got = common.set_cache_rows(cache, np.array([1, 4]), other, np.array([0, 2]))
  want_v = v.copy()
  want_v[:, [1, 4]] = 2 * v[:, [0, 2]]
  np.testing.assert_array_equal(got.v, want_v)
  np.testing.assert_array_equal(got.length, [10, 20, 12, 13, 24])
  take = np.array([1, 0, 0, 1, 0], bool)
  got = common.where_cache_rows(take, other, cache)
  np.testing.assert_array_equal(got.k, np.where(take[None, :, None, None, None], 2 * k, k))
  np.testing.assert_array_equal(got.length, np.where(take, 2 * n, n))


def test_forked_row_is_independent_of_its_source(word_runner):
  seeds = [0, 1, 2]
  batch = common.start(word_runner, [registry.make("frozenlake") for _ in seeds], seeds, seeds,
                       np.arange(3), active=np.array([1, 1, 0], bool))
  stats = loop_lib.RolloutStats()
  common.append_observations(word_runner, batch, 0, stats)
  common.copy_rows(batch, [2], [0])
  assert batch.active[2] and batch.cursor[2] == batch.cursor[0]
  np.testing.assert_array_equal(batch.traj.tokens[2], batch.traj.tokens[0])
  assert batch.envs[2] is not batch.envs[0]
  batch.envs[2].step("right")
  assert batch.envs[0].position == (0, 0) and batch.envs[2].turn == 1 and batch.envs[0].turn == 0


@pytest.mark.slow  # two runners and a full pass: the strategies' tests use these stats
def test_token_stats_agree_with_the_sampler_and_a_full_pass(word_runner, free_runner, model):
  for runner in (word_runner, free_runner):
    tool = common.tools(runner)
    seeds = [0, 1, 2, 3]
    batch = common.start(runner, [registry.make("frozenlake") for _ in seeds], seeds, seeds,
                         np.arange(4))
    stats = loop_lib.RolloutStats()
    for turn in range(2):
      common.append_observations(runner, batch, turn, stats)
      draw = common.sample_turn(tool, model[2], batch, turn, jax.random.key(turn))
      # top_k = V: the normalised top-k entropy is the full entropy / log|V|.
      scored = common.turn_token_stats(tool, model[2], batch, draw, turn, runner.model_config.vocab_size)
      for i in draw.rows:
        n = len(draw.tokens[i])
        np.testing.assert_allclose(scored.logprob[i, :n], draw.logprobs[i], atol=1e-5)
        assert scored.valid[i].sum() == n
      common.play_turn(runner, tool, batch, draw, turn, stats)
    common.close(runner, batch, stats)
    traj = batch.traj
    sampling = runner.config.sampling
    allowed = None
    support = runner.model_config.vocab_size
    if sampling.allowed_token_ids is not None:
      allowed = distribution.vocabulary_mask(support, sampling.allowed_token_ids)
      support = len(sampling.allowed_token_ids)
    view = distribution.action_view(jnp.asarray(traj.action_mask), 16)
    _, full_entropy = distribution.action_log_probs(
        model[1], model[2], jnp.asarray(traj.tokens),
        tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)), view, allowed, 1.0)
    # The last turn's tokens: compare its entropies with the full pass at the same tokens.
    for i in range(4):
      start, end = traj.turn_start[i, 1], traj.turn_end[i, 1]
      if end <= start:
        continue
      index = np.asarray(view.index[i])
      cols = [int(np.flatnonzero(index == t)[0]) for t in range(start, end)]
      np.testing.assert_allclose(scored.entropy[i, :end - start],
                                 np.asarray(full_entropy[i, cols]) / np.log(support), atol=1e-4)


def test_plain_play_equals_the_rollout_loop_with_stop_strings(tok, model, runner_for):
  # The shared machinery replays `RolloutRunner.collect` exactly, stop strings included (an
  # action ends at the first token completing "e"; the cache forgets the tokens cut after it).
  runner = runner_for(sampler_lib.SamplingConfig(
      max_action_tokens=3, stop_token_ids=(tok.end_id,), stop_strings=("e",)))
  seeds = [0, 1, 2, 3]
  plain, plain_stats = runner.collect([registry.make("frozenlake") for _ in seeds], seeds, seeds,
                                      params=model[2], rng=jax.random.key(6))
  tool = common.tools(runner)
  batch = common.start(runner, [registry.make("frozenlake") for _ in seeds], seeds, seeds,
                       np.arange(4))
  stats = loop_lib.RolloutStats(episodes=4)
  common.play(runner, tool, batch, model[2], jax.random.key(6), stats)
  traj = loop_lib.trim_tokens(batch.traj, runner.config.trimmed_length(int(batch.cursor.max())))
  np.testing.assert_array_equal(traj.tokens, plain.tokens)
  np.testing.assert_allclose(traj.sample_logprob, plain.sample_logprob, atol=1e-6)
  np.testing.assert_array_equal(traj.turn_end, plain.turn_end)
  cut = [tok.decode(traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]])
         for b, k in zip(*np.nonzero(traj.turn_mask))]
  assert any(text.endswith("e") for text in cut)  # the stop string did cut some actions
  assert (stats.turns, stats.sampled_tokens) == (plain_stats.turns, plain_stats.sampled_tokens)


def test_unsupported_rollout_options_are_rejected(word_runner):
  cfg = word_runner.config
  bad = [
      (dataclasses.replace(cfg, context=context_lib.ContextConfig(policy="last_k", history_turns=2)), "context"),
      (dataclasses.replace(cfg, max_trajectory_action_tokens=4), "max_trajectory_action_tokens"),
      (dataclasses.replace(cfg, workers=workers_lib.WorkerConfig(kind="process")), "kind"),
  ]
  for config, name in bad:
    with pytest.raises(ValueError, match=name):
      common.check_supported(config)
  common.check_supported(cfg)
