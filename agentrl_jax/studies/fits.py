"""Statistics the studies report: log–log OLS fits, bootstrap intervals, the Mann–Whitney U test
and the Wilcoxon signed-rank test.

NumPy only (host-side analysis of a few dozen numbers); no SciPy dependency.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

# Above this many rank splits the exact permutation distribution gives way to the normal one.
_MAX_EXACT_SPLITS = 200_000
_ALTERNATIVES = ("two-sided", "less", "greater")
# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30 (standard tables).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class LogLogFit(NamedTuple):
  """`log y = intercept + slope·log x` by OLS; arrays carry any leading batch axes of `y`."""

  slope: np.ndarray
  intercept: np.ndarray
  r2: np.ndarray


class MannWhitney(NamedTuple):
  """`u`: the U statistic of the first sample; `p_value` for the chosen alternative; `exact`."""

  u: float
  p_value: float
  exact: bool


class SignedRank(NamedTuple):
  """`w`: the sum of the ranks of the positive differences; `p_value` for the chosen alternative;
  `n`: the pairs left after dropping zero differences."""

  w: float
  p_value: float
  n: int


class StepGap(NamedTuple):
  """Per density: median steps of each estimator, `gap = median_traj / median_turn`, one-sided
  Mann–Whitney p-value for "the turn-level estimator needs fewer steps"."""

  median_traj: np.ndarray
  median_turn: np.ndarray
  gap: np.ndarray
  p_value: np.ndarray


def loglog_fit(x: np.ndarray, y: np.ndarray) -> LogLogFit:
  """OLS of `log y` on `log x`, with `R² = 1 − SS_res/SS_tot`.

  Args:
    x: `[n]` positive abscissae (e.g. densities ρ).
    y: `[..., n]` positive ordinates (e.g. SNR ratios); leading axes are fitted independently,
      which is how a bootstrap of ratios becomes a bootstrap of slopes.

  Returns:
    `LogLogFit` with arrays of shape `y.shape[:-1]`.
  """
  x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
  if x.ndim != 1 or x.size < 2 or y.shape[-1:] != x.shape:
    raise ValueError(f"need x [n >= 2] and y [..., n]; got x {x.shape}, y {y.shape}")
  if np.any(x <= 0) or np.any(y <= 0):
    raise ValueError("loglog_fit needs positive x and y")
  lx, ly = np.log(x), np.log(y)
  dx = lx - lx.mean()
  if not np.any(dx):
    raise ValueError(f"x must take at least two distinct values, got {x.tolist()}")
  dy = ly - ly.mean(axis=-1, keepdims=True)
  slope = (dy @ dx) / (dx @ dx)
  intercept = ly.mean(axis=-1) - slope * lx.mean()
  residual = dy - slope[..., None] * dx
  ss_tot = np.sum(dy**2, axis=-1)
  r2 = 1.0 - np.sum(residual**2, axis=-1) / np.where(ss_tot > 0, ss_tot, 1.0)
  return LogLogFit(slope=slope, intercept=intercept, r2=r2)


def percentile_interval(samples: np.ndarray, confidence: float = 0.95, axis: int = 0) -> np.ndarray:
  """Bootstrap percentile interval `[low, high]` along `axis`, stacked on a new last axis."""
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
  tail = 50.0 * (1.0 - confidence)
  low, high = np.percentile(np.asarray(samples, dtype=np.float64), [tail, 100.0 - tail], axis=axis)
  return np.stack([low, high], axis=-1)


def t_quantile_975(df: int) -> float:
  """`t_{0.975, df}`: the table for df ≤ 30, above it the expansion `z + (z³ + z)/(4·df)`."""
  if int(df) != df or df < 1:
    raise ValueError(f"df must be an int >= 1, got {df!r}")
  if df <= len(_T975):
    return _T975[int(df) - 1]
  z = 1.959964
  return z + (z**3 + z) / (4.0 * df)


def mean_confidence_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Mean over axis 0 with its 95% Student-t interval `mean ± t_{0.975, n−1}·s/sqrt(n)`.

  Args:
    values: `[n, ...]`, e.g. one learning curve per seed.

  Returns:
    `(mean, low, high)`, each `values.shape[1:]`; with n = 1 the bounds are NaN.
  """
  values = np.asarray(values, dtype=np.float64)
  if values.ndim < 1 or values.shape[0] < 1:
    raise ValueError(f"need at least one sample along axis 0, got shape {values.shape}")
  n = values.shape[0]
  mean = values.mean(axis=0)
  if n == 1:
    nan = np.full_like(mean, np.nan)
    return mean, nan, nan.copy()
  half = t_quantile_975(n - 1) * values.std(axis=0, ddof=1) / np.sqrt(n)
  return mean, mean - half, mean + half


