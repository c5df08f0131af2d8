"""Turn-level group baselines: MT-GRPO, GTPO, the GTPO/outcome hybrid
and the per-depth advantage of RTPO (docs/methods.md#rtpo).

All work on the turn layout `[B, N]`; a turn's statistics are taken over the trajectories of its
group that reached that turn index (`turn_mask[b, k]`), with segment ids `group_id·N + k` (static
`num_groups·N` segments). Group statistics follow docs/methods.md#group-statistics (unbiased std,
and verl's rule that a lone row has mean 0 and std 1).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import types
from agentrl_jax.advantages import gae as gae_lib
from agentrl_jax.advantages import group

Array = jax.Array


class MTGRPOOutput(NamedTuple):
  """advantages `[B, N]` = `Â^O_b + λ·Â^{T,k}_b`; outcome_advantages `[B]`; turn_advantages `[B, N]`."""

  advantages: Array
  outcome_advantages: Array
  turn_advantages: Array


class GTPOOutput(NamedTuple):
  """advantages `[B, N]`: returns normalised per (group, turn index); returns `[B, N]`: `G_{b,k}`."""

  advantages: Array
  returns: Array


class GTPOHybridOutput(NamedTuple):
  """advantages `[B, N]`; return_advantages `Â^G` `[B, N]`; outcome_advantages `Â^O` `[B]`."""

  advantages: Array
  return_advantages: Array
  outcome_advantages: Array


def per_turn_group_advantages(
    turn_scores: Array,
    turn_mask: Array,
    group_id: Array,
    num_groups: int | None = None,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
    weights: Array | None = None,
) -> Array:
  """Normalises `turn_scores[b, k]` among the rows of group `g` that have turn `k`.

      A_{b,k} = (x_{b,k} − mean_{b' ∈ g, turn_mask[b', k]} x_{b',k}) / (std + eps)

  Args:
    turn_scores: `[B, N]` float.
    turn_mask: `[B, N]` bool, which rows reached turn `k`.
    group_id: `[B]` int in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    normalize_by_std: divide by the unbiased std (else only centre).
    eps: added to the std.
    weights: optional `[B]` 0/1 mask of trajectories to include.

  Returns:
    `[B, N]` float32, zero on missing turns and excluded rows.
  """
  chex.assert_rank([turn_scores, turn_mask, group_id], [2, 2, 1])
  chex.assert_equal_shape([turn_scores, turn_mask])
  b, n = turn_scores.shape
  num_groups = b if num_groups is None else int(num_groups)
  if isinstance(group_id, np.ndarray):
    group.check_group_ids(group_id, num_groups)
  rows = jnp.asarray(turn_mask).astype(bool)
  if weights is not None:
    rows &= jnp.asarray(weights)[:, None] > 0
  # Ids outside [0, G) map outside [0, G·N), so a bad group id still yields NaN, not another group.
  ids = jnp.asarray(group_id)[:, None] * n + jnp.arange(n)[None, :]
  out = group.group_relative_advantages(
      jnp.asarray(turn_scores).reshape(-1), ids.reshape(-1), num_groups * n,
      normalize_by_std=normalize_by_std, eps=eps, weights=rows.reshape(-1).astype(jnp.float32))
  return out.reshape(b, n)


def mt_grpo_advantages(
    outcome: Array,
    turn_rewards: Array,
    turn_mask: Array,
    group_id: Array,
    num_groups: int | None = None,
    turn_coef: float = 1.0,
    eps: float = 1e-4,
    weights: Array | None = None,
) -> MTGRPOOutput:
  """MT-GRPO, K-turn form: `A_{b,k} = Â^O_b + λ·Â^{T,k}_b`.

  `Â^O` is the group-normalised outcome; `Â^{T,k}` the group-normalised reward of turn `k` among
  the trajectories that reached turn `k`. The two-turn original (Zeng et al. 2025,
  "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment") is the case
  N = 2 with the turn reward on the first turn and 0 on the second.

  Args:
    outcome: `[B]` float outcome reward `R^O`.
    turn_rewards: `[B, N]` float turn rewards `R^{T,k}`.
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    turn_coef: λ (`turn_advantage_coef`, 1.0).
    eps: added to the std (1e-4 in MT-GRPO).
    weights: optional `[B]` 0/1 mask of trajectories to include.

  Returns:
    `MTGRPOOutput`; `advantages` is zero on missing turns.
  """
  chex.assert_rank([outcome, turn_rewards], [1, 2])
  rows = jnp.asarray(turn_mask).astype(bool)
  keep = None if weights is None else jnp.asarray(weights).astype(jnp.float32)
  outcome_adv = group.group_relative_advantages(
      outcome, group_id, num_groups, normalize_by_std=True, eps=eps, weights=keep)
  turn_adv = per_turn_group_advantages(turn_rewards, rows, group_id, num_groups, True, eps, weights)
  if keep is not None:
    rows &= keep[:, None] > 0
  advantages = jnp.where(rows, outcome_adv[:, None] + turn_coef * turn_adv, 0.0)
  return MTGRPOOutput(advantages, outcome_adv, turn_adv)


def gtpo_advantages(
    turn_rewards: Array,
    turn_mask: Array,
    group_id: Array,
    num_groups: int | None = None,
    discount: float = 0.9,
    eps: float = 1e-6,
    weights: Array | None = None,
) -> GTPOOutput:
  """GTPO (Ding et al., arXiv 2511.14846): discounted turn returns normalised per turn index.

      G_{b,k} = Σ_{j≥k} γ^{j−k} r_{b,j}
      A_{b,k} = (G_{b,k} − mean_{b'∈g alive at k} G_{b',k}) / (std + eps)

  Trajectories that ended before turn `k` are excluded from turn `k`'s statistics.

  Args:
    turn_rewards: `[B, N]` float (the final turn carries the outcome; earlier turns shaped rewards).
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    discount: γ (0.9, our choice).
    eps: added to the std.
    weights: optional `[B]` 0/1 mask of trajectories to include.
  """
  chex.assert_rank([turn_rewards, turn_mask], 2)
  rows = jnp.asarray(turn_mask).astype(bool)
  returns = gae_lib.generalized_advantage_estimation(
      turn_rewards, jnp.zeros_like(turn_rewards), rows, discount, 1.0).advantages
  advantages = per_turn_group_advantages(returns, rows, group_id, num_groups, True, eps, weights)
  return GTPOOutput(advantages=advantages, returns=returns)


def gtpo_hybrid_advantages(
    turn_rewards: Array,
    outcome: Array,
    turn_mask: Array,
    group_id: Array,
    num_groups: int | None = None,
    discount: float = 0.9,
    outcome_coef: float = 0.5,
    alignment_guard: bool = True,
    eps: float = 1e-6,
    weights: Array | None = None,
) -> GTPOHybridOutput:
  """Per-turn returns plus a dampened outcome advantage (arXiv 2604.02869, formalised in methods.md#gtpo-hybrid).

      A_{b,k} = Â^G_{b,k} + η·Â^O_b
      A_{b,k} = η·Â^O_b   if the guard is on, Â^O_b ≠ 0 and sign(Â^G_{b,k}) ≠ sign(Â^O_b)

  `Â^G` is `gtpo_advantages(...).advantages`, `Â^O` the GRPO advantage of the outcome; with the
  guard the outcome's direction wins on conflicts, so no turn is pushed against the outcome.

  Args:
    turn_rewards: `[B, N]` float per-turn rewards.
    outcome: `[B]` float outcome `R^O`.
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    discount: γ (0.9).
    outcome_coef: η < 1 (0.5).
    alignment_guard: apply the sign guard.
    eps: added to the std.
    weights: optional `[B]` 0/1 mask of trajectories to include.
  """
  keep = None if weights is None else jnp.asarray(weights).astype(jnp.float32)
  returns_adv = gtpo_advantages(
      turn_rewards, turn_mask, group_id, num_groups, discount, eps, weights).advantages
  outcome_adv = group.group_relative_advantages(
      outcome, group_id, num_groups, normalize_by_std=True, eps=eps, weights=keep)
  dampened = outcome_coef * outcome_adv[:, None]
  advantages = returns_adv + dampened
  if alignment_guard:
    outcome_col = outcome_adv[:, None]
    conflict = (outcome_col != 0) & (jnp.sign(returns_adv) != jnp.sign(outcome_col))
    advantages = jnp.where(conflict, dampened, advantages)
  rows = jnp.asarray(turn_mask).astype(bool)
  if keep is not None:
    rows &= keep[:, None] > 0
  return GTPOHybridOutput(
      advantages=jnp.where(rows, advantages, 0.0),
      return_advantages=returns_adv,
      outcome_advantages=outcome_adv)


def reverse_turn_advantages(
    returns: Array,
    prefix_group: Array,
    depth: Array | int,
    turn_of_token: Array,
    action_mask: Array,
    num_groups: int | None = None,
    eps: float = 1e-6,
) -> Array:
  """RTPO's depth-`k` update signal: a group advantage on the turn-`k` action tokens only.

      A^{(j)} = (G^{(j)} − mean_{same prefix} G) / (std + eps)      on tokens of turn k; 0 elsewhere

  At depth `k` the rollout strategy samples `M` turn-`k` actions from each kept prefix `h_{b,k}` and
  continues them with the current policy; `prefix_group` names the prefix each continuation came
  from and `returns` its return `G`. Formalised from the RTPO abstract; the outer loop that
  walks `k` from the last turn down belongs to the rollout strategy (DESIGN.md: `rollout/`).

  Args:
    returns: `[B]` float return of each continuation.
    prefix_group: `[B]` int id of the shared prefix, in `[0, num_groups)`.
    depth: the turn `k` being updated (a scalar, or `[B]` per row).
    turn_of_token: `[B, L]` int turn index, −1 on padding.
    action_mask: `[B, L]` bool.
    num_groups: static G; defaults to B.
    eps: added to the std.

  Returns:
    `[B, L]` float32 advantages, nonzero only on action tokens of turn `depth`.
  """
  chex.assert_rank([returns, prefix_group, turn_of_token, action_mask], [1, 1, 2, 2])
  advantages = group.group_relative_advantages(returns, prefix_group, num_groups, eps=eps)
  on_depth = jnp.asarray(turn_of_token) == jnp.reshape(jnp.asarray(depth), (-1, 1))
  mask = jnp.asarray(action_mask).astype(bool) & on_depth
  return types.broadcast_trajectories_to_tokens(advantages.astype(jnp.float32), mask)
