"""Tests of the binomial intervals the run summaries report."""

import math

import pytest

from agentrl_jax.studies import binomial


@pytest.mark.parametrize("k,n", [(0, 200), (1, 200), (77, 200), (199, 200), (200, 200), (3, 7)])
def test_clopper_pearson_ends_solve_the_tail_equations(k, n):
  low, high = binomial.clopper_pearson(k, n)
  if k > 0:  # P(X >= k | low) = 0.025
    assert 1 - binomial.binomial_cdf(k - 1, n, low) == pytest.approx(0.025, abs=1e-9)
  else:
    assert low == 0.0
  if k < n:  # P(X <= k | high) = 0.025
    assert binomial.binomial_cdf(k, n, high) == pytest.approx(0.025, abs=1e-9)
  else:
    assert high == 1.0
  assert low <= k / n <= high


def test_clopper_pearson_matches_scipy_beta_quantiles():
  stats = pytest.importorskip("scipy.stats")
  for k, n in [(1, 50), (77, 200), (12, 40), (49, 50)]:
    low, high = binomial.clopper_pearson(k, n)
    assert low == pytest.approx(stats.beta.ppf(0.025, k, n - k + 1), abs=1e-9)
    assert high == pytest.approx(stats.beta.ppf(0.975, k + 1, n - k), abs=1e-9)


def test_zero_successes_upper_end_is_the_closed_form():
  # P(X = 0 | p) = (1 - p)^n = 0.025.
  assert binomial.clopper_pearson(0, 200).high == pytest.approx(1 - 0.025 ** (1 / 200), abs=1e-12)


@pytest.mark.parametrize("k1,n1,k0,n0,expected", [
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10.
    (56, 70, 48, 80, (0.0524, 0.3339)),
    (9, 10, 3, 10, (0.1705, 0.8090)),
    (5, 56, 0, 29, (-0.0381, 0.1926)),
])
def test_newcombe_difference_reproduces_the_published_table(k1, n1, k0, n0, expected):
  low, high = binomial.newcombe_difference(k1, n1, k0, n0)
  assert (round(low, 4), round(high, 4)) == expected


def test_wilson_uses_the_normal_quantile():
  assert binomial._normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)
  low, high = binomial.wilson(50, 100)
  half = 1.959964 * math.sqrt(0.25 / 100 + 1.959964 ** 2 / 40000) / (1 + 1.959964 ** 2 / 100)
  assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)


def test_successes_recovers_the_count_and_rejects_non_counts():
  assert binomial.successes(0.385, 200) == 77
  assert binomial.successes(0.0, 40) == 0
  with pytest.raises(ValueError, match="not a count out of 200"):
    binomial.successes(0.3851, 200)
  with pytest.raises(ValueError, match="k <= n"):
    binomial.clopper_pearson(5, 4)
