"""GiGPO's invalid-action penalty (verl-agent's convention): charged to the step row's episode
score and to the return its step group normalises."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.advantages import step

from test_step import returns_loop  # noqa: E402  the shared NumPy loop reference

GIGPO = jax.jit(step.gigpo_advantages,
                static_argnames=("num_groups", "mode", "episode_stats_over"))


def _norm(x, vals, normalize, eps):
  if len(vals) == 1:  # verl's group of one: mean 0, std 1
    return x / (1 + eps) if normalize else x
  mean, std = np.mean(vals), np.std(vals, ddof=1)
  return (x - mean) / (std + eps) if normalize else x - mean


def penalized_gigpo_loop(scores, rewards, anchors, mask, gid, invalid, coef, gamma, omega, mode,
                         stats_over, eps=1e-6):
  """NumPy reference: dictionaries over groups and (group, anchor); float64 throughout."""
  b_size, n = rewards.shape
  normalize = mode == "mean_std_norm"
  penalty = coef * (invalid & mask)
  g = returns_loop(rewards.astype(np.float64), mask, gamma) - penalty
  row_score = scores[:, None].astype(np.float64) - penalty
  trajectory_score = scores - penalty.sum(axis=1)
  episode_vals = collections.defaultdict(list)
  step_vals = collections.defaultdict(list)
  for b in range(b_size):
    if stats_over == "trajectories" and mask[b].any():
      episode_vals[gid[b]].append(trajectory_score[b])
    for k in range(n):
      if mask[b, k]:
        if stats_over == "step_rows":
          episode_vals[gid[b]].append(row_score[b, k])
        step_vals[(gid[b], anchors[b, k])].append(g[b, k])
  out = np.zeros((b_size, n))
  for b in range(b_size):
    for k in range(n):
      if not mask[b, k]:
        continue
      own = row_score[b, k] if stats_over == "step_rows" else trajectory_score[b]
      a_e = _norm(own, episode_vals[gid[b]], normalize, eps)
      vals = step_vals[(gid[b], anchors[b, k])]
      a_s = 0.0 if len(vals) == 1 else _norm(g[b, k], vals, normalize, eps)
      out[b, k] = a_e + omega * a_s
  return out


def test_one_invalid_step_hand_checked():
  # γ = 0.5, outcomes [1, 0]; row 0 rewards [0, 1], anchors [0, 5]; row 1 rewards [0, 0, 0],
  # anchors [0, 5, 7], its turn 1 invalid (penalty 0.1).
  # Row scores [1, 1 | 0, −0.1, 0]: mean 1.9/5 = 0.38 -> A^E = [0.62, 0.62 | −0.38, −0.48, −0.38].
  # Returns [0.5, 1 | 0, 0 − 0.1, 0] (the penalty stays on its own row).
  # Anchor 0 {0.5, 0} -> ±0.25; anchor 5 {1, −0.1} -> ±0.55; anchor 7 alone -> 0.
  rewards = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  anchors = jnp.array([[0, 5, 0], [0, 5, 7]], jnp.int32)
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)
  penalty = 0.1 * jnp.array([[0, 0, 0], [0, 1, 0]], jnp.float32)
  out = GIGPO(jnp.array([1.0, 0.0]), rewards, anchors, mask, jnp.zeros(2, jnp.int32),
              discount=0.5, step_penalty=penalty)
  np.testing.assert_allclose(out.episode_advantages, [[0.62, 0.62, 0], [-0.38, -0.48, -0.38]],
                             rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(out.advantages, [[0.87, 1.17, 0], [-0.63, -1.03, -0.38]],
                             rtol=1e-6, atol=1e-7)
  # Without the penalty the same batch gives the penalty-free values (test_step's hand check).
  free = GIGPO(jnp.array([1.0, 0.0]), rewards, anchors, mask, jnp.zeros(2, jnp.int32),
               discount=0.5)
  np.testing.assert_allclose(free.advantages, [[0.85, 1.1, 0], [-0.65, -0.9, -0.4]], rtol=1e-6)


def _random_batch(seed, b=8, n=4, length=12):
  """Trajectories with one token per observation and one per action, a few shared states."""
  rng = np.random.RandomState(seed)
  traj = types.empty_trajectories(b, length, n)
  turns = rng.randint(1, n + 1, size=b)
  for i in range(b):
    for k in range(turns[i]):
      traj.turn_of_token[i, 2 * k:2 * k + 2] = k
      traj.action_mask[i, 2 * k + 1] = True
      traj.turn_start[i, k], traj.turn_end[i, k] = 2 * k + 1, 2 * k + 2
      traj.turn_mask[i, k] = True
    traj.done[i, turns[i] - 1] = True
  traj.reward[:] = np.where(traj.turn_mask, rng.randn(b, n), 0).astype(np.float32)
  traj.outcome[:] = traj.reward.sum(1)
  traj.obs_hash[:] = rng.randint(0, 3, size=(b, n))
  traj.group_id[:] = np.repeat(np.arange(b // 4), 4)
  traj.action_valid[:] = traj.turn_mask & (rng.rand(b, n) > 0.3)
  assert (traj.turn_mask & ~traj.action_valid).any()
  traj.validate()
  return traj


@pytest.mark.parametrize("mode", step.GIGPO_MODES)
@pytest.mark.parametrize("stats_over", ["step_rows", "trajectories"])
@pytest.mark.parametrize("seed", [0, 1])
def test_estimator_matches_penalized_numpy_reference(mode, stats_over, seed):
  traj = _random_batch(seed)
  fn = jax.jit(functools.partial(estimators.gigpo, mode=mode, episode_stats_over=stats_over,
                                 discount=0.9, step_weight=0.7))
  out = fn(traj, None)  # default penalty 0.1
  anchors = np.asarray(step.trajectory_anchor_hashes(traj))
  want = penalized_gigpo_loop(traj.outcome, traj.reward, anchors, traj.turn_mask, traj.group_id,
                              ~traj.action_valid, 0.1, 0.9, 0.7, mode, stats_over)
  want_tokens = np.asarray(types.broadcast_turns_to_tokens(
      jnp.asarray(want, jnp.float32), traj.turn_of_token, traj.action_mask))
  np.testing.assert_allclose(out.advantages, want_tokens, atol=1e-5)
  # The penalty is not vacuous: the penalty-free reference differs.
  free = penalized_gigpo_loop(traj.outcome, traj.reward, anchors, traj.turn_mask, traj.group_id,
                              ~traj.action_valid, 0.0, 0.9, 0.7, mode, stats_over)
  assert np.abs(want - free).max() > 1e-2


@pytest.mark.parametrize("stats_over", ["step_rows", "trajectories"])
def test_zero_coefficient_is_the_penalty_free_kernel(stats_over):
  traj = _random_batch(2)
  got = jax.jit(functools.partial(estimators.gigpo, invalid_action_penalty=0.0,
                                  episode_stats_over=stats_over))(traj, None)
  kernel = GIGPO(traj.outcome, traj.reward, step.trajectory_anchor_hashes(traj), traj.turn_mask,
                 traj.group_id, episode_stats_over=stats_over)
  want = types.broadcast_turns_to_tokens(kernel.advantages, traj.turn_of_token, traj.action_mask)
  np.testing.assert_allclose(got.advantages, want, rtol=1e-6, atol=1e-6)
  penalized = jax.jit(estimators.gigpo)(traj, None)
  assert not np.allclose(penalized.advantages, want, atol=1e-3)


def test_penalty_touches_only_existing_turns():
  # Missing turns are "invalid" in the zero-filled buffers; they must not move any statistic.
  traj = _random_batch(3)
  padded_invalid = traj.replace(action_valid=traj.action_valid.copy())
  padded_invalid.action_valid[~traj.turn_mask] = False
  also_valid = traj.replace(action_valid=traj.action_valid | ~traj.turn_mask)
  np.testing.assert_array_equal(jax.jit(estimators.gigpo)(padded_invalid, None).advantages,
                                jax.jit(estimators.gigpo)(also_valid, None).advantages)
