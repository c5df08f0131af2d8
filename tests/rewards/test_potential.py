"""Tests of potential-based progress shaping on FrozenLake episodes recorded as the rollout does."""

import jax
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.envs import frozenlake
from agentrl_jax.rewards import potential
from agentrl_jax.rollout import loop

N_TURNS = 8


def record(episodes):
  """A batch of (seed, actions) FrozenLake episodes; step infos go through the rollout's own
  `record_step_info`, as in a real collection."""
  traj = types.empty_trajectories(len(episodes), 4, N_TURNS)
  for row, (seed, actions) in enumerate(episodes):
    env = frozenlake.FrozenLake(max_turns=N_TURNS, report_potential=True)
    env.reset(seed)
    for turn, action in enumerate(actions):
      result = env.step(action)
      traj.turn_mask[row, turn] = True
      traj.reward[row, turn] = result.reward
      loop.record_step_info(traj, result.info, row, turn)
      if result.done:
        break
  traj.outcome[:] = traj.reward.sum(1)
  return traj


EPISODES = [(3, ["right", "right", "down", "down", "down", "right"]),
            (3, ["down"]),  # a hole at once
            (3, ["up", "left", "right"]),
            (5, ["right", "down", "right", "down", "right", "down", "left", "up"])]


def numpy_reference(before, after, mask, reward, weight, discount, terminal_zero):
  out = np.array(reward, np.float32)
  for b in range(mask.shape[0]):
    last = int(mask[b].sum()) - 1
    for k in range(last + 1):
      phi_next = 0.0 if terminal_zero and k == last else after[b, k]
      out[b, k] += weight * (discount * phi_next - before[b, k])
  return out


@pytest.mark.parametrize("weight,discount,terminal_zero", [(1.0, 1.0, False), (0.5, 0.9, True)])
def test_matches_the_numpy_loop(weight, discount, terminal_zero):
  traj = record(EPISODES)
  shaped = jax.jit(lambda t: potential.potential_based_shaping(
      t, weight=weight, discount=discount, terminal_potential_zero=terminal_zero))(traj)
  expected = numpy_reference(traj.extras["potential_before"], traj.extras["potential"],
                             traj.turn_mask, traj.reward, weight, discount, terminal_zero)
  np.testing.assert_allclose(shaped.reward, expected, atol=1e-6)
  np.testing.assert_allclose(shaped.outcome, expected.sum(1), atol=1e-6)


def test_undiscounted_shaping_telescopes_to_the_progress_made():
  traj = record(EPISODES)
  terms = np.asarray(potential.shaping_terms(traj.extras["potential_before"],
                                             traj.extras["potential"], traj.turn_mask))
  start = traj.extras["potential_before"][:, 0]
  last = traj.turn_mask.sum(1) - 1
  end = traj.extras["potential"][np.arange(len(EPISODES)), last]
  np.testing.assert_allclose(terms.sum(1), end - start, atol=1e-6)
  # The episode that walks toward the goal gains; the one that falls in a hole at once loses.
  assert terms[0].sum() > 0 > terms[1].sum()


def test_invariant_form_is_a_constant_per_task_that_a_group_baseline_removes():
  traj = record(EPISODES[:3])  # one map (seed 3), three different behaviours
  terms = np.asarray(potential.shaping_terms(traj.extras["potential_before"],
                                             traj.extras["potential"], traj.turn_mask,
                                             terminal_potential_zero=True))
  np.testing.assert_allclose(terms.sum(1), -traj.extras["potential_before"][:, 0], atol=1e-6)
  assert np.ptp(terms.sum(1)) < 1e-6


def test_frozenlake_potential_is_minus_the_moves_left_and_minus_one_in_a_hole():
  env = frozenlake.FrozenLake(max_turns=N_TURNS, report_potential=True)
  env.reset(3)
  assert env.potential() == -env.shortest_path_length / 16
  result = env.step("down")  # seed 3 has a hole below the start
  assert result.done and result.info["potential"] == -1.0
  plain = frozenlake.FrozenLake(max_turns=N_TURNS)
  plain.reset(3)
  assert "potential" not in plain.step("right").info  # off unless asked for


def test_missing_potentials_and_bad_hyperparameters_are_named():
  traj = types.empty_trajectories(1, 4, 2)
  with pytest.raises(ValueError, match="potential_before"):
    potential.potential_based_shaping(traj)
  with pytest.raises(ValueError, match="weight > 0"):
    potential.potential_based_shaping(record(EPISODES[:1]), weight=0.0)
