"""The credit pipeline: reward shapers → one advantage estimator → corrections.

Each stage is a list of pure functions chosen in gin (DESIGN.md, "The data contract"):

  reward shaper:  fn(traj: Trajectories) -> Trajectories        (turn rewards → turn rewards)
  estimator:      fn(traj, values [B, L] | None) -> AdvantageOutput
  correction:     fn(traj, advantages [B, L]) -> advantages [B, L]

A correction never learns which estimator ran; a shaper changes `reward` (and, through
`with_turn_rewards`, the matching `outcome`) and nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from agentrl_jax import types
from agentrl_jax.advantages import estimators

RewardShaper = Callable[[types.Trajectories], types.Trajectories]
Correction = Callable[[types.Trajectories, jax.Array], jax.Array]


def with_turn_rewards(traj: types.Trajectories, reward: jax.Array) -> types.Trajectories:
  """Replaces the turn rewards [B, N] and moves each trajectory's outcome by the same total.

  Trajectory-level estimators read `outcome`; turn-level ones read `reward`. Shifting both by
  the shaped amount keeps them consistent (ALGORITHMS.md B.1: R_b = R_ext,b + Σ_k r_int[b, k]).
  """
  reward = jnp.where(traj.turn_mask, reward, 0.0).astype(jnp.float32)
  delta = jnp.sum(reward - jnp.where(traj.turn_mask, traj.reward, 0.0), axis=1)
  return traj.replace(reward=reward, outcome=traj.outcome + delta)


@dataclasses.dataclass(frozen=True)
class CreditPipeline:
  """Composes the three credit stages into one `(traj, values) -> AdvantageOutput`."""

  estimator: Callable[..., estimators.AdvantageOutput]
  reward_shapers: Sequence[RewardShaper] = ()
  corrections: Sequence[Correction] = ()

  def __call__(self, traj: types.Trajectories,
               values: jax.Array | None = None) -> estimators.AdvantageOutput:
    for shape in self.reward_shapers:
      traj = shape(traj)
    out = self.estimator(traj, values)
    advantages = out.advantages
    for correct in self.corrections:
      advantages = correct(traj, advantages)
    return out._replace(advantages=advantages)
