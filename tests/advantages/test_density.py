"""Tests for agentrl_jax.advantages.density."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import density

SNR = jax.jit(density.gradient_snr)


def test_snr_hand_checked():
  # Samples [1, 1] and [3, 1]: mean [2, 1], ‖ḡ‖² = 5; variances (ddof 1) [2, 0] -> v = 2.
  # S² = 5 − 2/2 = 4, SNR = 2/√2 = √2.
  out = SNR(jnp.array([[1.0, 1.0], [3.0, 1.0]]))
  np.testing.assert_allclose(out.signal, 4.0, rtol=1e-6)
  np.testing.assert_allclose(out.noise, 2.0, rtol=1e-6)
  np.testing.assert_allclose(out.snr, 2**0.5, rtol=1e-6)


def test_snr_scale_invariant_pytree_and_numpy_reference():
  rng = np.random.RandomState(0)
  g = (0.3 + rng.randn(50, 7)).astype(np.float32)
  out = SNR(g)
  mean, v = g.astype(np.float64).mean(0), g.astype(np.float64).var(0, ddof=1).sum()
  np.testing.assert_allclose(out.snr, np.sqrt(max(mean @ mean - v / 50, 1e-38) / v), rtol=1e-4)
  np.testing.assert_allclose(SNR(-4.0 * g).snr, out.snr, rtol=1e-5)
  tree = {"w": g[:, :4].reshape(50, 2, 2), "b": g[:, 4:]}
  np.testing.assert_allclose(SNR(tree).snr, out.snr, rtol=1e-5)
  # Pure noise: the bias-corrected signal is floored, not negative.
  assert SNR(rng.randn(4, 3).astype(np.float32)).signal > 0
  with pytest.raises(ValueError, match="at least 2"):
    density.gradient_snr(g[:1])


def test_snr_ratio_bootstrap():
  rng = np.random.RandomState(1)
  noise = rng.randn(40, 5).astype(np.float32)
  strong, weak = 1.0 + noise, 0.2 + noise
  ratio = jax.jit(density.gradient_snr_ratio, static_argnames="num_resamples")
  out = ratio(jax.random.key(0), strong, weak, num_resamples=50)
  want = SNR(strong).snr / SNR(weak).snr
  np.testing.assert_allclose(out.ratio, want, rtol=1e-5)
  assert out.low <= out.ratio <= out.high and out.ratio > 1
  same = ratio(jax.random.key(1), strong, strong, num_resamples=50)
  np.testing.assert_allclose([same.ratio, same.low, same.high], 1.0, rtol=1e-6)


def test_decision_density_hand_checked():
  # |Q − V| = [[0.5, 0.05, 2], [0.2, 0.0, ·]] with τ = 0.1; row 1 has two turns.
  # Decisions: row 0 {0, 2}, row 1 {0}: ρ̂ = 3/5; per row [2/3, 1/2].
  q = jnp.array([[1.5, 0.05, -2.0], [0.2, 1.0, 9.0]])
  v = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
  out = jax.jit(density.decision_density, static_argnames="threshold")(q, v, mask, threshold=0.1)
  np.testing.assert_allclose(out.density, 0.6, rtol=1e-6)
  np.testing.assert_allclose(out.per_trajectory, [2 / 3, 0.5], rtol=1e-6)
  np.testing.assert_array_equal(out.decisions, [[1, 0, 1], [1, 0, 0]])
  with pytest.raises(ValueError, match="threshold"):
    density.decision_density(q, v, mask, -1.0)
