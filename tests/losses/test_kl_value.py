"""Tests for agentrl_jax.losses.kl and agentrl_jax.losses.value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.losses import kl
from agentrl_jax.losses import value

KL = jax.jit(kl.kl_penalty, static_argnames="kind")


def test_kl_estimators_hand_checked():
  # x = logp − ref = [0.5, −1]: k1 = x; abs = |x|; k2 = x²/2 = [0.125, 0.5];
  # k3 = e^{−x} + x − 1 = [e^{−0.5} − 0.5, e − 2].
  logp = jnp.array([0.5, -1.0])
  ref = jnp.zeros(2)
  np.testing.assert_allclose(KL(logp, ref, "k1"), [0.5, -1.0])
  np.testing.assert_allclose(KL(logp, ref, "abs"), [0.5, 1.0])
  np.testing.assert_allclose(KL(logp, ref, "k2"), [0.125, 0.5])
  k3 = [np.exp(-0.5) - 0.5, np.e - 2.0]
  np.testing.assert_allclose(KL(logp, ref, "low_var_kl"), k3, rtol=1e-6)
  np.testing.assert_allclose(KL(logp, ref, "k3+"), k3, rtol=1e-6)
  with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
    kl.kl_penalty(logp, ref, "k4")


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_k3_non_negative_zero_iff_equal_and_clamped(jit):
  rng = np.random.RandomState(0)
  logp = (5.0 * rng.randn(4, 16)).astype(np.float32)
  ref = (5.0 * rng.randn(4, 16)).astype(np.float32)
  fn = jax.jit(kl.kl_penalty, static_argnums=2) if jit else kl.kl_penalty
  k3 = np.asarray(fn(logp, ref, "k3"))
  assert np.all(k3 >= 0) and np.all(k3 > 0) and np.all(k3 <= 10)
  np.testing.assert_array_equal(fn(logp, logp, "k3"), 0.0)
  # NumPy reference with the two clamps; atol covers float32 cancellation in e^{−x} + x − 1.
  neg = np.clip(ref.astype(np.float64) - logp, -20, 20)
  np.testing.assert_allclose(k3, np.clip(np.exp(neg) - neg - 1, -10, 10), atol=1e-5)


def test_k3_plus_has_k2_gradient():
  logp = jnp.array([0.3, -0.7, 1.5])
  ref = jnp.array([0.1, 0.2, -0.4])
  grad_plus = jax.jit(jax.grad(lambda lp: kl.kl_penalty(lp, ref, "k3+").sum()))(logp)
  grad_k2 = jax.jit(jax.grad(lambda lp: kl.kl_penalty(lp, ref, "k2").sum()))(logp)
  np.testing.assert_allclose(grad_plus, grad_k2, rtol=1e-6)
  np.testing.assert_allclose(grad_k2, logp - ref, rtol=1e-6)
  # No gradient reaches the reference.
  np.testing.assert_array_equal(
      jax.jit(jax.grad(lambda r: kl.kl_penalty(logp, r, "k3").sum()))(ref), 0.0)


def test_kl_penalized_rewards():
  # Token 1: r = 1, x = logp − ref = 0.5 -> 1 − 0.1·0.5 = 0.95. Token 0 is not an action token.
  out = jax.jit(kl.kl_penalized_rewards, static_argnames="kind")(
      jnp.array([[2.0, 1.0]]), jnp.array([[0.3, 0.5]]), jnp.zeros((1, 2)),
      jnp.array([[False, True]]), 0.1)
  np.testing.assert_allclose(out, [[2.0, 0.95]], rtol=1e-6)


def value_loss_loop(v, old, ret, mask, eps):
  terms = []
  for i in np.ndindex(v.shape):
    if mask[i]:
      clipped = min(max(v[i], old[i] - eps), old[i] + eps)
      terms.append(max((v[i] - ret[i]) ** 2, (clipped - ret[i]) ** 2))
  return 0.5 * np.mean(terms)


def test_value_loss_hand_checked():
  # Token 0: V 1.0, old 0, ret 2: V_clip 0.5; max(1, 2.25) = 2.25 (clipped term wins).
  # Token 1: V 0.2, old 0, ret 0: V_clip 0.2; max(0.04, 0.04) = 0.04. Loss 0.5·(2.29/2).
  out = jax.jit(value.clipped_value_loss)(jnp.array([[1.0, 0.2, 7.0]]), jnp.zeros((1, 3)),
                                 jnp.array([[2.0, 0.0, 0.0]]), jnp.array([[1, 1, 0]], bool))
  np.testing.assert_allclose(out.loss, 0.5 * 2.29 / 2, rtol=1e-6)
  np.testing.assert_allclose(out.clip_fraction, 0.5)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_value_loss_against_loop_and_gradient(jit):
  rng = np.random.RandomState(1)
  v, old, ret = (rng.randn(3, 5).astype(np.float32) for _ in range(3))
  mask = rng.rand(3, 5) > 0.3
  fn = jax.jit(value.clipped_value_loss) if jit else value.clipped_value_loss
  np.testing.assert_allclose(fn(v, old, ret, mask).loss, value_loss_loop(v, old, ret, mask, 0.5),
                             rtol=1e-5)
  # Where the clipped term wins and V is outside the clip range, the gradient is 0.
  grad = jax.jit(jax.grad(lambda x: value.clipped_value_loss(x, old, ret, mask).loss))(v)
  clipped_v = np.clip(v, old - 0.5, old + 0.5)
  frozen = mask & ((clipped_v - ret) ** 2 > (v - ret) ** 2) & (np.abs(v - old) > 0.5)
  np.testing.assert_array_equal(np.asarray(grad)[frozen], 0.0)
  assert np.all(np.asarray(grad)[~mask] == 0)
