"""SPO: similarity-weighted leave-one-out baselines per turn (docs/methods.md#spo).

Formalised from the MM-Doc-R1 abstract (arXiv 2604.13579). The library takes precomputed prefix
representations (e.g. mean-pooled frozen sentence embeddings of the agent's actions up to turn k);
nothing here runs an encoder.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.advantages import group

Array = jax.Array


class SPOOutput(NamedTuple):
  """advantages `[B, N]`; baselines `[B, N]` (the similarity-weighted mean of the others' R)."""

  advantages: Array
  baselines: Array


def forward_fill_turns(x: Array, turn_mask: Array) -> Array:
  """Replaces missing turns by the last existing one: `out[b, k] = x[b, max{j ≤ k: mask[b, j]}]`.

  Turns before the first existing one take turn 0.

  Args:
    x: `[B, N, ...]`.
    turn_mask: `[B, N]` bool.
  """
  chex.assert_rank(turn_mask, 2)
  chex.assert_equal_shape_prefix([x, turn_mask], 2)
  n = turn_mask.shape[1]
  index = jnp.where(jnp.asarray(turn_mask).astype(bool), jnp.arange(n)[None, :], -1)
  index = jnp.maximum(jax.lax.cummax(index, axis=1), 0)
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def similarity_advantages(
    rewards: Array,
    prefix_embedding: Array,
    turn_mask: Array,
    group_id: Array,
    temperature: float = 0.1,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
    weights: Array | None = None,
) -> SPOOutput:
  """Per-turn baseline from the rewards of similar trajectories of the same group.

      sim_{ij,k} = max(0, cos(e_{i,k}, e_{j,k}))                  (j ∈ g(i), j ≠ i)
      ω_{ij,k}   = exp(sim_{ij,k} / τ)
      b_{i,k}    = Σ_j ω_{ij,k} R_j / Σ_j ω_{ij,k}
      A_{i,k}    = (R_i − b_{i,k}) / (std_g R + eps)               (std division optional)

  With equal similarities `b` is RLOO's leave-one-out mean; `R_i` never enters its own baseline,
  and `b` is a convex combination of the others' rewards. A trajectory alone in its group gets
  `b = 0` and `std = 1` (the §0.2 rule). Trajectories shorter than turn `k` use their last prefix
  representation; their advantages are still zero on missing turns. Cost: O(B²·N·d) — the
  similarity is computed for all pairs and masked to same-group pairs.

  Args:
    rewards: `[B]` float outcome `R`.
    prefix_embedding: `[B, N, d]` float representation of each trajectory's prefix up to turn `k`.
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, B)`.
    temperature: τ (0.1).
    normalize_by_std: divide by the unbiased group std of `R`.
    eps: added to the std.
    weights: optional `[B]` 0/1 mask of trajectories to include.

  Returns:
    `SPOOutput(advantages, baselines)`, zero on missing turns and excluded rows.
  """
  chex.assert_rank([rewards, prefix_embedding, turn_mask, group_id], [1, 3, 2, 1])
  chex.assert_equal_shape_prefix([prefix_embedding, turn_mask], 2)
  b, n = turn_mask.shape
  if isinstance(group_id, np.ndarray):
    group.check_group_ids(group_id, b)
  rewards = jnp.asarray(rewards).astype(jnp.float32)
  keep = jnp.ones((b,), bool) if weights is None else jnp.asarray(weights) > 0
  rows = jnp.asarray(turn_mask).astype(bool) & keep[:, None]

  e = forward_fill_turns(jnp.asarray(prefix_embedding).astype(jnp.float32), rows)
  e = e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
  similarity = jnp.maximum(jnp.einsum("ikd,jkd->kij", e, e), 0.0)  # [N, B, B]
  gid = jnp.asarray(group_id)
  others = (gid[:, None] == gid[None, :]) & ~jnp.eye(b, dtype=bool) & keep[None, :] & keep[:, None]
  # Subtracting the row max before exp keeps the weights finite for small τ; it cancels in the ratio.
  logits = jnp.where(others[None], similarity / temperature, -jnp.inf)
  logits = logits - jnp.max(jnp.where(others[None], logits, 0.0), axis=-1, keepdims=True)
  omega = jnp.where(others[None], jnp.exp(logits), 0.0)
  total = jnp.sum(omega, axis=-1)
  # The weighted mean is taken about the largest of the others' rewards, which is the same in
  # exact arithmetic; but equal rewards then give R_i - b = 0 exactly instead of a rounding error
  # that the division by (std + eps) would scale up to ~0.03.
  anchor = jnp.max(jnp.where(others, rewards[None, :], -jnp.inf), axis=-1)  # [B]
  anchor = jnp.where(jnp.isfinite(anchor), anchor, 0.0)
  spread = jnp.sum(omega * (rewards[None, None, :] - anchor[None, :, None]), axis=-1)
  baseline = anchor[None, :] + spread / jnp.maximum(total, 1e-30)
  baseline = jnp.where(total > 0, baseline, 0.0).T  # [B, N]

  advantages = rewards[:, None] - baseline
  if normalize_by_std:
    stats = group.group_statistics(rewards, gid, b, keep.astype(jnp.float32))
    count = stats.count[jnp.clip(gid, 0, b - 1)]
    std = jnp.where(count > 1, stats.std[jnp.clip(gid, 0, b - 1)], 1.0)
    advantages = advantages / (std[:, None] + eps)
  # As in `group`: under jit a row with an out-of-range group id comes back NaN, not plausible.
  advantages = jnp.where(((gid >= 0) & (gid < b))[:, None], advantages, jnp.nan)
  return SPOOutput(advantages=jnp.where(rows, advantages, 0.0),
                   baselines=jnp.where(rows, baseline, 0.0))
