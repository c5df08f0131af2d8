"""Tests for agentrl_jax.advantages.whiten."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import whiten


def test_hand_checked_moments():
  # Masked entries 1, 2, 6: mean 3, unbiased variance ((−2)² + (−1)² + 3²) / 2 = 7.
  x = jnp.array([[1.0, 100.0, 2.0], [6.0, -50.0, 0.0]])
  mask = jnp.array([[1, 0, 1], [1, 0, 0]], bool)
  np.testing.assert_allclose(whiten.masked_mean(x, mask), 3.0)
  np.testing.assert_allclose(whiten.masked_variance(x, mask), 7.0)
  np.testing.assert_allclose(whiten.masked_variance(x, mask, unbiased=False), 14.0 / 3)
  np.testing.assert_allclose(whiten.masked_mean(x, mask, axis=1), [1.5, 6.0])
  out = whiten.masked_whiten(x, mask)
  np.testing.assert_allclose(out, [[-2 / 7**0.5, 0, -1 / 7**0.5], [3 / 7**0.5, 0, 0]], rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_whitened_mean_zero_variance_one_against_numpy(jit):
  rng = np.random.RandomState(0)
  x = (3.0 + 2.0 * rng.randn(4, 7)).astype(np.float32)
  mask = rng.rand(4, 7) > 0.3
  fn = jax.jit(whiten.masked_whiten, static_argnums=2) if jit else whiten.masked_whiten
  out = np.asarray(fn(x, mask, True))
  selected = x[mask].astype(np.float64)
  want = (selected - selected.mean()) / np.sqrt(selected.var(ddof=1) + 1e-8)
  np.testing.assert_allclose(out[mask], want, atol=1e-5)
  assert np.all(out[~mask] == 0)
  np.testing.assert_allclose(out[mask].mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(out[mask].var(ddof=1), 1.0, atol=1e-5)
  scaled_only = np.asarray(fn(x, mask, False))
  np.testing.assert_allclose(scaled_only[mask], want + selected.mean(), atol=1e-5)


def test_degenerate_masks_give_finite_output():
  x = jnp.array([[1.0, 2.0]])
  assert np.all(np.isfinite(whiten.masked_whiten(x, jnp.array([[True, False]]))))
  assert np.all(np.asarray(whiten.masked_whiten(x, jnp.zeros((1, 2), bool))) == 0)
