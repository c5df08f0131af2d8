"""GAE against the installed rlax package, on the all-policy-token case."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

from agentrl_jax.advantages import gae

OURS = jax.jit(gae.generalized_advantage_estimation, static_argnames="method")
RLAX_GAE = jax.jit(jax.vmap(rlax.truncated_generalized_advantage_estimation,
                            in_axes=(0, 0, None, 0)))


@pytest.mark.parametrize("method", ["scan", "associative", "blocked"])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)])
def test_matches_rlax_truncated_gae(method, gamma, lam):
  if method == "blocked" and lam == 0.0:
    pytest.skip("λ = 0 is outside the blocked method's domain (test_gae covers the error)")
  rng = np.random.RandomState(0)
  b, t_len = 4, 75
  rewards = rng.randn(b, t_len).astype(np.float32)
  values = rng.randn(b, t_len).astype(np.float32)
  # γ and λ stay Python scalars (static), as the blocked method needs.
  ours = jax.jit(functools.partial(gae.generalized_advantage_estimation, discount=gamma,
                                   lambda_=lam, method=method))(
                                       rewards, values, np.ones((b, t_len), bool))
  # rlax time ranges: r_t and discount_t span [1, T], values span [0, T] with a bootstrap V_T.
  # Ours bootstraps from 0 after the last token, so V_T = 0.
  bootstrapped = jnp.concatenate([values, jnp.zeros((b, 1), jnp.float32)], axis=1)
  discounts = jnp.full((b, t_len), gamma, jnp.float32)
  theirs = RLAX_GAE(rewards, discounts, lam, bootstrapped)
  np.testing.assert_allclose(ours.advantages, theirs, atol=1e-5)
  np.testing.assert_allclose(ours.returns, theirs + values, atol=1e-5)


def test_matches_rlax_with_termination():
  # Termination through discount_t = γ(1 − done_t), the rlax convention.
  rng = np.random.RandomState(1)
  rewards = rng.randn(2, 8).astype(np.float32)
  values = rng.randn(2, 8).astype(np.float32)
  done = np.zeros((2, 8), bool)
  done[0, 3] = done[1, 5] = True
  discount = (0.97 * ~done).astype(np.float32)
  ours = OURS(rewards, values, np.ones((2, 8), bool), discount, 0.9)
  bootstrapped = np.concatenate([values, np.zeros((2, 1), np.float32)], axis=1)
  theirs = RLAX_GAE(rewards, discount, 0.9, bootstrapped)
  np.testing.assert_allclose(ours.advantages, theirs, atol=1e-5)


@pytest.mark.parametrize("method", ["blocked", "auto", "scan"])
def test_matches_rlax_with_random_done_flags(method):
  # Episodes ending mid-row: 2% done flags (plus consecutive ones) over rows of 8·16 + 5 steps.
  # "blocked" is the per-step-discount kernel (static λ); "auto" takes the scan at this size.
  rng = np.random.RandomState(2)
  b, t_len = 6, 8 * 16 + 5
  rewards = rng.randn(b, t_len).astype(np.float32)
  values = rng.randn(b, t_len).astype(np.float32)
  done = rng.rand(b, t_len) < 0.02
  done[0, 7:9] = done[1, 64:72] = True
  discount = (0.99 * ~done).astype(np.float32)
  ours = jax.jit(functools.partial(gae.generalized_advantage_estimation, lambda_=0.95,
                                   method=method))(rewards, values, np.ones((b, t_len), bool),
                                                   discount)
  bootstrapped = np.concatenate([values, np.zeros((b, 1), np.float32)], axis=1)
  theirs = RLAX_GAE(rewards, discount, 0.95, bootstrapped)
  np.testing.assert_allclose(ours.advantages, theirs, atol=1e-5)
  np.testing.assert_allclose(ours.returns, theirs + values, atol=1e-5)
