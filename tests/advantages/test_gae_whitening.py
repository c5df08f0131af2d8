"""The `gae` estimator's advantage whitening (verl's convention): over the batch's valid action
tokens, mean 0 and unbiased std 1 with eps 1e-8; the returns stay unwhitened."""

import functools

import jax
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators


def _batch(seed, b=5, n=3, length=16, faulted_row=None):
  """Turns of 1–3 observation tokens then 1–3 action tokens; random turn rewards and values."""
  rng = np.random.RandomState(seed)
  traj = types.empty_trajectories(b, length, n)
  for i in range(b):
    pos = 0
    for k in range(rng.randint(1, n + 1)):
      obs, act = rng.randint(1, 4), rng.randint(1, 4)
      if pos + obs + act > length:
        break
      traj.turn_of_token[i, pos:pos + obs + act] = k
      traj.action_mask[i, pos + obs:pos + obs + act] = True
      traj.turn_start[i, k], traj.turn_end[i, k] = pos + obs, pos + obs + act
      traj.turn_mask[i, k] = traj.action_valid[i, k] = True
      traj.reward[i, k] = rng.randn()
      pos += obs + act
  traj.outcome[:] = traj.reward.sum(1)
  traj.group_id[:] = np.arange(b) // 2
  if faulted_row is not None:
    traj.env_error[faulted_row, 0] = True
  traj.validate()
  values = (2.0 + rng.randn(b, length)).astype(np.float32)
  return traj, values


def gae_reference(traj, values, gamma, lam):
  """NumPy loop: each turn's reward on its last action token, observation tokens skipped."""
  b, length = traj.action_mask.shape
  rewards = np.zeros((b, length))
  for i in range(b):
    for k in np.flatnonzero(traj.turn_mask[i]):
      rewards[i, traj.turn_end[i, k] - 1] += traj.reward[i, k]
  advantages = np.zeros((b, length))
  for i in range(b):
    next_value = last = 0.0
    for t in reversed(range(length)):
      if traj.action_mask[i, t]:
        last = rewards[i, t] + gamma * next_value - values[i, t] + gamma * lam * last
        next_value = values[i, t]
        advantages[i, t] = last
  valid = traj.action_mask & traj.valid_trajectory[:, None]
  returns = np.where(valid, advantages + values, 0.0)
  picked = advantages[valid]
  whitened = np.zeros((b, length))
  whitened[valid] = (picked - picked.mean()) / np.sqrt(picked.var(ddof=1) + 1e-8)
  return np.where(valid, advantages, 0.0), whitened, returns, valid


GAE = jax.jit(estimators.gae, static_argnames=("discount", "lambda_", "whiten"))


@pytest.mark.parametrize("seed,faulted_row", [(0, None), (1, 2)])
def test_whitened_advantages_match_numpy_and_returns_stay_raw(seed, faulted_row):
  traj, values = _batch(seed, faulted_row=faulted_row)
  raw, whitened, returns, valid = gae_reference(traj, values, 0.9, 0.8)
  out = GAE(traj, values, discount=0.9, lambda_=0.8)  # whitening is the default
  adv = np.asarray(out.advantages)
  np.testing.assert_allclose(adv, whitened, atol=2e-5)
  np.testing.assert_allclose(adv[valid].mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(adv[valid].std(ddof=1), 1.0, atol=1e-5)
  assert np.all(adv[~valid] == 0)  # observations, padding and the faulted row
  np.testing.assert_allclose(out.returns, returns, atol=1e-5)
  plain = GAE(traj, values, discount=0.9, lambda_=0.8, whiten=False)
  np.testing.assert_array_equal(plain.returns, out.returns)
  np.testing.assert_allclose(plain.advantages, raw, atol=1e-5)
  assert np.abs(raw[valid].mean()) > 0.1  # whitening moved something


def test_whitened_advantages_ignore_the_reward_scale():
  # Rewards and values scaled by s > 0 scale the raw advantages and the returns by s; whitening
  # divides the scale out again.
  traj, values = _batch(3)
  base = GAE(traj, values, discount=0.95, lambda_=0.9)
  scaled = traj.replace(reward=traj.reward * 7.0)
  out = GAE(scaled, values * 7.0, discount=0.95, lambda_=0.9)
  np.testing.assert_allclose(out.advantages, base.advantages, atol=1e-5)
  np.testing.assert_allclose(out.returns, 7.0 * np.asarray(base.returns), rtol=1e-5, atol=1e-4)


def test_gin_style_binding_turns_whitening_off():
  traj, values = _batch(4)
  bound = functools.partial(estimators.gae, whiten=False)
  spec = estimators.resolve(bound)
  assert spec.name == "gae" and spec.needs_critic
  _, _, _, valid = gae_reference(traj, values, 1.0, 1.0)
  adv = np.asarray(jax.jit(spec.fn)(traj, values).advantages)
  assert abs(adv[valid].mean()) > 0.1  # raw GAE, not mean 0