def _samples(x, y, alternative: str) -> tuple[np.ndarray, np.ndarray]:
  """Both samples as flat float64 arrays, after checking `alternative` and finiteness."""
  if alternative not in _ALTERNATIVES:
    raise ValueError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")
  x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError("samples must be finite")
  return x, y


def _p_value(p_less: float, p_greater: float, alternative: str) -> float:
  """The alternative's p-value; two-sided is twice the smaller one-sided one, capped at 1."""
  return {"less": p_less, "greater": p_greater,
          "two-sided": min(1.0, 2.0 * min(p_less, p_greater))}[alternative]


def _exact_tails(null: np.ndarray, statistic: float) -> tuple[float, float]:
  """(P(T ≤ t), P(T ≥ t)) over an enumerated null distribution of a rank sum.

  Midranks are multiples of 1/2, so rank sums are exact in float64; the slack only absorbs
  rounding in the summation order.
  """
  return float(np.mean(null <= statistic + 1e-9)), float(np.mean(null >= statistic - 1e-9))


def _normal_tails(statistic: float, mean: float, std: float) -> tuple[float, float]:
  """(P(T ≤ t), P(T ≥ t)) by the normal approximation with a 0.5 continuity correction; both 1
  when the statistic cannot vary."""
  if std == 0:
    return 1.0, 1.0
  return (1.0 - _normal_sf((statistic + 0.5 - mean) / std),
          _normal_sf((statistic - 0.5 - mean) / std))


def _midranks(values: np.ndarray) -> np.ndarray:
  """Ranks 1..n with ties sharing the mean of their ranks."""
  order = np.argsort(values, kind="stable")
  ranks = np.empty(values.size)
  sorted_values = values[order]
  start = 0
  for end in range(1, values.size + 1):
    if end == values.size or sorted_values[end] != sorted_values[start]:
      ranks[order[start:end]] = 0.5 * (start + end - 1) + 1.0
      start = end
  return ranks


def _normal_sf(z: float) -> float:
  return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(x: np.ndarray, y: np.ndarray, alternative: str = "two-sided") -> MannWhitney:
  """Mann–Whitney U test of `x` against `y`.

      U = Σ_i Σ_j (1[x_i > y_j] + ½·1[x_i = y_j])

  "less" tests whether `x` tends to be smaller than `y` (small U). The p-value is exact, from the
  permutation distribution of U over every split of the pooled midranks (ties handled exactly),
  when there are at most 200 000 splits (e.g. 8 vs 8: 12 870); otherwise it is the normal
  approximation with tie-corrected variance and a 0.5 continuity correction. A two-sided p-value
  is twice the smaller one-sided one, capped at 1.

  Args:
    x: `[n1]` first sample.
    y: `[n2]` second sample.
    alternative: "two-sided", "less" or "greater".

  Returns:
    `MannWhitney(u, p_value, exact)`.
  """
  x, y = _samples(x, y, alternative)
  n1, n2 = x.size, y.size
  if n1 == 0 or n2 == 0:
    raise ValueError(f"both samples must be non-empty, got sizes {n1} and {n2}")
  ranks = _midranks(np.concatenate([x, y]))
  offset = n1 * (n1 + 1) / 2.0
  u = float(ranks[:n1].sum() - offset)

  exact = math.comb(n1 + n2, n1) <= _MAX_EXACT_SPLITS
  if exact:
    splits = np.fromiter(
        itertools.chain.from_iterable(itertools.combinations(range(n1 + n2), n1)),
        dtype=np.int64).reshape(-1, n1)
    null_u = ranks[splits].sum(axis=1) - offset
    p_less, p_greater = _exact_tails(null_u, u)
  else:
    mean = n1 * n2 / 2.0
    _, counts = np.unique(ranks, return_counts=True)
    n = n1 + n2
    tie_term = np.sum(counts**3 - counts) / (n * (n - 1))
    std = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    p_less, p_greater = _normal_tails(u, mean, std)
  return MannWhitney(u=u, p_value=_p_value(p_less, p_greater, alternative), exact=exact)


