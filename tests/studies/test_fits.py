"""Tests for agentrl_jax.studies.fits."""

import numpy as np
import pytest

from agentrl_jax.studies import fits


def test_loglog_fit_hand_checked():
  # log x = [0, 1, 2], log y = [0, 2, 1]: dx = [-1, 0, 1], dy = [-1, 1, 0] -> slope = 1/2,
  # intercept = 1 − ½·1 = ½; residuals [-½, 1, -½]: SS_res = 1.5, SS_tot = 2 -> R² = 0.25.
  fit = fits.loglog_fit(np.exp([0.0, 1.0, 2.0]), np.exp([0.0, 2.0, 1.0]))
  np.testing.assert_allclose([fit.slope, fit.intercept, fit.r2], [0.5, 0.5, 0.25], rtol=1e-12)


def test_loglog_fit_power_law_and_batch():
  x = np.array([1 / 64, 1 / 8, 1 / 2, 1.0])
  y = np.stack([3.0 * x**-0.5, 2.0 * x**0.3])
  fit = fits.loglog_fit(x, y)
  np.testing.assert_allclose(fit.slope, [-0.5, 0.3], rtol=1e-12)
  np.testing.assert_allclose(fit.intercept, np.log([3.0, 2.0]), rtol=1e-12)
  np.testing.assert_allclose(fit.r2, 1.0)
  with pytest.raises(ValueError, match="positive"):
    fits.loglog_fit(x, -y)
  with pytest.raises(ValueError, match="distinct"):
    fits.loglog_fit(np.ones(3), np.ones(3))


def test_percentile_interval():
  samples = np.arange(101.0)
  np.testing.assert_allclose(fits.percentile_interval(samples, 0.9), [5.0, 95.0])
  both = fits.percentile_interval(np.stack([samples, 2 * samples], axis=1), 0.9)
  np.testing.assert_allclose(both, [[5.0, 95.0], [10.0, 190.0]])


def test_mann_whitney_hand_checked():
  # x = [1, 2] below y = [3, 4]: U = 0, the smallest of the C(4, 2) = 6 splits -> p_less = 1/6.
  out = fits.mann_whitney_u([1, 2], [3, 4], "less")
  assert out.exact and out.u == 0.0
  np.testing.assert_allclose(out.p_value, 1 / 6)
  np.testing.assert_allclose(fits.mann_whitney_u([1, 2], [3, 4]).p_value, 1 / 3)
  np.testing.assert_allclose(fits.mann_whitney_u([1, 2], [3, 4], "greater").p_value, 1.0)
  # Ties: pooled [1, 1, 1, 2] has midranks [2, 2, 2, 4]; x = [1, 1] sums to 4 -> U = 4 − 3 = 1.
  # Splits: three pairs of 2s (U = 1) and three pairs with the 4 (U = 3) -> p_less = 3/6.
  out = fits.mann_whitney_u([1, 1], [1, 2], "less")
  assert out.u == 1.0
  np.testing.assert_allclose(out.p_value, 0.5)
  with pytest.raises(ValueError, match="alternative"):
    fits.mann_whitney_u([1], [2], "lower")


def test_mann_whitney_vs_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.RandomState(0)
  x, y = rng.randn(8), rng.randn(8) + 0.8
  for alternative in ("less", "greater", "two-sided"):
    want = stats.mannwhitneyu(x, y, alternative=alternative, method="exact")
    got = fits.mann_whitney_u(x, y, alternative)
    assert got.exact
    np.testing.assert_allclose([got.u, got.p_value], [want.statistic, want.pvalue], rtol=1e-9)
  # Large samples with ties take the normal approximation.
  x, y = rng.randint(0, 20, 40), rng.randint(3, 23, 45)
  for alternative in ("less", "greater", "two-sided"):
    want = stats.mannwhitneyu(x, y, alternative=alternative, method="asymptotic")
    got = fits.mann_whitney_u(x, y, alternative)
    assert not got.exact
    np.testing.assert_allclose([got.u, got.p_value], [want.statistic, want.pvalue], rtol=1e-9)


