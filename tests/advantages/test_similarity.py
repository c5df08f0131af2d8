"""Tests for agentrl_jax.advantages.similarity (SPO)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import group
from agentrl_jax.advantages import similarity

SPO = jax.jit(similarity.similarity_advantages, static_argnames="normalize_by_std")


def spo_loop(rewards, emb, mask, gid, tau, eps):
  """NumPy reference: explicit loops over rows, turns and the other members of the group."""
  b, n, _ = emb.shape
  filled = emb.copy()
  for i in range(b):
    last = 0
    for k in range(n):
      last = k if mask[i, k] else last
      filled[i, k] = emb[i, last]
  out = np.zeros((b, n))
  for i in range(b):
    members = [j for j in range(b) if gid[j] == gid[i]]
    std = np.std(rewards[members], ddof=1) if len(members) > 1 else 1.0
    for k in range(n):
      if not mask[i, k]:
        continue
      num = den = 0.0
      for j in members:
        if j == i:
          continue
        x, y = filled[i, k], filled[j, k]
        w = np.exp(max(0.0, x @ y / np.linalg.norm(x) / np.linalg.norm(y)) / tau)
        num, den = num + w * rewards[j], den + w
      base = num / den if den else 0.0
      out[i, k] = (rewards[i] - base) / (std + eps)
  return out


def _case(seed, b=6, n=3, d=4):
  rng = np.random.RandomState(seed)
  rewards = rng.randn(b).astype(np.float32)
  emb = rng.randn(b, n, d).astype(np.float32)
  mask = np.arange(n)[None, :] < rng.randint(1, n + 1, size=b)[:, None]
  gid = np.array([0, 0, 0, 1, 1, 4], np.int32)[:b]
  return rewards, emb, mask, gid


def test_forward_fill_turns():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  mask = jnp.array([[1, 0, 1], [1, 1, 0]], bool)
  np.testing.assert_array_equal(jax.jit(similarity.forward_fill_turns)(x, mask),
                                [[1, 1, 3], [4, 5, 5]])


@pytest.mark.parametrize("seed", [0, 1])
def test_against_loop(seed):
  rewards, emb, mask, gid = _case(seed)
  out = SPO(rewards, emb, mask, gid, 0.5)
  np.testing.assert_allclose(out.advantages, spo_loop(rewards, emb, mask, gid, 0.5, 1e-6),
                             atol=1e-4)


def test_equal_similarities_give_rloo_and_baseline_is_convex():
  rewards, emb, mask, gid = _case(2)
  same = np.broadcast_to(emb[:1, :1], emb.shape)  # every prefix identical: cos = 1
  out = SPO(rewards, same, np.ones_like(mask), gid, 0.1, normalize_by_std=False)
  rloo = jax.jit(group.leave_one_out_advantages)(rewards, gid)
  np.testing.assert_allclose(out.advantages, np.broadcast_to(np.asarray(rloo)[:, None], mask.shape),
                             atol=1e-5)
  out = SPO(rewards, emb, np.ones_like(mask), gid, 0.1)
  base = np.asarray(out.baselines)
  for i in range(5):  # row 5 is alone in its group
    others = rewards[(gid == gid[i]) & (np.arange(6) != i)]
    assert np.all(base[i] >= others.min() - 1e-6) and np.all(base[i] <= others.max() + 1e-6)


def test_own_reward_not_in_baseline_and_equal_rewards_give_zero():
  rewards, emb, mask, gid = _case(3)
  jac = jax.jit(jax.jacobian(lambda r: similarity.similarity_advantages(r, emb, mask, gid).baselines))(
      jnp.asarray(rewards))
  for i in range(6):
    np.testing.assert_array_equal(jac[i, :, i], 0.0)
  out = SPO(np.full(6, 0.4, np.float32), emb, mask, gid, 0.1)
  np.testing.assert_allclose(out.advantages[:5], 0.0, atol=1e-5)


def test_bad_group_id():
  rewards, emb, mask, gid = _case(4)
  with pytest.raises(ValueError, match=r"group_id\[5\] = 9"):
    similarity.similarity_advantages(rewards, emb, mask, np.array([0, 0, 0, 1, 1, 9], np.int32))
  out = SPO(rewards, emb, mask, jnp.array([0, 0, 0, 1, 1, 9], jnp.int32), 0.1)
  assert np.all(np.isnan(np.asarray(out.advantages)[5][mask[5]]))
