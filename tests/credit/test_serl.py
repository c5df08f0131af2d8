"""Tests for agentrl_jax.credit.serl (docs/methods.md#serl)."""

import jax
import numpy as np
import pytest

from agentrl_jax.credit import serl

from credit_batches import Turn, make_batch, outcome_advantages, random_batch

CORRECT = jax.jit(serl.environment_reweighted_credit)


def with_teacher(traj, teacher, step=0, **extras):
  return traj.replace(extras={"teacher_logprob": np.asarray(teacher, np.float32),
                              "update_step": np.int32(step), **extras})


def test_hand_checked_weights():
  # Failed rows (outcome 0 < 1) get privileged context. Student logp −1 on every action token.
  # Row 0, A = +1, teacher −0.5: Δ = 0.5, w = clip(e^0.5 = 1.65, 0.8, 1.2) = 1.2;
  #   λ_eff = 0.5·(1 − 10/50) = 0.4 → factor 0.6 + 0.4·1.2 = 1.08.
  # Row 1, A = −1, teacher −0.5: sign·Δ = −0.5, w = clip(e^−0.5 = 0.61) = 0.8 → factor 0.92.
  # Row 2 succeeded (outcome 1): untouched.
  rows = [[Turn(act=(10, 11), logp=-1.0)], [Turn(act=(10, 11), logp=-1.0)],
          [Turn(act=(10, 11), logp=-1.0, reward=1.0)]]
  traj = make_batch(rows)
  teacher = np.where(traj.action_mask, -0.5, 0.0)
  a = outcome_advantages(traj, [1.0, -1.0, 0.5])
  out = np.asarray(CORRECT(with_teacher(traj, teacher, step=10), a))
  np.testing.assert_allclose(out[0][traj.action_mask[0]], 1.08, atol=1e-6)
  np.testing.assert_allclose(out[1][traj.action_mask[1]], -0.92, atol=1e-6)
  np.testing.assert_array_equal(out[2], a[2])


def test_identity_cases():
  rng = np.random.default_rng(0)
  traj = random_batch(rng, b=6)
  traj = traj.replace(outcome=np.zeros(6, np.float32))
  a = (rng.normal(size=traj.tokens.shape) * traj.action_mask).astype(np.float32)
  same = with_teacher(traj, traj.sample_logprob, step=0)
  np.testing.assert_allclose(CORRECT(same, a), a, atol=1e-6)             # teacher = student
  other = with_teacher(traj, traj.sample_logprob + 1.0, step=50)
  np.testing.assert_array_equal(CORRECT(other, a), a)                    # λ decayed to 0


def test_bounds_and_support():
  rng = np.random.default_rng(1)
  traj = random_batch(rng, b=6)
  traj = traj.replace(outcome=np.zeros(6, np.float32))
  a = (rng.normal(size=traj.tokens.shape) * traj.action_mask).astype(np.float32)
  teacher = rng.normal(size=a.shape).astype(np.float32) * 3
  span = traj.action_mask & (rng.random(a.shape) < 0.5)
  out = np.asarray(CORRECT(with_teacher(traj, teacher, step=5, action_span=span), a))
  lam = 0.5 * (1 - 5 / 50)
  nz = a != 0
  assert np.all(np.abs(out[nz] / a[nz] - 1) <= lam * 0.2 + 1e-6)
  assert np.all(np.sign(out) == np.sign(a))
  np.testing.assert_array_equal(out[~span], a[~span])


def test_missing_keys_and_validation():
  traj = make_batch([[Turn()]])
  a = outcome_advantages(traj, [1.0])
  with pytest.raises(ValueError, match=r"needs traj.extras\['teacher_logprob'\]"):
    serl.environment_reweighted_credit(traj, a)
  teacher_only = traj.replace(extras={"teacher_logprob": traj.sample_logprob})
  with pytest.raises(ValueError, match=r"needs traj.extras\['update_step'\]"):
    serl.environment_reweighted_credit(teacher_only, a)
  np.testing.assert_array_equal(serl.environment_reweighted_credit(teacher_only, a, decay_steps=0), a)
  with pytest.raises(ValueError, match="weight_clip must be in"):
    serl.environment_reweighted_credit(teacher_only, a, weight_clip=1.0)