def test_step_gap():
  traj = np.array([[10, 12, 14], [40, 50, 60]])
  turn = np.array([[11, 12, 13], [10, 12, 14]])
  out = fits.step_gap(traj, turn)
  np.testing.assert_allclose(out.median_traj, [12, 50])
  np.testing.assert_allclose(out.gap, [1.0, 50 / 12])
  # Row 1 separates completely: 1 of C(6, 3) = 20 splits -> p = 0.05.
  np.testing.assert_allclose(out.p_value[1], 1 / 20)
  assert out.p_value[0] > 0.3


def test_mean_confidence_band_hand_checked():
  # [1, 2, 3]: mean 2, s = 1, t_{0.975, 2} = 4.303 -> half-width 4.303/√3 ≈ 2.4843.
  mean, low, high = fits.mean_confidence_band(np.array([[1.0], [2.0], [3.0]]))
  np.testing.assert_allclose([mean[0], low[0], high[0]],
                             [2.0, 2.0 - 4.303 / 3**0.5, 2.0 + 4.303 / 3**0.5])
  mean, low, high = fits.mean_confidence_band(np.array([0.5]))
  assert mean == 0.5 and np.isnan(low) and np.isnan(high)


def test_t_quantile_vs_scipy():
  stats = pytest.importorskip("scipy.stats")
  for df in (1, 2, 7, 30, 31, 60, 500):
    np.testing.assert_allclose(fits.t_quantile_975(df), stats.t.ppf(0.975, df), rtol=2e-3)


def test_wilcoxon_signed_rank_hand_checked():
  # d = [+1, +2, -3, 0, +4]: the zero is dropped; ranks of |d| = 1, 2, 3, 4; W+ = 1 + 2 + 4 = 7.
  # Under the null W+ is the sum of a random subset of {1, 2, 3, 4}; the subsets summing to >= 7
  # are {3,4}, {1,2,4}, {1,3,4}, {2,3,4}, {1,2,3,4}: p = 5/16.
  out = fits.wilcoxon_signed_rank([2, 3, 0, 5, 6], [1, 1, 3, 5, 2], "greater")
  assert (out.w, out.n) == (7.0, 4)
  assert out.p_value == 5 / 16
  # All differences positive over 5 pairs: the smallest one-sided p, 1/32.
  assert fits.wilcoxon_signed_rank([2, 3, 4, 5, 6], [1, 1, 1, 1, 1], "greater").p_value == 1 / 32
  assert fits.wilcoxon_signed_rank([1, 1], [1, 1], "less") == fits.SignedRank(0.0, 1.0, 0)
  with pytest.raises(ValueError, match="one size"):
    fits.wilcoxon_signed_rank([1, 2], [1])


def test_wilcoxon_signed_rank_vs_scipy():
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.RandomState(1)
  x, y = rng.randn(12), rng.randn(12) + 0.5
  for alternative in ("less", "greater", "two-sided"):
    want = stats.wilcoxon(x, y, alternative=alternative, method="exact")
    got = fits.wilcoxon_signed_rank(x, y, alternative)
    np.testing.assert_allclose(got.p_value, want.pvalue, rtol=1e-9)
  # scipy reports min(W+, W-) for two-sided, W+ for one-sided.
  want = stats.wilcoxon(x, y, alternative="greater", method="exact")
  assert fits.wilcoxon_signed_rank(x, y, "greater").w == pytest.approx(want.statistic)
  x, y = rng.randn(30), rng.randn(30) + 0.3
  for alternative in ("less", "greater", "two-sided"):
    want = stats.wilcoxon(x, y, alternative=alternative, method="approx", correction=True)
    got = fits.wilcoxon_signed_rank(x, y, alternative)
    np.testing.assert_allclose(got.p_value, want.pvalue, rtol=1e-9)
