"""Tests for agentrl_jax.advantages.turn (MT-GRPO, GTPO, hybrid)."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import group
from agentrl_jax.advantages import turn

GRPO = jax.jit(group.group_relative_advantages, static_argnames="num_groups")
MT_GRPO = jax.jit(turn.mt_grpo_advantages, static_argnames="num_groups")
GTPO = jax.jit(turn.gtpo_advantages, static_argnames="num_groups")
HYBRID = jax.jit(turn.gtpo_hybrid_advantages, static_argnames=("num_groups", "alignment_guard"))


def per_turn_loop(x, mask, gid, eps):
  """NumPy reference: per (group, turn index) lists, verl's n = 1 rule."""
  cells = collections.defaultdict(list)
  for b in range(x.shape[0]):
    for k in range(x.shape[1]):
      if mask[b, k]:
        cells[(gid[b], k)].append(x[b, k])
  out = np.zeros(x.shape)
  for b in range(x.shape[0]):
    for k in range(x.shape[1]):
      if mask[b, k]:
        vals = cells[(gid[b], k)]
        mean, std = (0.0, 1.0) if len(vals) == 1 else (np.mean(vals), np.std(vals, ddof=1))
        out[b, k] = (x[b, k] - mean) / (std + eps)
  return out


def _random_case(seed, b=6, n=3):
  rng = np.random.RandomState(seed)
  rewards = rng.randn(b, n).astype(np.float32)
  mask = np.arange(n)[None, :] < rng.randint(1, n + 1, size=b)[:, None]
  gid = np.array([1, 1, 1, 1, 0, 0], np.int32)[:b]
  outcome = rng.randn(b).astype(np.float32)
  return outcome, rewards, mask, gid


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_mt_grpo_hand_checked(jit):
  # One group of two, two turns, eps = 1e-4. Outcomes {1, 0}: mean 0.5, std 1/√2
  # -> Â^O = ±0.5/(1/√2 + 1e-4). Turn 0 rewards {2, 0}: mean 1, std √2 -> Â^{T,0} = ±1/(√2 + 1e-4).
  # Turn 1 exists only for row 0: a lone row keeps mean 0, std 1 -> 3/(1 + 1e-4).
  outcome = jnp.array([1.0, 0.0])
  rewards = jnp.array([[2.0, 3.0], [0.0, 9.0]])
  mask = jnp.array([[1, 1], [1, 0]], bool)
  fn = jax.jit(turn.mt_grpo_advantages) if jit else turn.mt_grpo_advantages
  out = fn(outcome, rewards, mask, jnp.zeros(2, jnp.int32))
  a_o = 0.5 / (2**-0.5 + 1e-4)
  a_t = 1.0 / (2**0.5 + 1e-4)
  np.testing.assert_allclose(out.outcome_advantages, [a_o, -a_o], rtol=1e-6)
  np.testing.assert_allclose(out.advantages, [[a_o + a_t, a_o + 3 / (1 + 1e-4)], [-a_o - a_t, 0]],
                             rtol=1e-6)


def test_mt_grpo_matches_loop_and_constant_turn_rewards_reduce_to_grpo():
  outcome, rewards, mask, gid = _random_case(0)
  out = MT_GRPO(outcome, rewards, mask, gid, turn_coef=0.5)
  a_o = GRPO(outcome, gid, eps=1e-4)
  want = np.where(mask, np.asarray(a_o)[:, None] + 0.5 * per_turn_loop(rewards, mask, gid, 1e-4), 0)
  np.testing.assert_allclose(out.advantages, want, atol=1e-5)
  # R^T ≡ const (full mask, so no lone rows): every turn term is 0 and MT-GRPO is GRPO on R^O.
  full = np.ones_like(mask)
  const = MT_GRPO(outcome, np.full(rewards.shape, 0.3, np.float32), full, gid)
  np.testing.assert_allclose(const.advantages, np.broadcast_to(np.asarray(a_o)[:, None], full.shape),
                             atol=1e-5)


