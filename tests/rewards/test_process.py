"""Tests for agentrl_jax.rewards.process (SocialRL, T1)."""

import jax
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.rewards import process


def batch(num_turns, max_turns=6, goal=None, extras=None):
  b = len(num_turns)
  traj = types.empty_trajectories(b, 4, max_turns)
  for i, k in enumerate(num_turns):
    traj.turn_mask[i, :k] = True
    if goal is not None:
      traj.reward[i, k - 1] = goal[i]
  traj.outcome[:] = traj.reward.sum(1)
  return traj.replace(extras=extras or {})


def test_default_stage_rows_are_valid():
  table = process.check_stage_weights(process.DEFAULT_STAGE_WEIGHTS)
  assert table.shape == (3, len(process.DIMENSIONS))
  np.testing.assert_allclose(table.sum(1), 1.0, atol=1e-6)
  assert np.all(table >= 0)
  with pytest.raises(ValueError, match="row sums"):
    process.check_stage_weights([[0.5] * 6] * 3)
  with pytest.raises(ValueError, match="non-negative"):
    process.check_stage_weights([[1.5, -0.5, 0, 0, 0, 0]] * 3)


def test_stages_by_hand():
  # K_b = 7 turns: u = k/6 → early k ∈ {0, 1}, mid k ∈ {2, 3}, late k ∈ {4, 5, 6}.
  traj = batch([7, 1], max_turns=7)
  table = np.eye(3, 6, dtype=np.float32)  # stage s puts all its weight on dimension s
  weights = process.turn_stage_weights(traj.turn_mask, table)
  np.testing.assert_array_equal(np.argmax(weights[0], -1), [0, 0, 1, 1, 2, 2, 2])
  assert np.argmax(weights[1, 0]) == 0  # a single turn is early


def test_hand_checked_reward():
  # 3 turns, stages early / mid / late; scores: only `relational` = 1 on turn 0, only `goal` = 1
  # on turn 1, all dims 1 on turn 2; goal 0.8 delivered on the last turn.
  # r = [0.5·0.35, 0.5·0.35, 0.8 + 0.5·1.0] = [0.175, 0.175, 1.3].
  scores = np.zeros((1, 3, 6), np.float32)
  scores[0, 0, 1] = scores[0, 1, 0] = 1.0
  scores[0, 2] = 1.0
  traj = batch([3], max_turns=3, goal=[0.8], extras={"process_scores": scores})
  shaped = jax.jit(process.stage_weighted_process_reward)(traj)
  np.testing.assert_allclose(shaped.reward, [[0.175, 0.175, 1.3]], atol=1e-6)
  np.testing.assert_allclose(shaped.outcome, [1.65], atol=1e-6)


def test_zero_process_weight_is_outcome_only():
  rng = np.random.default_rng(0)
  scores = rng.random((3, 6, 6)).astype(np.float32)
  traj = batch([2, 6, 4], goal=[0.1, 0.7, 1.0], extras={"process_scores": scores})
  shaped = process.stage_weighted_process_reward(traj, process_weight=0.0)
  np.testing.assert_allclose(shaped.reward, traj.reward)


def test_relational_matters_more_early_goal_more_mid():
  base = np.full((1, 3, 6), 0.5, np.float32)

  def reward(turn, dim):
    s = base.copy()
    s[0, turn, dim] += 0.1
    traj = batch([3], max_turns=3, extras={"process_scores": s})
    return float(process.stage_weighted_process_reward(traj).reward[0, turn])

  goal, relational = 0, 1
  assert reward(0, relational) > reward(0, goal)
  assert reward(1, goal) > reward(1, relational)


def test_smooth_interpolates_between_rows():
  traj = batch([5], max_turns=5)  # u = 0, .25, .5, .75, 1
  table = np.asarray(process.DEFAULT_STAGE_WEIGHTS, np.float32)
  w = np.asarray(process.turn_stage_weights(traj.turn_mask, table, smooth=True))[0]
  np.testing.assert_allclose(w[1], 0.5 * table[0] + 0.5 * table[1], atol=1e-6)
  np.testing.assert_allclose(w[4], table[2], atol=1e-6)
  np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)


