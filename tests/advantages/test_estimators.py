"""Tests for agentrl_jax.advantages.estimators."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.advantages import gae as gae_lib
from agentrl_jax.advantages import group

L, N = 12, 3
JIT = {name: jax.jit(est) for name, est in estimators.ESTIMATORS.items()}


def make_trajectories(turns, rewards, group_id, env_error_row=None):
  """Builds host-side Trajectories from per-row lists of (observation_len, action_len) turns."""
  b = len(turns)
  traj = types.empty_trajectories(b, L, N)
  for i, row in enumerate(turns):
    pos = 0
    for k, (obs_len, act_len) in enumerate(row):
      traj.turn_of_token[i, pos:pos + obs_len + act_len] = k
      pos += obs_len
      traj.action_mask[i, pos:pos + act_len] = True
      traj.turn_start[i, k], traj.turn_end[i, k] = pos, pos + act_len
      traj.turn_mask[i, k] = True
      traj.action_valid[i, k] = True
      traj.reward[i, k] = rewards[i][k]
      pos += act_len
    traj.done[i, len(row) - 1] = True
  traj.tokens[:] = np.arange(L)[None, :] * traj.action_mask
  traj.outcome[:] = traj.reward.sum(1)
  traj.group_id[:] = group_id
  if env_error_row is not None:
    traj.env_error[env_error_row, 0] = True
  traj.validate()
  return traj


TURNS = [[(2, 2), (1, 3)], [(2, 1), (2, 2), (1, 2)], [(3, 3)], [(1, 2), (2, 2)]]
REWARDS = [[0.0, 1.0], [0.0, 0.5, 0.0], [2.0], [0.0, 0.0]]


def _traj(**kw):
  return make_trajectories(TURNS, REWARDS, [0, 0, 1, 1], **kw)


def test_registry_and_lookup():
  assert set(estimators.ESTIMATORS) >= {"grpo", "dr_grpo", "rloo", "gae", "gigpo", "gagpo",
                                        "mt_grpo", "gtpo", "gtpo_hybrid", "spo"}
  assert estimators.get_estimator("gae").needs_critic
  assert not estimators.get_estimator("grpo").needs_critic
  with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; known: dr_grpo, gae, .*rloo"):
    estimators.get_estimator("ppo")
  with pytest.raises(ValueError, match="needs critic values"):
    estimators.get_estimator("gae")(_traj(), None)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_group_estimators_broadcast_outcome_advantages(name, jit):
  traj = _traj()
  fn = estimators.get_estimator(name)
  if jit:
    traj = jax.tree.map(jnp.asarray, traj)
    fn = jax.jit(fn)
  out = fn(traj, None)
  # Outcomes: [1, 0.5 | 2, 0]. Group 0: mean 0.75, std sqrt(0.125); group 1: mean 1, std sqrt(2).
  per_row = {
      "grpo": [0.25 / (0.125**0.5 + 1e-6), -0.25 / (0.125**0.5 + 1e-6),
               1 / (2**0.5 + 1e-6), -1 / (2**0.5 + 1e-6)],
      "dr_grpo": [0.25, -0.25, 1.0, -1.0],
      "rloo": [0.5, -0.5, 2.0, -2.0],  # s_b minus the other row of its pair
  }[name]
  mask = np.asarray(traj.action_mask)
  want = np.where(mask, np.array(per_row)[:, None], 0.0)
  np.testing.assert_allclose(out.advantages, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.returns, want, rtol=1e-5, atol=1e-6)
  assert out.advantages.shape == (4, L) and out.advantages.dtype == jnp.float32


def test_env_error_rows_get_zero_and_leave_the_baseline():
  traj = _traj(env_error_row=1)
  out = JIT["grpo"](traj, None)
  assert np.all(np.asarray(out.advantages)[1] == 0)
  # Row 0 is now alone in group 0: n = 1 rule, A = s / (1 + eps).
  np.testing.assert_allclose(np.asarray(out.advantages)[0][traj.action_mask[0]], 1 / (1 + 1e-6))
  out = JIT["rloo"](traj, None)
  assert np.all(np.asarray(out.advantages)[1] == 0)
  np.testing.assert_allclose(np.asarray(out.advantages)[0][traj.action_mask[0]], 1.0)


def test_group_estimators_validate_host_group_ids():
  traj = _traj()
  traj = traj.replace(group_id=np.array([0, 0, 1, 9], np.int32))
  with pytest.raises(ValueError, match=r"group_id\[3\] = 9"):
    estimators.grpo(traj, None)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_gae_estimator_matches_kernel_and_zeroes_padding(jit):
  traj = _traj(env_error_row=3)
  values = np.random.RandomState(0).randn(4, L).astype(np.float32)
  fn = estimators.get_estimator("gae")
  if jit:
    fn = jax.jit(fn, static_argnames=("discount", "lambda_", "whiten"))
  out = fn(traj, values, discount=0.9, lambda_=0.8, whiten=False)
  rewards = gae_lib.token_rewards(traj.reward, traj.turn_end, traj.turn_mask, L)
  ref = gae_lib.generalized_advantage_estimation(rewards, values, traj.action_mask, 0.9, 0.8)
  mask = traj.action_mask.copy()
  mask[3] = False
  np.testing.assert_allclose(out.advantages, np.where(mask, ref.advantages, 0), atol=1e-6)
  np.testing.assert_allclose(out.returns, np.where(mask, ref.returns, 0), atol=1e-6)
  assert np.all(np.asarray(out.advantages)[~traj.action_mask] == 0)


def test_gae_estimator_with_lambda_one_is_outcome_minus_value():
  traj = _traj()
  values = np.random.RandomState(1).randn(4, L).astype(np.float32)
  out = jax.jit(functools.partial(estimators.gae, whiten=False))(traj, values)
  # γ = λ = 1: every action token's advantage is the sum of the rewards still to come minus V_t.
  rewards = np.asarray(gae_lib.token_rewards(traj.reward, traj.turn_end, traj.turn_mask, L))
  to_go = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
  want = np.where(traj.action_mask, to_go - values, 0)
  np.testing.assert_allclose(out.advantages, want, atol=1e-5)


def test_group_helpers_match_estimator():
  traj = _traj()
  out = JIT["dr_grpo"](traj, None)
  direct = jax.jit(group.group_relative_advantages, static_argnames="normalize_by_std")(
      traj.outcome, traj.group_id, normalize_by_std=False)
  last_action_token = traj.turn_end[:, 0] - 1
  np.testing.assert_allclose(np.asarray(out.advantages)[np.arange(4), last_action_token],
                             np.asarray(direct), atol=1e-6)


TURN_LEVEL = ["gigpo", "gagpo", "mt_grpo", "gtpo", "gtpo_hybrid", "spo"]


@pytest.mark.parametrize("name", TURN_LEVEL)
def test_turn_level_estimators_follow_the_contract(name):
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1], env_error_row=3)
  traj.obs_hash[:] = [[5, 9, 0], [5, 7, 9], [4, 0, 0], [5, 4, 0]]
  embedding = np.random.RandomState(0).randn(4, N, 3).astype(np.float32)
  traj = traj.replace(extras={"prefix_embedding": embedding})
  out = JIT[name](traj, None)
  a = np.asarray(out.advantages)
  assert a.shape == (4, L) and a.dtype == np.float32 and np.all(np.isfinite(a))
  assert np.all(a[~traj.action_mask] == 0) and np.all(a[3] == 0)
  np.testing.assert_array_equal(out.returns, out.advantages)
  # One value per turn: every action token of a turn carries the same advantage.
  for b in range(3):
    for k in np.flatnonzero(traj.turn_mask[b]):
      span = a[b, traj.turn_start[b, k]:traj.turn_end[b, k]]
      np.testing.assert_array_equal(span, span[0])


def test_gigpo_estimator_uses_initial_obs_hash_and_turn_kernel():
  from agentrl_jax.advantages import step
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1])
  traj.obs_hash[:] = [[5, 9, 0], [5, 7, 9], [4, 0, 0], [5, 4, 0]]
  initial = np.array([1, 2, 3, 3], np.int32)
  traj = traj.replace(extras={extra_keys.INITIAL_OBS_HASH_KEY: initial})
  out = JIT["gigpo"](traj, None, discount=0.5)
  want = jax.jit(step.gigpo_advantages)(traj.outcome, traj.reward, step.anchor_hashes(traj.obs_hash, initial),
                               traj.turn_mask, traj.group_id, discount=0.5).advantages
  np.testing.assert_allclose(out.advantages,
                             np.asarray(types.broadcast_turns_to_tokens(
                                 want, traj.turn_of_token, traj.action_mask)), atol=1e-6)


def test_spo_needs_embeddings():
  with pytest.raises(ValueError, match=r"traj.extras\['prefix_embedding'\]"):
    estimators.spo(_traj(), None)


def test_mt_grpo_turn_reward_key():
  traj = _traj()
  with pytest.raises(ValueError, match="turn_reward_key 'tool'"):
    estimators.mt_grpo(traj, None, turn_reward_key="tool")
  traj = traj.replace(extras={"tool": np.zeros((4, N), np.float32)})
  # Constant turn rewards: MT-GRPO equals GRPO with MT-GRPO's eps.
  mt_grpo = jax.jit(estimators.mt_grpo, static_argnames="turn_reward_key")
  np.testing.assert_allclose(mt_grpo(traj, None, turn_reward_key="tool").advantages,
                             JIT["grpo"](traj, None, eps=1e-4).advantages, atol=1e-6)


def test_grpo_statistics_over_step_rows():
  # Group 0: row 0 (outcome 1, 2 turns), row 1 (outcome 0.5, 3 turns): over step rows the group is
  # {1, 1, 0.5, 0.5, 0.5}: mean 0.7, unbiased std sqrt(0.3/4).
  traj = _traj()
  out = jax.jit(estimators.grpo, static_argnames="stats_over")(traj, None, stats_over="step_rows")
  std = (0.3 / 4) ** 0.5
  got = np.asarray(out.advantages)[np.arange(2), traj.turn_end[:2, 0] - 1]
  np.testing.assert_allclose(got, [0.3 / (std + 1e-6), -0.2 / (std + 1e-6)], rtol=1e-5)
  with pytest.raises(ValueError, match="stats_over"):
    estimators.grpo(traj, None, stats_over="tokens")


@pytest.mark.parametrize("name", ["gigpo", "gagpo"])
def test_anchor_key_replaces_the_observation_anchors(name):
  from agentrl_jax.advantages import step
  traj = make_trajectories(TURNS, REWARDS, [0, 0, 1, 1])
  traj.obs_hash[:] = [[5, 9, 0], [5, 7, 9], [4, 0, 0], [5, 4, 0]]
  initial = np.array([1, 2, 3, 3], np.int32)
  anchors = np.asarray(step.anchor_hashes(traj.obs_hash, initial))
  # The same anchors given as a key reproduce the hash-based result exactly...
  keyed = traj.replace(extras={extra_keys.INITIAL_OBS_HASH_KEY: initial, "anchor_state_key": anchors})
  plain = traj.replace(extras={extra_keys.INITIAL_OBS_HASH_KEY: initial})
  by_key = jax.jit(functools.partial(estimators.ESTIMATORS[name], anchor_key="anchor_state_key"))
  np.testing.assert_array_equal(by_key(keyed, None).advantages, JIT[name](plain, None).advantages)
  # ...and a key that merges every state of a group into one anchor changes the step credit.
  merged = keyed.replace(extras={**keyed.extras, "anchor_state_key": np.zeros_like(anchors)})
  assert not np.allclose(by_key(merged, None).advantages, JIT[name](plain, None).advantages)
  with pytest.raises(ValueError, match="anchor_key='cluster' is not in traj.extras"):
    estimators.ESTIMATORS[name](plain, None, anchor_key="cluster")
