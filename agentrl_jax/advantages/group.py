"""Group-relative baselines: GRPO, Dr.GRPO, RLOO, and the StarPO-S variance filter.

docs/methods.md#group-statistics, #grpo, #dr-grpo, #rloo, #starpo-s. All statistics are segment
reductions with a static number of segments `num_groups` (default `B`, so group ids must lie in
`[0, B)`); there is no Python loop over groups.

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
  """Checks the contract; returns float scores, ids, the static G and weights (None stays None)."""
  chex.assert_rank([scores, group_id], 1)
  chex.assert_equal_shape([scores, group_id])
  chex.assert_type([scores, group_id], [float, int])
  num_groups = scores.shape[0] if num_groups is None else int(num_groups)
  _check_host_inputs(scores, group_id, num_groups, weights)
  dtype = jnp.promote_types(scores.dtype, jnp.float32)
  if weights is not None:
    chex.assert_equal_shape([scores, weights])
    weights = jnp.asarray(weights).astype(dtype)
  return jnp.asarray(scores).astype(dtype), group_id, num_groups, weights


def _per_row(per_group: Array, group_id: Array, num_groups: int) -> Array:
  """Gathers `per_group[group_id]`; NaN for ids outside `[0, num_groups)` (no wrap-around)."""
  in_range = (group_id >= 0) & (group_id < num_groups)
  gathered = per_group[jnp.clip(group_id, 0, num_groups - 1)]
  return jnp.where(in_range, gathered, jnp.nan)


def _segment_sums(columns, group_id, num_groups):
  """Per-group sums of several `[B]` columns with one scatter (`[G, k]`); ids outside are dropped."""
  return jax.ops.segment_sum(jnp.stack(columns, axis=1), group_id, num_segments=num_groups)


class GroupDeviations(NamedTuple):
  """The statistics of each row's group, gathered to the row; each `[B]` float32.

  Attributes:
    count: total weight of the row's group.
    deviation: `s_b − mean_g`, computed from shifted sums so that it keeps the precision of the
      spread of the group, not of its offset (see `group_deviations`).
    std: unbiased std of the row's group, 0 where `count ≤ 1`.
  """

  count: Array
  deviation: Array
  std: Array


class _Moments(NamedTuple):
  count: Array  # Σ w
  shift: Array  # m0, the rounded mean of the active scores (no gradient)
  correction: Array  # c = Σ w·(s − m0) / Σ w, so mean = m0 + c
  std: Array


def _moments(count, linear, square) -> tuple[Array, Array]:
  """Corrected two-pass moments: `c` and the unbiased std from `Σ w·d` and `Σ w·d²`, d = s − m0."""
  correction = linear / jnp.maximum(count, 1e-30)
  # Σ w (d − c)² = Σ w d² − c·Σ w d; the subtracted term is the tiny rounding of m0, so no
  # cancellation (Chan, Golub & LeVeque's corrected two-pass formula).
  squares = jnp.maximum(square - correction * linear, 0.0)
  std = jnp.where(count > 1, jnp.sqrt(squares / jnp.maximum(count - 1, 1e-30)), 0.0)
  return correction, std


def _segment_moments(scores, group_id, num_groups, weights):
  """`_Moments` per group `[G]` plus the per-row shifted scores `d = s − m0[g]` (segment sums)."""
  if weights is None:
    weights = jnp.ones_like(scores)
  active = weights > 0
  # Rows with weight 0 are zeroed before any product, so a NaN there poisons nothing.
  masked = jnp.where(active, scores, 0.0)
  count, total = _segment_sums([weights, weights * masked], group_id, num_groups).T
  shift = jax.lax.stop_gradient(total / jnp.maximum(count, 1e-30))
  shifted = jnp.where(active, masked - _per_row(shift, group_id, num_groups), 0.0)
  linear, square = _segment_sums([weights * shifted, weights * shifted**2], group_id,
                                 num_groups).T
  correction, std = _moments(count, linear, square)
  return _Moments(count, shift, correction, std), shifted


def _row_sum(x: Array) -> Array:
  """`[G, n] → [G, 1]` sums as a matrix-vector product.

  XLA fuses a `reduce` into a consumer that reduces again, recomputing it for every element (8×
  the work at n = 8 on CPU); a dot is never fused that way, and it is exact at HIGHEST precision.
  """
  ones = jnp.ones((x.shape[1],), x.dtype)
  return jnp.dot(x, ones, precision=jax.lax.Precision.HIGHEST)[:, None]


def _contiguous_deviations(scores, weights, group_size: int) -> GroupDeviations:
  """`GroupDeviations` when row `b` is in group `b // group_size`: a reshape to `[G, n]`."""
  x = scores.reshape(-1, group_size)
  if weights is None:
    count = jnp.full((x.shape[0], 1), group_size, x.dtype)
    active = None
    w = None
  else:
    w = weights.reshape(-1, group_size)
    active = w > 0
    x = jnp.where(active, x, 0.0)
    count = _row_sum(w)
  weighted = (lambda y: y) if w is None else (lambda y: w * y)
  shift = jax.lax.stop_gradient(_row_sum(weighted(x)) / jnp.maximum(count, 1e-30))
  shifted = x - shift if active is None else jnp.where(active, x - shift, 0.0)
  linear, square = _row_sum(weighted(shifted)), _row_sum(weighted(shifted**2))
  correction, std = _moments(count, linear, square)
  shape = (x.shape[0], group_size)
  return GroupDeviations(count=jnp.broadcast_to(count, shape).reshape(-1),
                         deviation=(shifted - correction).reshape(-1),
                         std=jnp.broadcast_to(std, shape).reshape(-1))


def _segment_deviations(scores, group_id, num_groups, weights) -> GroupDeviations:
  moments, shifted = _segment_moments(scores, group_id, num_groups, weights)
  return GroupDeviations(count=_per_row(moments.count, group_id, num_groups),
                         deviation=shifted - _per_row(moments.correction, group_id, num_groups),
                         std=_per_row(moments.std, group_id, num_groups))


# Group sizes that get a compiled reshape branch under jit (those that divide B). Each branch adds
# about half a second of XLA CPU compile time, so only the usual GRPO group sizes are listed.
CONTIGUOUS_GROUP_SIZES = (2, 4, 8, 16, 32, 64)
# Under jit the branches are compiled only from this many rows on: below it the segment path
# takes well under a millisecond on CPU, less than the branches' compile time could ever repay.
MIN_TRACED_CONTIGUOUS_ROWS = 1 << 16


def _contiguous_group_sizes(rows: int, num_groups: int) -> list[int]:
  return [n for n in CONTIGUOUS_GROUP_SIZES if rows % n == 0 and rows // n <= num_groups]


def contiguous_group_size(group_id) -> int | None:
  """n if `group_id[b] = b // n` for every row with n dividing B (host-side), else None."""
  ids = np.asarray(group_id).reshape(-1)
  if ids.size == 0 or ids[-1] < 0:
    return None
  n, rest = divmod(ids.size, int(ids[-1]) + 1)
  if rest or not np.array_equal(ids, np.arange(ids.size) // n):
    return None
  return n


def _traced_contiguous_group_size(group_id: Array) -> Array:
  """Under jit: n as in `contiguous_group_size`, or 0 when the ids are not of that form."""
  rows = group_id.shape[0]
  num = jnp.maximum(group_id[-1].astype(jnp.int32) + 1, 1)
  n = rows // num
  # One pass: b − n·g_b must lie in [0, n) for every row; as uint32 a negative is huge.
  offset = jnp.arange(rows, dtype=jnp.int32) - n * group_id.astype(jnp.int32)
  contiguous = jnp.all(offset.astype(jnp.uint32) < n.astype(jnp.uint32)) & (n * num == rows)
  return jnp.where(contiguous, n, 0)


def group_deviations(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    weights: Array | None = None,
    *,
    detect_contiguous: bool = True,
) -> GroupDeviations:
  """Per row: its group's total weight, `s_b − mean_g` and unbiased std (the GRPO/RLOO baseline).

  Corrected two-pass statistics (Chan, Golub & LeVeque 1983): with `m0_g` the float32 mean of the
  group and `d_b = s_b − m0_g` (exact when the group's values are close to each other),

      c_g = Σ w·d / Σ w,    s_b − mean_g = d_b − c_g,    std_g² = (Σ w·d² − c_g·Σ w·d) / (Σ w − 1).

  `c_g` recovers the rounding of `m0_g`, so a group at offset 1000 with a spread of 1e-4 keeps
  the precision of its spread; `s_b − m0_g − c_g` never rounds through a float32 mean.

  Layout fast path: when `group_id[b] = b // n` (groups side by side and equal in size, as the
  rollout produces them) the sums are a reshape to `[G, n]` and matrix-vector products instead of
  segment scatters. NumPy ids are inspected on the host (any n); under `jit`, from
  `MIN_TRACED_CONTIGUOUS_ROWS` rows on, one pass over the ids picks, with `lax.switch`, a
  compiled branch for n in `CONTIGUOUS_GROUP_SIZES` (those that divide B), or the segment path.

  Args:
    scores: `[B]` float.
    group_id: `[B]` int, in `[0, num_groups)`.
    num_groups: static G; defaults to B.
    weights: optional `[B]` non-negative weights; rows with weight 0 are ignored.
    detect_contiguous: look for the contiguous layout (False: always segment sums, for ids that
      cannot have it, such as `step.step_groups` ids, to compile no reshape branches).

  Returns:
    `GroupDeviations` of `[B]` arrays; NaN on rows with an out-of-range group id.
  """
  scores, group_id, num_groups, weights = _prepare(scores, group_id, num_groups, weights)
  rows = scores.shape[0]
  sizes = _contiguous_group_sizes(rows, num_groups) if detect_contiguous else []
  if isinstance(group_id, np.ndarray) and detect_contiguous:
    n = contiguous_group_size(group_id)
    if n is not None and n > 1 and rows // n <= num_groups:
      return _contiguous_deviations(scores, weights, n)
    return _segment_deviations(scores, jnp.asarray(group_id), num_groups, weights)
  group_id = jnp.asarray(group_id)
  if not sizes or rows < MIN_TRACED_CONTIGUOUS_ROWS:
    return _segment_deviations(scores, group_id, num_groups, weights)
  n = _traced_contiguous_group_size(group_id)
  # Branch i < len(sizes) is the reshape for sizes[i]; the last one is the segment path.
  index = jnp.sum(jnp.where(n == jnp.asarray(sizes), jnp.arange(len(sizes)), 0)) + jnp.where(
      jnp.any(n == jnp.asarray(sizes)), 0, len(sizes))
  branches = [lambda s, g, w, n=n_: _contiguous_deviations(s, w, n) for n_ in sizes]
  branches.append(lambda s, g, w: _segment_deviations(s, g, num_groups, w))
  return jax.lax.switch(index, branches, scores, group_id, weights)


def group_statistics(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    weights: Array | None = None,
) -> GroupStatistics:
  """Weighted count, mean and unbiased std of `scores` per group (docs/methods.md#group-statistics).

  Corrected two passes (see `group_deviations`): `mean_g = m0_g + c_g` with `m0_g` the float32
  mean and `c_g` the mean of `s − m0_g`. With integer `weights` the result equals the statistics
  of the multiset in which row `b` appears `weights[b]` times.

  Args:
    scores: `[B]` float per-row score.
    group_id: `[B]` int group of each row, in `[0, num_groups)`.
    num_groups: static number of segments G; defaults to B.
    weights: optional `[B]` non-negative weights (a 0/1 mask, or multiplicities); default 1.

  Returns:
    `GroupStatistics` of `[G]` arrays.
  """
  scores, group_id, num_groups, weights = _prepare(scores, group_id, num_groups, weights)
  moments, _ = _segment_moments(scores, jnp.asarray(group_id), num_groups, weights)
  mean = jnp.where(moments.count > 0, moments.shift + moments.correction, 0.0)
  return GroupStatistics(count=moments.count, mean=mean, std=moments.std)


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
  `s_b − mean_g` comes from `group_deviations` (shifted sums, and a reshape fast path when the
  groups are contiguous and equal in size).

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
  stats = group_deviations(scores, group_id, num_groups, weights)
  scores = jnp.asarray(scores).astype(stats.deviation.dtype)
  alone = stats.count <= 1
  advantages = jnp.where(alone, scores, stats.deviation)
  if normalize_by_std:
    advantages = advantages / (jnp.where(alone, 1.0, stats.std) + eps)
  # NaN counts (out-of-range ids) must stay NaN: `alone` is False for them.
  advantages = jnp.where(jnp.isnan(stats.count), jnp.nan, advantages)
  if weights is None:
    return advantages
  return jnp.where(jnp.asarray(weights) > 0, advantages, 0.0)


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
  """RLOO advantage: the score minus the mean of the *other* rows of its group.

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
  stats = group_deviations(scores, group_id, num_groups, weights)
  scores = jnp.asarray(scores).astype(stats.deviation.dtype)
  # The centred form shares GRPO's rounding: equal scores give (numerically) zero.
  centred = stats.deviation * (stats.count / jnp.maximum(stats.count - 1.0, 1e-30))
  advantages = jnp.where(stats.count > 1, centred, scores)
  advantages = jnp.where(jnp.isnan(stats.count), jnp.nan, advantages)
  if weights is None:
    return advantages
  return jnp.where(jnp.asarray(weights) > 0, advantages, 0.0)


def variance_filter(
    scores: Array,
    group_id: Array,
    num_groups: int | None = None,
    keep_ratio: float = 0.25,
    mode: str = "std",
) -> Array:
  """StarPO-S variance-based trajectory filter (RAGEN `_filter_rollout`): a keep-mask `[B]`.

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