def test_verifier_count_final_and_dense():
  # Final checks [1, 0, 1] → 2 on the last turn; with normalize → 2/3; bonus only when all pass.
  final = np.array([[1, 0, 1], [1, 1, 1]], bool)
  traj = batch([2, 3], max_turns=3, goal=[1.0, 0.0], extras={"verifier_checks": final})
  shaped = process.verifier_count_reward(traj, success_bonus=0.5)
  np.testing.assert_allclose(shaped.reward, [[0, 2, 0], [0, 0, 3.5]])
  np.testing.assert_allclose(process.verifier_count_reward(traj, normalize=True).outcome, [2 / 3, 1.0])
  # Per turn: counts 1, 1, 3 → rewards 1, 0, 2 (sum = final count 3).
  per_turn = np.array([[[1, 0, 0], [0, 1, 0], [1, 1, 1]]], bool)
  traj = batch([3], max_turns=3, extras={"verifier_checks": per_turn})
  np.testing.assert_allclose(jax.jit(process.verifier_count_reward)(traj).reward, [[1, 0, 2]])


def test_verifier_reward_is_monotone_in_passing_checks():
  rng = np.random.default_rng(1)
  checks = rng.random((16, 5)) < 0.5
  traj = batch([3] * 16, max_turns=3, extras={"verifier_checks": checks})
  outcome = np.asarray(process.verifier_count_reward(traj).outcome)
  order = np.argsort(checks.sum(1))
  assert np.all(np.diff(outcome[order]) >= 0)


def test_missing_keys_are_named():
  with pytest.raises(ValueError, match=r"traj.extras\['process_scores'\]"):
    process.stage_weighted_process_reward(batch([2]))
  with pytest.raises(ValueError, match=r"traj.extras\['verifier_checks'\]"):
    process.verifier_count_reward(batch([2]))


def test_verifier_counts_from_sub_outcomes():
  # The terminal env's final counts: passed [2, 3] of 3 → rewards 2 and 3 on the last turns;
  # normalized 2/3 and 1; the bonus 0.5 only where all 3 pass.
  traj = batch([2, 1], max_turns=2).replace(
      sub_outcomes={"verifiers_passed": np.array([2.0, 3.0], np.float32),
                    "verifiers_total": np.array([3.0, 3.0], np.float32)})
  np.testing.assert_allclose(process.verifier_count_reward(traj).reward, [[0, 2], [3, 0]])
  np.testing.assert_allclose(process.verifier_count_reward(traj, normalize=True).outcome, [2 / 3, 1])
  np.testing.assert_allclose(process.verifier_count_reward(traj, success_bonus=0.5).outcome, [2, 3.5])
  empty = batch([2], goal=[1.0])
  np.testing.assert_array_equal(
      process.verifier_count_reward(empty, missing_counts_are_zero=True).reward, np.zeros((1, 6)))


def test_dense_counts_from_per_turn_extras():
  # Checks passing after each turn [1, 1, 3] (of 3) → rewards [1, 0, 2]; the bonus 0.5 on the
  # last turn because all 3 pass; normalized [1/3, 0, 2/3].
  traj = batch([3], max_turns=3).replace(
      extras={"verifiers_passed": np.array([[1.0, 1.0, 3.0]], np.float32)},
      sub_outcomes={"verifiers_passed": np.array([3.0], np.float32),
                    "verifiers_total": np.array([3.0], np.float32)})
  np.testing.assert_allclose(
      jax.jit(process.verifier_count_reward)(traj).reward, [[1, 0, 2]], atol=1e-6)
  np.testing.assert_allclose(process.verifier_count_reward(traj, success_bonus=0.5).reward,
                             [[1, 0, 2.5]], atol=1e-6)
  np.testing.assert_allclose(process.verifier_count_reward(traj, normalize=True).reward,
                             [[1 / 3, 0, 2 / 3]], atol=1e-6)


def test_process_scores_from_one_extra_per_dimension():
  # Same as the stacked [B, N, D] array: keys stacked in order give identical rewards.
  rng = np.random.default_rng(2)
  scores = rng.random((2, 4, 3)).astype(np.float32)
  table = ((0.2, 0.5, 0.3), (0.5, 0.2, 0.3), (0.4, 0.3, 0.3))
  keys = ("process.goal_advancement", "process.rapport", "process.protocol_coherence")
  stacked = batch([4, 2], max_turns=4, extras={"process_scores": scores})
  split = batch([4, 2], max_turns=4, extras={k: scores[..., d] for d, k in enumerate(keys)})
  np.testing.assert_allclose(
      process.stage_weighted_process_reward(split, stage_weights=table, score_keys=keys).reward,
      process.stage_weighted_process_reward(stacked, stage_weights=table).reward, atol=1e-6)
  with pytest.raises(ValueError, match="2 score_keys for a 3-column"):
    process.stage_weighted_process_reward(split, stage_weights=table, score_keys=keys[:2])
