"""Intervals for success rates measured on a finite set of held-out tasks.

A held-out evaluation plays n tasks and counts k successes, so its uncertainty is binomial: the
exact Clopper–Pearson interval for one rate, and Newcombe's score interval for the difference
of two rates (after training minus before, each on its own n tasks). Standard library only.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

_BISECTION_STEPS = 60  # halves [0, 1] to below 1e-18: exact to float precision


class Interval(NamedTuple):
  low: float
  high: float


def _log_pmf(i: int, n: int, p: float) -> float:
  if p <= 0.0:
    return 0.0 if i == 0 else -math.inf
  if p >= 1.0:
    return 0.0 if i == n else -math.inf
  return (math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
          + i * math.log(p) + (n - i) * math.log1p(-p))


def binomial_cdf(k: int, n: int, p: float) -> float:
  """P(X ≤ k) for X ~ Binomial(n, p), summed in log space (n up to ~10^5 is fast enough)."""
  if k < 0:
    return 0.0
  if k >= n:
    return 1.0
  return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def _solve_decreasing(f, target: float) -> float:
  """The p in [0, 1] where the decreasing function f(p) crosses `target` (bisection)."""
  lo, hi = 0.0, 1.0
  for _ in range(_BISECTION_STEPS):
    mid = 0.5 * (lo + hi)
    if f(mid) > target:
      lo = mid
    else:
      hi = mid
  return 0.5 * (lo + hi)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Interval:
  """Exact two-sided interval for a binomial rate from k successes in n trials.

  The lower end solves P(X ≥ k | p) = α/2 (0 when k = 0), the upper end P(X ≤ k | p) = α/2
  (1 when k = n); it covers the true rate with probability at least `confidence`.
  """
  _check_counts(k, n)
  alpha = 1.0 - confidence
  low = 0.0 if k == 0 else _solve_decreasing(lambda p: binomial_cdf(k - 1, n, p), 1 - alpha / 2)
  high = 1.0 if k == n else _solve_decreasing(lambda p: binomial_cdf(k, n, p), alpha / 2)
  return Interval(low, high)


def wilson(k: int, n: int, confidence: float = 0.95) -> Interval:
  """Wilson's score interval for a binomial rate (the pieces of Newcombe's difference)."""
  _check_counts(k, n)
  z = _normal_quantile(0.5 + confidence / 2)
  p = k / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return Interval(max(0.0, centre - half), min(1.0, centre + half))


def newcombe_difference(k1: int, n1: int, k0: int, n0: int,
                        confidence: float = 0.95) -> Interval:
  """Interval for p1 − p0 from two independent binomial counts (Newcombe's method 10).

  Combines each rate's Wilson interval; unlike the Wald interval it keeps its coverage when a
  rate is 0 or 1, which a held-out success before training often is.
  """
  l1, u1 = wilson(k1, n1, confidence)
  l0, u0 = wilson(k0, n0, confidence)
  p1, p0 = k1 / n1, k0 / n0
  d = p1 - p0
  return Interval(d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2),
                  d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2))


def successes(rate: float, n: int) -> int:
  """The count behind a rate reported over n tasks (rates are stored as floats)."""
  k = round(rate * n)
  if abs(k - rate * n) > 1e-3 or not 0 <= k <= n:  # float32 means are within 1e-5 of a count
    raise ValueError(f"rate {rate!r} is not a count out of {n} tasks")
  return int(k)


def _normal_quantile(q: float) -> float:
  """Φ^{-1}(q), from the standard library."""
  return statistics.NormalDist().inv_cdf(q)


def _check_counts(k: int, n: int) -> None:
  if n <= 0 or not 0 <= k <= n:
    raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
