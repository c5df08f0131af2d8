"""Tests of the format penalty on invalid turns."""

import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import frozenlake
from agentrl_jax.rewards import format as format_lib
from agentrl_jax.rollout import loop

N_TURNS = 6


def record(episodes):
  """(seed, replies) free-text FrozenLake episodes, each step written by the rollout's `record_step`."""
  traj = types.empty_trajectories(len(episodes), 4, N_TURNS)
  for row, (seed, replies) in enumerate(episodes):
    env = frozenlake.FrozenLake(max_turns=N_TURNS, free_text_actions=True)
    env.reset(seed)
    for turn, reply in enumerate(replies):
      traj.turn_mask[row, turn] = True
      if not loop.record_step(traj, row, env.step(reply), turn, loop.RolloutStats()):
        break
  traj.action_mask[:, 0] = True  # one action token per row carries the trajectory's advantage
  traj.group_id[:] = 0
  traj.valid_trajectory[:] = 1.0
  return traj


# Seed 3's board: none of these replies reaches the goal within the turns given.
EPISODES = [(3, ["I move right.", "up", "left"]),
            (3, ["Your move is to left, right, or down.", "up", "the board shows"]),
            (3, ["???", "hmm", "no idea"]),
            (3, ["up", "left", "up"])]


def test_charges_each_invalid_turn_as_the_numpy_loop():
  traj = record(EPISODES)
  assert traj.action_valid[traj.turn_mask].sum() not in (0, traj.turn_mask.sum())
  out = format_lib.invalid_action_penalty(traj, penalty=0.25)
  want = np.array(traj.reward, np.float32)
  for b in range(len(EPISODES)):
    for k in range(N_TURNS):
      if traj.turn_mask[b, k] and not traj.action_valid[b, k]:
        want[b, k] -= 0.25
  np.testing.assert_allclose(np.asarray(out.reward), want)
  np.testing.assert_allclose(np.asarray(out.outcome), traj.outcome + (want - traj.reward).sum(1))


def test_gives_grpo_a_signal_where_every_episode_failed():
  traj = record(EPISODES)
  assert np.all(traj.outcome == 0)
  flat = estimators.grpo(traj).advantages
  assert np.allclose(np.asarray(flat), 0.0)
  shaped = format_lib.invalid_action_penalty(traj, penalty=0.1)
  per_episode = np.asarray(estimators.grpo(shaped).advantages)[:, 0]
  invalid = np.asarray(format_lib.invalid_turns(traj)).sum(1)
  # Fewer invalid turns, higher advantage; equal counts, equal advantage.
  order = np.argsort(invalid, kind="stable")
  assert np.all(np.diff(per_episode[order]) <= 1e-6)
  assert per_episode[invalid.argmin()] > 0 > per_episode[invalid.argmax()]


def test_rejects_a_non_positive_penalty():
  traj = record(EPISODES[:1])
  with pytest.raises(ValueError, match="penalty > 0"):
    format_lib.invalid_action_penalty(traj, penalty=0.0)
