"""The credit pipeline: reward shapers → one advantage estimator → corrections.

Each stage is a list of pure functions chosen in gin (DESIGN.md, "The data contract"):

  reward shaper:  fn(traj: Trajectories) -> Trajectories        (turn rewards → turn rewards)
  estimator:      fn(traj, values [B, L] | None) -> AdvantageOutput
  correction:     fn(traj, advantages [B, L]) -> advantages [B, L]

A correction never learns which estimator ran; a shaper changes `reward` (and, through
`trajectory.with_turn_rewards`, the matching `outcome`) and nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax

from agentrl_jax import types
from agentrl_jax.advantages import estimators

RewardShaper = Callable[[types.Trajectories], types.Trajectories]
Correction = Callable[[types.Trajectories, jax.Array], jax.Array]


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
