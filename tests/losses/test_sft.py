"""Tests of losses/sft.py: DRIFT's weights and loss, AHEAD's distillation advantage."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.losses import sft


def _reference_weights(returns, groups, beta, eps=1e-12):
  """NumPy loop of DRIFT's self-normalised weights."""
  w = np.zeros_like(returns, np.float64)
  for g in np.unique(groups):
    idx = groups == g
    z = returns[idx] / beta
    e = np.exp(z - z.max())
    w[idx] = e / (e.mean() + eps)
  return w


@pytest.mark.parametrize("beta", [0.1, 0.7, 5.0])
def test_importance_weights_match_reference_and_sum_to_one_per_group(beta):
  rng = np.random.default_rng(0)
  returns = rng.normal(size=12).astype(np.float32)
  groups = np.repeat(np.arange(3), 4).astype(np.int32)
  out = jax.jit(sft.importance_weights, static_argnums=(2, 3))(
      jnp.asarray(returns), jnp.asarray(groups), 3, beta)
  np.testing.assert_allclose(out.weights, _reference_weights(returns, groups, beta), rtol=1e-5)
  sums = np.bincount(groups, weights=np.asarray(out.probs))
  np.testing.assert_allclose(sums, np.ones(3), atol=1e-5)
  np.testing.assert_allclose(np.bincount(groups, weights=np.asarray(out.weights)) / 4, 1, atol=1e-5)


def test_equal_returns_give_uniform_weights_and_shift_invariance():
  groups = jnp.array([0, 0, 0, 1, 1], jnp.int32)
  out = sft.importance_weights(jnp.array([2.0, 2.0, 2.0, -1.0, -1.0]), groups, 2, 0.1)
  np.testing.assert_allclose(out.weights, np.ones(5), atol=1e-6)
  np.testing.assert_allclose(out.probs, [1 / 3] * 3 + [0.5] * 2, atol=1e-6)
  r = jnp.array([0.0, 1.0, 0.5, 0.3, 0.9])
  shifted = r + jnp.array([7.0, 7.0, 7.0, -3.0, -3.0])  # a constant per group
  np.testing.assert_allclose(sft.importance_weights(r, groups, 2, 0.5).weights,
                             sft.importance_weights(shifted, groups, 2, 0.5).weights, atol=1e-5)


def test_small_beta_puts_mass_on_best_shared_among_ties():
  # Group of four with two tied best returns: each gets probability 1/2, i.e. weight 2.
  out = sft.importance_weights(jnp.array([1.0, 0.0, 1.0, 0.2]), jnp.zeros(4, jnp.int32), 1, 1e-3)
  np.testing.assert_allclose(out.weights, [2.0, 0.0, 2.0, 0.0], atol=1e-5)


def test_importance_weights_reject_bad_beta():
  with pytest.raises(ValueError, match="beta"):
    sft.importance_weights(jnp.zeros(2), jnp.zeros(2, jnp.int32), 1, 0.0)


def test_repetition_penalty_hand_case():
  # Row 0: same observation on all 4 turns -> 0.5 * (1 - 1/4) = 0.375 (DRIFT unit test 4).
  # Row 1: hashes 1, 2, 1 on 3 turns, 4th turn missing -> 0.5 * (1 - 2/3) = 1/6.
  keys = jnp.array([[5, 5, 5, 5], [1, 2, 1, 9]], jnp.int32)
  mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
  np.testing.assert_allclose(sft.repetition_penalty(keys, mask, 0.5), [0.375, 1 / 6], atol=1e-6)


def test_discounted_turn_return_hand_case():
  # 1 + 0.9*0 + 0.81*2 = 2.62; the masked last turn's reward is ignored.
  out = sft.discounted_turn_return(jnp.array([[1.0, 0.0, 2.0, 5.0]]),
                                   jnp.array([[1, 1, 1, 0]], bool), 0.9)
  np.testing.assert_allclose(out, [2.62], atol=1e-6)


def test_weighted_sft_loss_hand_case_and_gradient_ignores_weights():
  logp = jnp.log(jnp.array([[0.5, 0.25], [0.5, 1.0]]))
  mask = jnp.array([[1, 1], [1, 0]], bool)
  w = jnp.array([2.0, 1.0])
  # Row NLLs: (ln2 + ln4)/2 = 1.5 ln2 and ln2; mean(w*l) = (3 ln2 + ln2)/2 = 2 ln2.
  np.testing.assert_allclose(sft.weighted_sft_loss(logp, mask, w), 2 * np.log(2), rtol=1e-6)
  # Normalised by Σw = 3: 4 ln2 / 3.
  np.testing.assert_allclose(sft.weighted_sft_loss(logp, mask, w, normalize_by_weight_sum=True),
                             4 * np.log(2) / 3, rtol=1e-6)
  grad_w = jax.grad(lambda w: sft.weighted_sft_loss(logp, mask, w))(w)
  np.testing.assert_allclose(grad_w, 0.0)


def _distill_inputs(seed=0, shape=(3, 6)):
  rng = np.random.default_rng(seed)
  adv = rng.normal(size=shape).astype(np.float32)
  student = np.log(rng.uniform(0.05, 1, size=shape)).astype(np.float32)
  teacher = np.log(rng.uniform(0.05, 1, size=shape)).astype(np.float32)
  mask = rng.random(shape) < 0.7
  err = rng.random(shape) < 0.4
  return adv, teacher, student, mask, err


def test_distillation_identity_when_teacher_equals_student():
  adv, _, student, mask, err = _distill_inputs()
  for mode in ("additive", "sign_preserving"):
    out = sft.distillation_advantages(adv, student, student, mask, err, mode=mode)
    np.testing.assert_allclose(out, adv, atol=1e-6)


@pytest.mark.parametrize("mode", ["additive", "sign_preserving"])
def test_distillation_matches_reference_bounded_and_keeps_unmasked(mode):
  adv, teacher, student, mask, err = _distill_inputs(1)
  coef, dmax, nu_e, nu_r = 0.3, 0.5, 1.0, 0.5
  out = np.asarray(jax.jit(lambda *a: sft.distillation_advantages(
      *a, coef=coef, delta_max=dmax, nu_err=nu_e, nu_rout=nu_r, mode=mode))(
          adv, teacher, student, mask, err))
  ref = adv.copy()
  for i, j in np.ndindex(adv.shape):
    if mask[i, j]:
      d = min(max(teacher[i, j] - student[i, j], -dmax), dmax)
      nu = nu_e if err[i, j] else nu_r
      ref[i, j] = adv[i, j] + coef * nu * d if mode == "additive" else adv[i, j] * (
          1 + coef * nu * d * np.sign(adv[i, j]))
  np.testing.assert_allclose(out, ref, atol=1e-5)
  if mode == "additive":
    assert np.all(np.abs(out - adv) <= coef * max(nu_e, nu_r) * dmax + 1e-6)
  else:
    assert np.all(np.sign(out) == np.sign(adv))


def test_distillation_gradient_stops_at_student():
  adv, teacher, student, mask, err = _distill_inputs(2)
  g = jax.grad(lambda s: jnp.sum(sft.distillation_advantages(adv, teacher, s, mask, err)))(student)
  chex.assert_trees_all_close(g, jnp.zeros_like(g))


def test_distillation_rejects_bad_mode():
  adv, teacher, student, mask, err = _distill_inputs()
  with pytest.raises(ValueError, match="mode"):
    sft.distillation_advantages(adv, teacher, student, mask, err, mode="other")
