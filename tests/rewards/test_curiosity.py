"""Tests for agentrl_jax.rewards.curiosity (docs/methods.md#curiosity)."""

import jax
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.rewards import curiosity

A, B_, C, D, E = 11, 12, 13, 14, 15  # observation hashes
SHAPE = jax.jit(curiosity.duplicate_observation_penalty)


def batch(hashes, rewards, success, initial=None):
  """Turn-level batch: one row per list of observation hashes (after each action)."""
  b, n = len(hashes), max(len(h) for h in hashes)
  traj = types.empty_trajectories(b, 4, n)
  for i, row in enumerate(hashes):
    traj.turn_mask[i, :len(row)] = True
    traj.obs_hash[i, :len(row)] = row
    traj.reward[i, :len(row)] = rewards[i]
  traj.outcome[:] = traj.reward.sum(1)
  traj.success[:] = success
  if initial is not None:
    traj = traj.replace(extras={"initial_obs_hash": np.asarray(initial, np.int32)})
  return traj


def numpy_reference(hashes, turn_mask, reward, success, initial, penalty, max_total, gate):
  out = np.zeros(hashes.shape, np.float32)
  for b in range(hashes.shape[0]):
    memory = set() if initial is None else {int(initial[b])}
    for k in range(hashes.shape[1]):
      if not turn_mask[b, k]:
        continue
      cond = {"always": True, "step": reward[b, k] <= 0,
              "unproductive": reward[b, k] <= 0 and not success[b]}[gate]
      if int(hashes[b, k]) in memory and cond:
        out[b, k] = -penalty
      memory.add(int(hashes[b, k]))
    total = out[b].sum()
    if total < -max_total:
      out[b] *= max_total / -total
  return out


def test_zero_on_an_episode_with_no_repeated_observation():
  traj = batch([[B_, C, D, E]], [[0, 0, 0, 0]], [False], initial=[A])
  shaped = SHAPE(traj)
  np.testing.assert_array_equal(shaped.reward, traj.reward)
  np.testing.assert_array_equal(shaped.outcome, traj.outcome)


def test_loop_penalized_at_second_and_third_action_only():
  # o_0 = A; actions lead to B, A, B: the 2nd (A seen as o_0) and 3rd (B seen after action 1)
  # actions repeat, the first visit to B never does. Penalty 0.1 each, total 0.2 ≤ cap 0.5.
  traj = batch([[B_, A, B_]], [[0, 0, 0]], [False], initial=[A])
  shaped = SHAPE(traj)
  np.testing.assert_allclose(shaped.reward, [[0.0, -0.1, -0.1]], atol=1e-6)
  np.testing.assert_allclose(shaped.outcome, [-0.2], atol=1e-6)


def test_without_initial_hash_the_first_observation_is_not_in_memory():
  traj = batch([[B_, A, B_]], [[0, 0, 0]], [False])
  np.testing.assert_allclose(SHAPE(traj).reward, [[0.0, 0.0, -0.1]], atol=1e-6)


def test_default_gate_leaves_successful_episodes_unchanged():
  traj = batch([[A, A, A, B_]], [[0, 0, 0, 1]], [True], initial=[A])
  np.testing.assert_array_equal(SHAPE(traj).reward, traj.reward)


def test_episode_cap_rescales_the_row():
  # 7 duplicates × 0.1 = 0.7 > 0.5: each becomes −0.1·0.5/0.7; the row sums to exactly −0.5.
  traj = batch([[A] * 8], [[0] * 8], [False], initial=[B_])
  shaped = curiosity.duplicate_observation_penalty(traj)
  expected = np.array([[0.0] + [-0.1 * 0.5 / 0.7] * 7])
  np.testing.assert_allclose(shaped.reward, expected, atol=1e-6)
  np.testing.assert_allclose(shaped.reward.sum(), -0.5, atol=1e-6)


@pytest.mark.parametrize("gate", curiosity.GATES)
def test_matches_numpy_reference_and_bounds(gate):
  rng = np.random.default_rng(0)
  b, n = 6, 7
  hashes = rng.integers(0, 4, size=(b, n)).astype(np.int32)
  lengths = rng.integers(1, n + 1, size=b)
  reward = (rng.random((b, n)) < 0.2).astype(np.float32)
  success = rng.random(b) < 0.5
  initial = rng.integers(0, 4, size=b).astype(np.int32)
  traj = batch([list(hashes[i, :lengths[i]]) for i in range(b)],
               [list(reward[i, :lengths[i]]) for i in range(b)], success, initial=initial)
  shaped = curiosity.duplicate_observation_penalty(traj, penalty=0.2, max_total=0.5, gate=gate)
  r_int = np.asarray(shaped.reward) - traj.reward
  expected = numpy_reference(traj.obs_hash, traj.turn_mask, traj.reward, success, initial,
                             0.2, 0.5, gate)
  np.testing.assert_allclose(r_int, expected, atol=1e-6)
  assert np.all(r_int <= 0) and np.all(r_int.sum(1) >= -0.5 - 1e-6)
  np.testing.assert_allclose(shaped.outcome, traj.outcome + r_int.sum(1), atol=1e-6)


def test_bad_hyperparameters_are_named():
  traj = batch([[A]], [[0]], [False])
  with pytest.raises(ValueError, match="gate must be one of .* got 'sometimes'"):
    curiosity.duplicate_observation_penalty(traj, gate="sometimes")
  with pytest.raises(ValueError, match="penalty must be >= 0, got -1"):
    curiosity.duplicate_observation_penalty(traj, penalty=-1)