def test_gtpo_matches_loop_and_terminal_reward_is_grpo_over_survivors():
  _, rewards, mask, gid = _random_case(1)
  out = GTPO(rewards, mask, gid, discount=0.9)
  returns = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    running = 0.0
    for k in reversed(range(rewards.shape[1])):
      if mask[b, k]:
        running = rewards[b, k] + 0.9 * running
        returns[b, k] = running
  np.testing.assert_allclose(out.returns, returns, atol=1e-5)
  np.testing.assert_allclose(out.advantages, per_turn_loop(returns, mask, gid, 1e-6), atol=1e-5)
  # Only a terminal reward R_b and γ = 1: G_{b,k} = R_b, so turn k is GRPO over rows alive at k.
  terminal = np.array([1.0, 0.0, 2.0, 5.0, 1.0, 3.0], np.float32)
  last = mask.sum(1) - 1
  sparse = np.zeros_like(rewards)
  sparse[np.arange(6), last] = terminal
  out = GTPO(sparse, mask, gid, discount=1.0)
  for k in range(mask.shape[1]):
    alive = mask[:, k]
    want = GRPO(terminal, gid, weights=alive.astype(np.float32))
    np.testing.assert_allclose(np.asarray(out.advantages)[alive, k], np.asarray(want)[alive],
                               atol=1e-5)


def test_hybrid_zero_turn_rewards_and_sign_guard():
  outcome, rewards, mask, gid = _random_case(2)
  zero = HYBRID(np.zeros_like(rewards), outcome, mask, gid, outcome_coef=0.5)
  np.testing.assert_allclose(
      zero.advantages, np.where(mask, 0.5 * np.asarray(zero.outcome_advantages)[:, None], 0),
      atol=1e-6)
  out = HYBRID(rewards, outcome, mask, gid, outcome_coef=0.5)
  a_o = np.broadcast_to(np.asarray(out.outcome_advantages)[:, None], mask.shape)
  a = np.asarray(out.advantages)
  assert np.all((np.sign(a) == np.sign(a_o))[mask & (a_o != 0)])
  unguarded = HYBRID(rewards, outcome, mask, gid, alignment_guard=False)
  np.testing.assert_allclose(
      unguarded.advantages, np.where(mask, np.asarray(out.return_advantages) + 0.5 * a_o, 0),
      atol=1e-6)


def test_bad_group_id_is_named_on_host_and_nan_under_jit():
  _, rewards, mask, _ = _random_case(3)
  with pytest.raises(ValueError, match=r"group_id\[5\] = 6"):
    turn.per_turn_group_advantages(rewards, mask, np.array([0, 0, 1, 1, 2, 6], np.int32))
  out = jax.jit(turn.per_turn_group_advantages)(
      rewards, mask, jnp.array([0, 0, 1, 1, 2, 6], jnp.int32))
  assert np.all(np.isnan(np.asarray(out)[5][mask[5]]))
  assert np.all(np.isfinite(np.asarray(out)[:5]))


def test_reverse_turn_advantages_touch_only_the_depth_turn():
  # Two prefixes, two continuations each: returns {1, 3} and {2, 2}. Depth 1 tokens are 2 and 3.
  turn_of_token = jnp.array([[0, 0, 1, 1, -1]] * 4, jnp.int32)
  action_mask = jnp.array([[0, 1, 0, 1, 0]] * 4, bool)
  fn = jax.jit(turn.reverse_turn_advantages)
  out = fn(jnp.array([1.0, 3.0, 2.0, 2.0]), jnp.array([0, 0, 1, 1], jnp.int32), 1, turn_of_token,
           action_mask)
  a = 1 / (2**0.5 + 1e-6)  # (3 − 2)/std, std = √2
  np.testing.assert_allclose(out, [[0, 0, 0, -a, 0], [0, 0, 0, a, 0], [0] * 5, [0] * 5], rtol=1e-6)
  # K = 1: the depth-0 update is GRPO with group size M on the turn-0 tokens.
  out = fn(jnp.array([1.0, 3.0, 2.0, 2.0]), jnp.array([0, 0, 1, 1], jnp.int32), 0, turn_of_token,
           action_mask)
  np.testing.assert_allclose(out[:, 1], [-a, a, 0, 0], rtol=1e-6)
  assert np.all(np.asarray(out)[:, 3] == 0)
