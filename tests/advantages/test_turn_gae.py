"""Tests of turn-level GAE with a learned critic (`estimators.turn_gae`)."""

import jax
import numpy as np
import pytest

from agentrl_jax.advantages import estimators
from tests.advantages.test_estimators import TURNS, REWARDS, make_trajectories

TURN_GAE = jax.jit(estimators.turn_gae, static_argnames=("discount", "lambda_", "whiten"))


def numpy_reference(traj, values, discount, lambda_):
  """Per-turn values (mean over the turn's action tokens), then the reverse GAE loop."""
  b, n = traj.turn_mask.shape
  adv = np.zeros((b, n)); ret = np.zeros((b, n))
  for i in range(b):
    turns = [k for k in range(n) if traj.turn_mask[i, k]]
    v = {k: values[i, traj.turn_start[i, k]:traj.turn_end[i, k]].mean() for k in turns}
    last = 0.0
    for j, k in reversed(list(enumerate(turns))):
      v_next = v[turns[j + 1]] if j + 1 < len(turns) else 0.0
      delta = traj.reward[i, k] + discount * v_next - v[k]
      last = delta + discount * lambda_ * last
      adv[i, k], ret[i, k] = last, last + v[k]
  return adv, ret


def per_token(traj, turn_values):
  out = np.zeros(traj.action_mask.shape)
  for i in range(out.shape[0]):
    for k in range(traj.turn_mask.shape[1]):
      if traj.turn_mask[i, k]:
        out[i, traj.turn_start[i, k]:traj.turn_end[i, k]] = turn_values[i, k]
  return out


@pytest.mark.parametrize("discount,lambda_", [(1.0, 1.0), (0.9, 0.8), (0.99, 0.0)])
def test_matches_the_numpy_loop_on_every_action_token(discount, lambda_):
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1])
  values = np.random.default_rng(0).normal(size=traj.action_mask.shape).astype(np.float32)
  out = TURN_GAE(traj, values, discount=discount, lambda_=lambda_, whiten=False)
  adv, ret = numpy_reference(traj, values, discount, lambda_)
  np.testing.assert_allclose(out.advantages, per_token(traj, adv), atol=1e-5)
  np.testing.assert_allclose(out.returns, per_token(traj, ret), atol=1e-5)


def test_tokens_of_one_turn_share_its_advantage_and_padding_is_zero():
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1])
  values = np.random.default_rng(1).normal(size=traj.action_mask.shape).astype(np.float32)
  advantages = np.asarray(TURN_GAE(traj, values, discount=1.0, lambda_=0.9).advantages)
  assert np.all(advantages[~traj.action_mask] == 0)
  for i in range(len(TURNS)):
    for k in np.flatnonzero(traj.turn_mask[i]):
      span = advantages[i, traj.turn_start[i, k]:traj.turn_end[i, k]]
      assert np.ptp(span) < 1e-6


def test_lambda_one_is_return_to_go_minus_the_turn_value():
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1])
  values = np.random.default_rng(2).normal(size=traj.action_mask.shape).astype(np.float32)
  out = TURN_GAE(traj, values, discount=1.0, lambda_=1.0, whiten=False)
  # Row 1: rewards 0, 0.5, 0 -> returns to go 0.5, 0.5, 0 at turns 0, 1, 2.
  row, k = 1, 0
  start, end = traj.turn_start[row, k], traj.turn_end[row, k]
  assert float(out.advantages[row, start]) == pytest.approx(0.5 - values[row, start:end].mean(),
                                                             abs=1e-5)


def test_needs_a_critic():
  assert estimators.get_estimator("turn_gae").needs_critic
  with pytest.raises(ValueError, match="turn_gae' needs critic values"):
    estimators.turn_gae(make_trajectories(TURNS, REWARDS, [0, 0, 1, 1]), None)
