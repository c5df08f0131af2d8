"""Group-relative baselines: GRPO, Dr.GRPO, RLOO, and the StarPO-S variance filter.

ALGORITHMS.md §0.2, §A.3–A.5, §A.7. All statistics are segment reductions with a static number of
segments `num_groups` (default `B`, so group ids must lie in `[0, B)`); there is no Python loop
over groups.

Bad inputs. On host (NumPy) inputs the kernels call `check_group_ids`/`check_scores`, which raise a
`ValueError` naming the offending value. Under `jit` nothing can raise, so the failure is made
visible instead of silent: a row whose group id is outside `[0, num_groups)` gets a NaN advantage
(and contributes to no group), and a NaN score makes every row of its group NaN. Rows with weight 0
are ignored entirely, so a NaN score on a masked-out row poisons nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class GroupStatistics(NamedTuple):
  """Per-group moments, each `[G]` float32.

  Attributes:
    count: total weight of the group (its size for 0/1 weights).
    mean: weighted mean, 0 for an empty group.
    std: unbiased std `sqrt(Σ w (s − mean)² / (count − 1))`, 0 where `count ≤ 1`.
  """

  count: Array
  mean: Array
  std: Array


def check_group_ids(group_id, num_groups: int) -> None:
  """Raises a ValueError naming the first group id outside `[0, num_groups)` (host-side check)."""
  ids = np.asarray(group_id)
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"group_id must be an integer array, got dtype {ids.dtype}")
  bad = (ids < 0) | (ids >= num_groups)
  if bad.any():
    index = int(np.flatnonzero(bad.reshape(-1))[0])
    raise ValueError(
        f"group_id[{index}] = {int(ids.reshape(-1)[index])} is outside [0, {num_groups}); "
        f"group ids must be dense integers below num_groups")


def check_scores(scores, weights=None) -> None:
  """Raises a ValueError naming the first non-finite score on a row with non-zero weight."""
  values = np.asarray(scores)
  bad = ~np.isfinite(values)
  if weights is not None:
    bad &= np.asarray(weights) != 0
  if bad.any():
    index = int(np.flatnonzero(bad.reshape(-1))[0])
    raise ValueError(f"scores[{index}] = {values.reshape(-1)[index]} is not finite")


def _check_host_inputs(scores, group_id, num_groups, weights) -> None:
  if isinstance(group_id, np.ndarray):
    check_group_ids(group_id, num_groups)
  if isinstance(scores, np.ndarray):
    check_scores(scores, weights if isinstance(weights, np.ndarray) else None)


def _prepare(scores, group_id, num_groups, weights):
  chex.assert_rank([scores, group_id], 1)
  chex.assert_equal_shape([scores, group_id])
  chex.assert_type([scores, group_id], [float, int])
  num_groups = scores.shape[0] if num_groups is None else int(num_groups)
  _check_host_inputs(scores, group_id, num_groups, weights)
  dtype = jnp.promote_types(scores.dtype, jnp.float32)
  if weights is None:
    weights = jnp.ones(scores.shape, dtype)
  else:
    chex.assert_equal_shape([scores, weights])
    weights = jnp.asarray(weights).astype(dtype)
  return jnp.asarray(scores).astype(dtype), jnp.asarray(group_id), num_groups, weights


def _per_row(per_group: Array, group_id: Array, num_groups: int) -> Array:
  """Gathers `per_group[group_id]`; NaN for ids outside `[0, num_groups)` (no wrap-around)."""
  in_range = (group_id >= 0) & (group_id < num_groups)
  gathered = per_group[jnp.clip(group_id, 0, num_groups - 1)]
  return jnp.where(in_range, gathered, jnp.nan)


def _segment_sum(x, group_id, num_groups):
  # Ids outside [0, num_segments) are dropped by segment_sum.
  return jax.ops.segment_sum(x, group_id, num_segments=num_groups)


def group_statistics(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    weights: Array | None = None,
) -> GroupStatistics:
  """Weighted count, mean and unbiased std of `scores` per group (ALGORITHMS.md §0.2).

  Two passes (mean, then squared deviations) for accuracy. With integer `weights` the result equals
  the statistics of the multiset in which row `b` appears `weights[b]` times.

  Args:
    scores: `[B]` float per-row score.
    group_id: `[B]` int group of each row, in `[0, num_groups)`.
    num_groups: static number of segments G; defaults to B.
    weights: optional `[B]` non-negative weights (a 0/1 mask, or multiplicities); default 1.

  Returns:
    `GroupStatistics` of `[G]` arrays.
  """
  scores, group_id, num_groups, weights = _prepare(scores, group_id, num_groups, weights)
  active = weights > 0
  count = _segment_sum(weights, group_id, num_groups)
  total = _segment_sum(jnp.where(active, weights * scores, 0.0), group_id, num_groups)
  mean = total / jnp.maximum(count, 1e-30)
  deviation = scores - mean[jnp.clip(group_id, 0, num_groups - 1)]
  squares = _segment_sum(jnp.where(active, weights * deviation**2, 0.0), group_id, num_groups)
  std = jnp.where(count > 1, jnp.sqrt(squares / jnp.maximum(count - 1, 1e-30)), 0.0)
  return GroupStatistics(count=count, mean=mean, std=std)


def group_std(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    weights: Array | None = None,
) -> Array:
  """`[G]` unbiased std of `scores` per group (0 for groups of size ≤ 1). See `group_statistics`."""
  return group_statistics(scores, group_id, num_groups, weights).std


def group_relative_advantages(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    normalize_by_std: bool = True,
    eps: float = 1e-6,
    weights: Array | None = None,
) -> Array:
  """GRPO advantage: the score relative to its group (Shao et al. 2024; verl).

      A_b = (s_b − mean_g) / (std_g + eps)     normalize_by_std=True  (GRPO)
      A_b =  s_b − mean_g                      normalize_by_std=False (Dr.GRPO, Liu et al. 2025)

  `std_g` is the unbiased std. verl's group-of-one rule: if `n_g = 1` then `mean_g = 0` and
  `std_g = 1`, so a lone row keeps (almost) its raw score. Rows with weight 0 get 0.

  Args:
    scores: `[B]` float trajectory scores `s_b`.
    group_id: `[B]` int, in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    normalize_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
    eps: added to the std (1e-6 as in verl).
    weights: optional `[B]` 0/1 mask of rows that exist, or multiplicities (e.g. the number of step
      rows of each trajectory, for verl-agent's statistics over step rows).

  Returns:
    `[B]` float32 advantages; NaN on rows with an out-of-range group id (see module docstring).
  """
  scores, group_id, num_groups, weights = _prepare(scores, group_id, num_groups, weights)
  stats = group_statistics(scores, group_id, num_groups, weights)
  alone = stats.count <= 1
  mean = _per_row(jnp.where(alone, 0.0, stats.mean), group_id, num_groups)
  advantages = scores - mean
  if normalize_by_std:
    std = _per_row(jnp.where(alone, 1.0, stats.std), group_id, num_groups)
    advantages = advantages / (std + eps)
  return jnp.where(weights > 0, advantages, 0.0)


def contiguous_group_relative_advantages(scores: Array, group_size: int,
                                        normalize_by_std: bool = True,
                                        eps: float = 1e-6) -> Array:
  """GRPO advantage when each group's `group_size` rows sit side by side (`[G·n]`, group-major).

  Rollouts produce exactly this layout (a task's group members one after another, equal in
  number), so the group statistics are a reshape to `[G, n]` and two reductions along the last
  axis: no segment scatter, no group ids. Same maths as `group_relative_advantages` (unbiased std,
  verl's group-of-one rule: n = 1 gives mean 0, std 1).

  Args:
    scores: `[G·n]` float trajectory scores, group-major.
    group_size: n (static).
    normalize_by_std: GRPO (True) or Dr.GRPO (False).
    eps: added to the std.

  Returns:
    `[G·n]` float32 advantages.
  """
  chex.assert_rank(scores, 1)
  if group_size < 1 or scores.shape[0] % group_size:
    raise ValueError(f"{scores.shape[0]} scores do not split into groups of {group_size}")
  grouped = jnp.asarray(scores, jnp.float32).reshape(-1, group_size)
  if group_size == 1:
    mean, std = jnp.zeros_like(grouped), jnp.ones_like(grouped)
  else:
    mean = jnp.mean(grouped, axis=1, keepdims=True)
    std = jnp.std(grouped, axis=1, keepdims=True, ddof=1)
  advantages = grouped - mean
  if normalize_by_std:
    advantages = advantages / (std + eps)
  return advantages.reshape(-1)


def leave_one_out_advantages(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    weights: Array | None = None,
) -> Array:
  """RLOO advantage: the score minus the mean of the *other* rows of its group (§A.5).

      A_b = s_b − (Σ_{j∈g, j≠b} s_j) / (n_g − 1)  =  (s_b − mean_g) · n_g / (n_g − 1)     (n_g > 1)
      A_b = s_b                                                                          (n_g = 1)

  The baseline of row `b` does not depend on `s_b`, so the estimator is unbiased.

  Args:
    scores: `[B]` float.
    group_id: `[B]` int, in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    weights: optional `[B]` 0/1 mask (or multiplicities); rows with weight 0 get 0.

  Returns:
    `[B]` float32 advantages; NaN on rows with an out-of-range group id.
  """
  scores, group_id, num_groups, weights = _prepare(scores, group_id, num_groups, weights)
  stats = group_statistics(scores, group_id, num_groups, weights)
  count = _per_row(stats.count, group_id, num_groups)
  # The centred form shares GRPO's rounding: equal scores give (numerically) zero.
  centred = (scores - _per_row(stats.mean, group_id, num_groups)) * (
      count / jnp.maximum(count - 1.0, 1e-30))
  advantages = jnp.where(count > 1, centred, scores)
  return jnp.where(weights > 0, advantages, 0.0)


def variance_filter(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    keep_ratio: float = 0.25,
    mode: str = "std",
) -> Array:
  """StarPO-S variance-based trajectory filter (RAGEN `_filter_rollout`, §A.7): a keep-mask `[B]`.

  With `N_g` non-empty groups and `σ_g` the unbiased in-group std of the scores, keeps whole groups:
  the `k = max(⌊keep_ratio · N_g⌋, 1)` groups with the largest `σ_g` (`mode="std"`) or the smallest
  (`mode="std_rev"`). Ties go to the lower group id. `keep_ratio = 1` keeps everything. The floor
  of one group is our choice: an empty batch is never useful.

  Args:
    scores: `[B]` float trajectory rewards.
    group_id: `[B]` int, in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    keep_ratio: r in (0, 1].
    mode: "std" (keep high-variance groups) or "std_rev" (keep low-variance groups).

  Returns:
    `[B]` bool, True for rows of kept groups (False for rows with an out-of-range group id).
  """
  if not 0.0 < keep_ratio <= 1.0:
    raise ValueError(f"keep_ratio must be in (0, 1], got {keep_ratio!r}")
  if mode not in ("std", "std_rev"):
    raise ValueError(f"mode must be 'std' or 'std_rev', got {mode!r}")
  scores, group_id, num_groups, _ = _prepare(scores, group_id, num_groups, None)
  stats = group_statistics(scores, group_id, num_groups)
  present = stats.count > 0
  key = stats.std if mode == "std" else -stats.std
  order = jnp.argsort(jnp.where(present, -key, jnp.inf), stable=True)
  rank = jnp.zeros(num_groups, jnp.int32).at[order].set(jnp.arange(num_groups, dtype=jnp.int32))
  num_present = jnp.sum(present)
  num_kept = jnp.maximum(jnp.floor(keep_ratio * num_present), 1).astype(jnp.int32)
  keep_group = present & (rank < num_kept)
  in_range = (group_id >= 0) & (group_id < num_groups)
  return in_range & keep_group[jnp.clip(group_id, 0, num_groups - 1)]
