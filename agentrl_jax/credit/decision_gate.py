"""Oracle turn-level credit: the advantage kept on decision turns only
(docs/methods.md#decision-density).

    A'_l = Â_l · 1[turn(l) ∈ D]    on action tokens;   A'_l = A_l elsewhere

With Â a trajectory-level advantage (GRPO, RLOO) this is the turn-level estimator with an oracle
critic of the decision-density analysis: a routine turn's action does not change the law of the
return, so an exact critic gives it zero advantage, and its score-function term, pure noise, drops
out of the gradient. It needs the set D, which only an env that knows it reports
(`extra_keys.DECISION_TURN_KEY`, e.g. DD-Chain); it is the reference the learned turn-level methods
are measured against, not a method for envs without that oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import trajectory
from agentrl_jax import types

Array = jax.Array


def oracle_decision_gate(traj: types.Trajectories, advantages: Array) -> Array:
  """Zeroes `advantages [B, L]` on the action tokens of routine turns.

  Args:
    traj: the batch; `traj.extras[DECISION_TURN_KEY]` is `[B, N]`, nonzero on decision turns.
    advantages: `[B, L]` token advantages from any estimator.

  Returns:
    `[B, L]`, equal to `advantages` except on routine turns' action tokens, which are 0.
  """
  decision = trajectory.require(traj.extras, extra_keys.DECISION_TURN_KEY, where="extras",
                                method="oracle_decision_gate",
                                meaning="[B, N] 1 on decision turns, as DD-Chain reports it")
  routine = trajectory.to_tokens((decision == 0).astype(jnp.float32), traj) > 0
  return jnp.where(routine, jnp.zeros_like(advantages), advantages)
