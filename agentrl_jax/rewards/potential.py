"""Potential-based progress shaping: turn k earns `w·(γ·Φ(s_{k+1}) − Φ(s_k))` on top of its reward.

A sparse task gives group-relative estimators nothing to work with until some episode of a group
succeeds; a policy that starts far from success (a pretrained model that walks into walls) may
never get there. A potential Φ that grows with progress (minus the moves left to the goal) turns
every step toward the goal into reward. Ng, Harada and Russell (1999) showed that a shaping term
of this form leaves the optimal policies unchanged when the final state's potential is 0
(`terminal_potential_zero=True`); with γ = 1 the episode's shaping then telescopes to −Φ(s_0), a
constant per task that a group baseline over one task removes entirely, so invariance and a
trajectory-level signal exclude each other. The default keeps the final state's own potential:
an episode's shaping is Φ(s_end) − Φ(s_0), the progress it made, which is the signal the group
baseline sees (and which can reward getting close without arriving: weight it below the
task reward).

Needs `traj.extras["potential_before"]` and `traj.extras["potential"]` ([B, N]: Φ before and
after each turn), which an env reports in its step info.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import trajectory
from agentrl_jax import types

Array = jax.Array
_METHOD = "potential_based_shaping"


def shaping_terms(potential_before: Array, potential_after: Array, turn_mask: Array, *,
                  discount: float = 1.0, terminal_potential_zero: bool = False) -> Array:
  """`γ·Φ(s_{k+1}) − Φ(s_k)` on existing turns, 0 elsewhere; [B, N] float32."""
  mask = jnp.asarray(turn_mask, bool)
  after = jnp.asarray(potential_after, jnp.float32)
  if terminal_potential_zero:
    after = jnp.where(trajectory.last_turn(mask), 0.0, after)
  terms = discount * after - jnp.asarray(potential_before, jnp.float32)
  return jnp.where(mask, terms, 0.0)


def potential_based_shaping(traj: types.Trajectories, *, weight: float = 1.0,
                            discount: float = 1.0,
                            terminal_potential_zero: bool = False) -> types.Trajectories:
  """Reward shaper: adds `weight · shaping_terms(...)` to each turn's reward (and the outcome).

  Args:
    traj: the batch; reads the two potential arrays of `traj.extras` (see the module docstring).
    weight: scale of the shaping term against the task reward (> 0).
    discount: γ of the shaping term, in (0, 1].
    terminal_potential_zero: take Φ of each episode's final state as 0 (policy invariance).
  """
  if not weight > 0 or not 0 < discount <= 1:
    raise ValueError(f"{_METHOD}: need weight > 0 and discount in (0, 1], got weight={weight}, "
                     f"discount={discount}")
  before = trajectory.require(traj.extras, extra_keys.POTENTIAL_BEFORE_KEY, where="extras",
                              method=_METHOD, meaning="[B, N] potential of the state before each turn")
  after = trajectory.require(traj.extras, extra_keys.POTENTIAL_KEY, where="extras", method=_METHOD,
                             meaning="[B, N] potential of the state after each turn")
  terms = shaping_terms(before, after, traj.turn_mask, discount=discount,
                        terminal_potential_zero=terminal_potential_zero)
  return trajectory.with_turn_rewards(traj, jnp.asarray(traj.reward, jnp.float32) + weight * terms)
