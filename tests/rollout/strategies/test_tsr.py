"""TSR best-of-N and instance filtering (docs/methods.md#tsr)."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import base
from agentrl_jax.envs import registry
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout.strategies import tsr


def _make_env():
  return registry.make("frozenlake")


def _depth(env, result):
  """Scorer: row + column of the player after the step (progress towards the goal corner)."""
  del result
  return float(sum(env.position))


def test_one_candidate_is_plain_sampling(word_runner, model, check_layout):
  # N = 1 draws candidate 0 with the turn's own key and row ids: the plain loop's draws exactly.
  seeds, rows = [0, 1, 2, 3], [7, 8, 9, 10]
  plain, plain_stats = word_runner.collect([_make_env() for _ in seeds], seeds, seeds,
                                           params=model[2], rng=jax.random.key(4), row_ids=rows)
  best, stats = tsr.BestOfN(num_candidates=1).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(4), row_ids=rows)
  check_layout(best, word_runner, 4)
  for name in ("tokens", "action_mask", "turn_of_token", "turn_mask", "reward", "done", "obs_hash",
               "action_valid", "turn_start", "turn_end", "group_id", "outcome", "success"):
    np.testing.assert_array_equal(getattr(best, name), getattr(plain, name), err_msg=name)
  np.testing.assert_allclose(best.sample_logprob, plain.sample_logprob, atol=1e-6)
  for key, value in plain.extras.items():
    np.testing.assert_array_equal(best.extras[key], value, err_msg=key)
  assert (stats.turns, stats.sampled_tokens) == (plain_stats.turns, plain_stats.sampled_tokens)
  assert (best.extras["tsr_choice"][best.turn_mask] == 0).all()


def test_kept_action_scores_highest_and_env_matches_a_replay(word_runner, tok, model, check_tito):
  n, seeds = 4, [0, 1, 2, 3, 4, 5]
  traj, _ = tsr.BestOfN(num_candidates=n, scorer=_depth).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(1))
  scores, choice = traj.extras["tsr_scores"], traj.extras["tsr_choice"].astype(int)
  played = traj.turn_mask
  assert played.sum() > 10
  for b, k in zip(*np.nonzero(played)):
    # The kept candidate is the first arg-max of the N candidates' scores.
    assert choice[b, k] == int(np.argmax(scores[b, k]))
    assert scores[b, k, choice[b, k]] >= scores[b, k].max()
  # Replaying the kept actions from scratch reaches the same states and scores (so the env that
  # went on was the clone of the kept candidate, not another one's).
  for b, seed in enumerate(seeds):
    env = _make_env()
    env.reset(seed)
    for k in np.flatnonzero(played[b]):
      action = tok.decode(traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]])
      result = env.step(action)
      assert traj.obs_hash[b, k] == base.observation_hash(result.observation)
      assert traj.reward[b, k] == result.reward
      # The last played turn may also end by the token budget (truncated: done, env still live).
      last = k == np.flatnonzero(played[b])[-1]
      assert traj.done[b, k] == result.done or (last and traj.done[b, k])
      assert scores[b, k, choice[b, k]] == _depth(env, result)
  check_tito(word_runner, traj)


def _final_scores(traj):
  last = traj.turn_mask.sum(axis=1) - 1
  rows = np.arange(traj.batch_size)
  choice = traj.extras["tsr_choice"].astype(int)[rows, last]
  return traj.extras["tsr_scores"][rows, last, choice]


def test_search_beats_plain_sampling_on_the_heuristic(word_runner, model):
  seeds = list(range(8))
  plain, _ = tsr.BestOfN(num_candidates=1, scorer=tsr.frozenlake_progress).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(2))
  best, _ = tsr.BestOfN(num_candidates=4, scorer=tsr.frozenlake_progress).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(2))
  # The near-uniform random policy wanders; four tries per move, each rejecting holes and moves
  # away from the goal, end the episodes closer to it (score = −0.1 · moves left, −1 in a hole).
  assert _final_scores(best).mean() > _final_scores(plain).mean() + 0.1


def test_multi_token_candidates_keep_tito(free_runner, model, check_tito, check_layout):
  # The kept candidate's KV rows must go on with it: later turns' log-probs then match a full
  # forward pass over the kept tokens only.
  seeds = [0, 1, 2, 3]
  traj, stats = tsr.BestOfN(num_candidates=3).collect(
      free_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(5))
  check_layout(traj, free_runner, 4)
  assert traj.turn_mask.sum(axis=1).min() >= 2
  check_tito(free_runner, traj)
  assert stats.sampled_tokens > traj.action_mask.sum()  # the rejected candidates were drawn too


@pytest.mark.slow  # greedy follow-ups compile a rollout of their own
def test_lookahead_adds_the_best_greedy_follow_up(word_runner, tok, model):
  seeds = [0, 1, 2]
  traj, _ = tsr.BestOfN(num_candidates=2, scorer=_depth, lookahead=1).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(7))
  scores, choice = traj.extras["tsr_scores"], traj.extras["tsr_choice"].astype(int)
  allowed = np.asarray(word_runner.config.sampling.allowed_token_ids)
  checked = 0
  for b, seed in enumerate(seeds):
    env = _make_env()
    env.reset(seed)
    for k in np.flatnonzero(traj.turn_mask[b]):
      end = traj.turn_end[b, k]
      result = env.step(tok.decode(traj.tokens[b, traj.turn_start[b, k]:end]))
      expected = _depth(env, result)
      obs = word_runner.observation_tokens(result.observation)
      fits = end + len(obs) + 1 <= word_runner.config.max_len and k + 1 < traj.max_turns
      if not result.done and fits:
        # The greedy follow-up, computed here by a full forward pass over the conversation:
        # the arg-max move after the next observation, played on a copy of the env.
        tokens = np.concatenate([traj.tokens[b, :end], obs])[None]
        turns = np.concatenate([traj.turn_of_token[b, :end], np.full(len(obs), k + 1)])[None]
        logits, _ = tfm.apply(model[1], model[2], jnp.asarray(tokens, jnp.int32),
                              tfm.positions_from_turns(jnp.asarray(turns, jnp.int32)))
        move = int(allowed[np.argmax(np.asarray(logits)[0, -1, allowed])])
        ahead = copy.deepcopy(env)
        expected += _depth(ahead, ahead.step(tok.decode([move])))
        checked += 1
      assert scores[b, k, choice[b, k]] == pytest.approx(expected, abs=1e-6), (b, k)
  assert checked >= 6


def test_one_beam_one_candidate_is_plain_sampling(word_runner, model):
  seeds = [0, 1, 2]
  beams, _ = tsr.BeamSearch(num_candidates=1).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(4))
  plain, _ = word_runner.collect([_make_env() for _ in seeds], seeds, seeds, params=model[2],
                                 rng=jax.random.key(4))
  np.testing.assert_array_equal(beams.tokens, plain.tokens)
  np.testing.assert_array_equal(beams.reward, plain.reward)


def test_beams_replay_exactly_and_carry_their_cumulative_score(word_runner, tok, model,
                                                               check_tito, check_layout):
  seeds = [0, 0, 0, 1, 1, 1]
  traj, stats = tsr.BeamSearch(num_candidates=2, scorer=_depth).collect(
      word_runner, _make_env, seeds, [0, 0, 0, 1, 1, 1], params=model[2], rng=jax.random.key(8))
  check_layout(traj, word_runner, 6)
  parents = traj.extras["tsr_beam_parent"]
  # Some slot took over another beam's prefix (else this is just best-of-N per row).
  assert (parents[traj.turn_mask] != np.nonzero(traj.turn_mask)[0]).any()
  for b, seed in enumerate(seeds):
    env = _make_env()
    env.reset(seed)
    total = 0.0
    for k in np.flatnonzero(traj.turn_mask[b]):
      result = env.step(tok.decode(traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]]))
      assert traj.obs_hash[b, k] == base.observation_hash(result.observation), (b, k)
      total += _depth(env, result)
    # The beam's score is Σ f over its own (inherited + extended) turns.
    assert traj.extras["tsr_beam_score"][b] == pytest.approx(total)
  check_tito(word_runner, traj)  # each slot's cache rows came with its prefix
  assert stats.sampled_tokens == 2 * traj.action_mask.sum()  # two candidates per kept move


def test_frozenlake_progress_by_hand():
  env = _make_env()
  env.reset(0)
  # From the start (0, 0) of a 4x4 map the goal is >= 6 moves away: score = 0 - 0.1 * distance.
  result = env.step("right")
  assert tsr.frozenlake_progress(env, result) == pytest.approx(-0.1 * env.shortest_path_length)
  with pytest.raises(TypeError, match="FrozenLake"):
    tsr.frozenlake_progress(object(), result)


def test_informative_groups_by_hand():
  group = np.array([0, 0, 1, 1, 2, 2, 3, 3])
  outcome = np.array([1, 0, 1, 1, 0, 0, 0.5, 0.0], np.float32)
  success = np.array([1, 0, 1, 1, 0, 0, 0, 0], bool)
  kept = tsr.informative_groups(group, outcome, success, 0.0, 1.0)
  # group 0: mixed; 1: all succeed; 2: all fail (zero variance); 3: varied returns, rate 0 (not > 0).
  np.testing.assert_array_equal(kept, [1, 1, 0, 0, 0, 0, 0, 0])
  kept = tsr.informative_groups(group, outcome, success, -1.0, 2.0)
  np.testing.assert_array_equal(kept, [1, 1, 0, 0, 0, 0, 1, 1])


def test_filtered_groups_have_reward_variance(word_runner, model, check_layout, check_tito):
  seeds = [s for s in range(4) for _ in range(4)]
  groups = [g for g in range(4) for _ in range(4)]
  traj, stats = tsr.FilterInstances(max_rounds=2).collect(
      word_runner, _make_env, seeds, groups, params=model[2], rng=jax.random.key(0))
  check_layout(traj, word_runner, 16)
  kept = traj.extras["instance_kept"].astype(bool)
  for g in np.unique(traj.group_id):
    rows = traj.group_id == g
    assert kept[rows].all() or not kept[rows].any()
    if kept[rows].any():
      assert np.ptp(traj.outcome[rows]) > 0 and 0 < traj.success[rows].mean() < 1
    else:
      assert not traj.action_mask[rows].any()  # dropped: no loss
  assert stats.episodes == 16
  if kept.any():
    check_tito(word_runner, traj)


def test_filter_wraps_a_strategy_and_rejects_bad_config(word_runner, model):
  seeds = [0, 0, 1, 1]
  traj, _ = tsr.FilterInstances(base=tsr.BestOfN(num_candidates=2), max_rounds=0).collect(
      word_runner, _make_env, seeds, [0, 0, 1, 1], params=model[2], rng=jax.random.key(0))
  assert "tsr_choice" in traj.extras and "instance_kept" in traj.extras
  with pytest.raises(ValueError, match="num_candidates"):
    tsr.BestOfN(num_candidates=0)
  with pytest.raises(ValueError, match="different seeds"):
    tsr.BeamSearch().collect(word_runner, _make_env, [0, 1], [0, 0], params=model[2],
                             rng=jax.random.key(0))
  with pytest.raises(ValueError, match="lookahead"):
    tsr.BestOfN(lookahead=-1)
  with pytest.raises(ValueError, match="success_low"):
    tsr.FilterInstances(success_low=0.5, success_high=0.5)
  with pytest.raises(ValueError, match="base"):
    tsr.FilterInstances(base=3)
