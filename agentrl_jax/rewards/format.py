"""Format penalty: each turn whose reply the env could not parse costs `penalty` reward.

A pretrained chat model asked for a move often answers in prose ("Your move is to left, right,
…"), which the env rejects at the cost of a turn (`traj.action_valid` False). With a sparse task
reward, a group whose episodes all fail has equal returns and no gradient, however differently
they failed; charging invalid turns ranks the group's episodes by how often they answered in
the format, a signal present from the first batch (verl-agent charges the same per-step penalty
inside GiGPO; this shaper gives it to every estimator). The charge lands on the invalid turn's
reward, so turn-level estimators see where it happened, and moves the outcome by the episode's
total, which trajectory-level estimators read.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax import trajectory
from agentrl_jax import types

Array = jax.Array


def invalid_turns(traj: types.Trajectories) -> Array:
  """`[B, N]` bool: existing turns whose action the env rejected."""
  return jnp.asarray(traj.turn_mask, bool) & ~jnp.asarray(traj.action_valid, bool)


def invalid_action_penalty(traj: types.Trajectories, *,
                           penalty: float = 0.1) -> types.Trajectories:
  """Reward shaper: subtracts `penalty` from the reward of every invalid turn (and the outcome).

  Args:
    traj: the batch; reads `turn_mask` and `action_valid`.
    penalty: the charge per invalid turn (> 0), in units of the task reward.
  """
  if not penalty > 0:
    raise ValueError(f"invalid_action_penalty: need penalty > 0, got {penalty}")
  charge = penalty * invalid_turns(traj).astype(jnp.float32)
  return trajectory.with_turn_rewards(traj, jnp.asarray(traj.reward, jnp.float32) - charge)