# Above this many non-zero pairs the exact sign-flip distribution gives way to the normal one.
_MAX_EXACT_PAIRS = 20


def wilcoxon_signed_rank(x: np.ndarray, y: np.ndarray,
                         alternative: str = "two-sided") -> SignedRank:
  """Wilcoxon signed-rank test of the paired differences `d = x − y`.

      W⁺ = Σ_{i: d_i > 0} rank(|d_i|)

  over the pairs with `d_i ≠ 0` (zero differences are dropped; tied |d| share their midrank).
  "greater" tests whether `x` tends to exceed its partner in `y` (large W⁺). The p-value is exact,
  from the 2^n equally likely sign assignments, for n ≤ 20; above that the normal approximation
  with tie-corrected variance and a 0.5 continuity correction. With no non-zero pair every
  p-value is 1.

  Args:
    x: `[n]` first sample.
    y: `[n]` its partners.
    alternative: "two-sided", "less" or "greater".

  Returns:
    `SignedRank(w, p_value, n)`.
  """
  x, y = _samples(x, y, alternative)
  if x.size != y.size or x.size == 0:
    raise ValueError(f"need two non-empty samples of one size, got {x.size} and {y.size}")
  d = x - y
  d = d[d != 0]
  n = d.size
  if n == 0:
    return SignedRank(w=0.0, p_value=1.0, n=0)
  ranks = _midranks(np.abs(d))
  w = float(ranks[d > 0].sum())
  if n <= _MAX_EXACT_PAIRS:
    signs = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    p_less, p_greater = _exact_tails(signs @ ranks, w)
  else:
    p_less, p_greater = _normal_tails(w, ranks.sum() / 2.0, math.sqrt(np.sum(ranks**2) / 4.0))
  return SignedRank(w=w, p_value=_p_value(p_less, p_greater, alternative), n=n)


def step_gap(steps_traj: np.ndarray, steps_turn: np.ndarray) -> StepGap:
  """Medians, their ratio and the one-sided rank test per density.

  Args:
    steps_traj: `[R, S]` updates to threshold of the trajectory-level estimator (S seeds).
    steps_turn: `[R, S']` the same for the turn-level estimator.

  Returns:
    `StepGap` of `[R]` arrays; the test is "turn-level steps are smaller" (alternative "less").
  """
  steps_traj, steps_turn = np.asarray(steps_traj), np.asarray(steps_turn)
  if steps_traj.ndim != 2 or steps_turn.ndim != 2 or steps_traj.shape[0] != steps_turn.shape[0]:
    raise ValueError(f"need [R, S] arrays with the same R, got {steps_traj.shape} and "
                     f"{steps_turn.shape}")
  median_traj = np.median(steps_traj, axis=1)
  median_turn = np.median(steps_turn, axis=1)
  p_value = np.array([mann_whitney_u(turn, traj, alternative="less").p_value
                      for turn, traj in zip(steps_turn, steps_traj)])
  return StepGap(median_traj=median_traj, median_turn=median_turn,
                 gap=median_traj / median_turn, p_value=p_value)
