"""Tests for agentrl_jax.advantages.step (GiGPO, GAGPO)."""

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import step

GIGPO = jax.jit(step.gigpo_advantages,
                static_argnames=("num_groups", "mode", "episode_stats_over"))
GAGPO = jax.jit(step.gagpo_advantages, static_argnames="singleton")
ANCHORS = jax.jit(step.anchor_hashes)
STEP_GROUPS = jax.jit(step.step_groups)


def returns_loop(rewards, mask, gamma):
  out = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    running = 0.0
    for k in reversed(range(rewards.shape[1])):
      if mask[b, k]:
        running = rewards[b, k] + gamma * running
        out[b, k] = running
  return out


def _normalize(x, vals, normalize, eps):
  mean, std = np.mean(vals), (np.std(vals, ddof=1) if len(vals) > 1 else 1.0)
  return (x - mean) / (std + eps) if normalize else x - mean


def gigpo_loop(scores, rewards, anchors, mask, gid, gamma, omega, mode, eps):
  """NumPy reference with dictionaries keyed by group and by (group, anchor hash)."""
  b_size, n = rewards.shape
  normalize = mode == "mean_std_norm"
  g_ret = returns_loop(rewards, mask, gamma)
  episode_rows = collections.defaultdict(list)
  step_rows = collections.defaultdict(list)
  for b in range(b_size):
    for k in range(n):
      if mask[b, k]:
        episode_rows[gid[b]].append(scores[b])
        step_rows[(gid[b], anchors[b, k])].append(g_ret[b, k])
  a_e = np.zeros(b_size)
  for b in range(b_size):
    vals = episode_rows[gid[b]]
    if len(vals) == 1:
      a_e[b] = scores[b] / (1 + eps) if normalize else scores[b]
    elif vals:
      a_e[b] = _normalize(scores[b], vals, normalize, eps)
  out = np.zeros((b_size, n))
  for b in range(b_size):
    for k in range(n):
      if mask[b, k]:
        vals = step_rows[(gid[b], anchors[b, k])]
        a_s = 0.0 if len(vals) == 1 else _normalize(g_ret[b, k], vals, normalize, eps)
        out[b, k] = a_e[b] + omega * a_s
  return out


def _random_case(seed, b=6, n=4):
  rng = np.random.RandomState(seed)
  rewards = rng.randn(b, n).astype(np.float32)
  lengths = rng.randint(1, n + 1, size=b)
  mask = np.arange(n)[None, :] < lengths[:, None]
  obs_hash = rng.randint(0, 3, size=(b, n)).astype(np.int32)  # few values: many shared states
  gid = np.array([0, 0, 0, 2, 2, 5], np.int32)[:b]
  scores = rng.randn(b).astype(np.float32)
  return scores, rewards, obs_hash, mask, gid


def test_anchor_hashes_shift_observations():
  obs = jnp.array([[5, 9, 4], [7, 7, 1]], jnp.int32)
  np.testing.assert_array_equal(ANCHORS(obs), [[0, 5, 9], [0, 7, 7]])
  np.testing.assert_array_equal(ANCHORS(obs, jnp.array([3, 8], jnp.int32)),
                                [[3, 5, 9], [8, 7, 7]])


def step_groups_loop(gid, anchors, mask):
  """NumPy reference: a dict from (group, anchor hash) to the first row (row-major) holding it."""
  b_size, n = anchors.shape
  first = {}
  ids = np.zeros((b_size, n), np.int32)
  for b in range(b_size):
    for k in range(n):
      key = (int(gid[b]), int(anchors[b, k])) if mask[b, k] else "missing"
      ids[b, k] = first.setdefault(key, b * n + k)
  return ids


def test_step_groups_hand_checked():
  # Rows (flat index b·2 + k): (0,0)=0 g0 h4, (0,1)=1 g0 h6, (1,0)=2 g0 h4, (1,1)=3 missing,
  # (2,0)=4 g1 h4, (2,1)=5 g1 h6. Same group and anchor: rows 0 and 2 -> id 0; anchor 4 in
  # group 1 is another state -> id 4; the missing turn gets its own id 3.
  gid = jnp.array([0, 0, 1], jnp.int32)
  anchors = jnp.array([[4, 6], [4, 7], [4, 6]], jnp.int32)
  mask = jnp.array([[1, 1], [1, 0], [1, 1]], bool)
  np.testing.assert_array_equal(STEP_GROUPS(gid, anchors, mask), [[0, 1], [0, 3], [4, 5]])


CASES = ["few_states", "all_distinct", "extreme_values", "none_exist"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("table_factor", [0.25, 2])
def test_step_groups_against_dict_loop(case, table_factor):
  rng = np.random.RandomState(CASES.index(case))
  b, n = 64, 9
  gid = rng.randint(0, 8, size=b).astype(np.int32)
  mask = np.arange(n)[None, :] < rng.randint(0, n + 1, size=b)[:, None]
  if case == "few_states":
    anchors = rng.randint(0, 4, size=(b, n))
  elif case == "all_distinct":  # ~290 keys in 256 or 2048 slots: collisions, several rounds
    anchors = rng.randint(-2**31, 2**31 - 1, size=(b, n))
  elif case == "extreme_values":
    anchors = rng.choice([-2**31, -1, 0, 1, 2**31 - 1], size=(b, n))
    gid = rng.choice([0, 2**31 - 1], size=b).astype(np.int32)
  else:
    anchors = rng.randint(0, 4, size=(b, n))
    mask = np.zeros((b, n), bool)
  anchors = anchors.astype(np.int32)
  fn = jax.jit(functools.partial(step.step_groups, table_factor=table_factor))
  np.testing.assert_array_equal(fn(gid, anchors, mask), step_groups_loop(gid, anchors, mask))


def test_step_groups_no_jit_and_bad_table():
  gid = np.array([0, 0], np.int32)
  anchors = np.array([[1, 2], [2, 1]], np.int32)
  mask = np.ones((2, 2), bool)
  np.testing.assert_array_equal(step.step_groups(gid, anchors, mask),
                                step_groups_loop(gid, anchors, mask))
  with pytest.raises(ValueError, match="table_factor must be > 0, got 0"):
    step.step_groups(gid, anchors, mask, table_factor=0)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_gigpo_hand_checked(jit):
  # γ = 0.5. Row 0: rewards [0, 1], observations after each turn [5, 9], anchors [0, 5].
  # Row 1: rewards [0, 0, 0], observations [5, 7, 9], anchors [0, 5, 7]. Outcomes 1 and 0.
  # Step returns: G0 = [0.5, 1], G1 = [0, 0, 0].
  # Episode (over 5 step rows): mean (2·1 + 3·0)/5 = 0.4 -> A^E = [0.6, −0.4].
  # Anchor 0: {0.5, 0} -> A^S = ±0.25; anchor 5: {1, 0} -> ±0.5; anchor 7: singleton -> 0.
  # A = [[0.85, 1.1, 0], [−0.65, −0.9, −0.4]].
  rewards = jnp.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
  obs_hash = jnp.array([[5, 9, 0], [5, 7, 9]], jnp.int32)
  mask = jnp.array([[1, 1, 0], [1, 1, 1]], bool)

  def fn(scores, rewards, anchors, mask, gid):
    return step.gigpo_advantages(scores, rewards, anchors, mask, gid, discount=0.5)

  fn = jax.jit(fn) if jit else fn
  out = fn(jnp.array([1.0, 0.0]), rewards, ANCHORS(obs_hash), mask,
           jnp.zeros(2, jnp.int32))
  np.testing.assert_allclose(out.episode_advantages, [0.6, -0.4], rtol=1e-6)
  np.testing.assert_allclose(out.advantages, [[0.85, 1.1, 0.0], [-0.65, -0.9, -0.4]], rtol=1e-6)


@pytest.mark.parametrize("mode", step.GIGPO_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_gigpo_against_dict_loop(mode, seed):
  scores, rewards, obs_hash, mask, gid = _random_case(seed)
  anchors = np.asarray(ANCHORS(obs_hash))
  out = GIGPO(scores, rewards, anchors, mask, gid, discount=0.9, step_weight=0.7, mode=mode)
  want = gigpo_loop(scores, rewards, anchors, mask, gid, 0.9, 0.7, mode, 1e-6)
  np.testing.assert_allclose(out.advantages, want, atol=1e-5)


def test_gigpo_unique_anchors_give_episode_advantage_only():
  scores, rewards, _, mask, gid = _random_case(2)
  unique = np.arange(mask.size, dtype=np.int32).reshape(mask.shape)
  out = GIGPO(scores, rewards, unique, mask, gid)
  np.testing.assert_allclose(out.advantages, np.where(mask, out.episode_advantages[:, None], 0))
  np.testing.assert_array_equal(out.step_advantages, 0.0)


def test_gigpo_step_advantages_sum_to_zero_per_step_group():
  scores, rewards, obs_hash, mask, gid = _random_case(3)
  anchors = ANCHORS(obs_hash)
  out = GIGPO(scores, rewards, anchors, mask, gid)
  ids = np.asarray(STEP_GROUPS(gid, anchors, mask))
  a_s = np.asarray(out.step_advantages)
  for i in np.unique(ids[mask]):
    np.testing.assert_allclose(a_s[(ids == i) & mask].sum(), 0.0, atol=1e-5)


def test_gigpo_permuting_rows_permutes_output():
  scores, rewards, obs_hash, mask, gid = _random_case(4)
  anchors = np.asarray(ANCHORS(obs_hash))
  perm = np.array([2, 0, 1, 4, 3, 5])
  out = GIGPO(scores, rewards, anchors, mask, gid)
  permuted = GIGPO(scores[perm], rewards[perm], anchors[perm], mask[perm], gid[perm])
  np.testing.assert_allclose(permuted.advantages, np.asarray(out.advantages)[perm], atol=1e-6)


def test_gigpo_rejects_unknown_mode():
  scores, rewards, obs_hash, mask, gid = _random_case(0)
  with pytest.raises(ValueError, match="mode"):
    step.gigpo_advantages(scores, rewards, obs_hash, mask, gid, mode="std")


def gagpo_loop(rewards, anchors, mask, gid, gamma, lam, eps):
  """NumPy reference for GAGPO with the time-baseline singleton rule."""
  b_size, n = rewards.shape
  g_ret = returns_loop(rewards, mask, gamma)
  by_state, by_time, by_group = (collections.defaultdict(list) for _ in range(3))
  for b in range(b_size):
    for k in range(n):
      if mask[b, k]:
        by_state[(gid[b], anchors[b, k])].append(g_ret[b, k])
        by_time[(gid[b], k)].append(g_ret[b, k])
        by_group[gid[b]].append(g_ret[b, k])
  values = np.zeros((b_size, n))
  for b in range(b_size):
    for k in range(n):
      if mask[b, k]:
        for table, key in ((by_state, (gid[b], anchors[b, k])), (by_time, (gid[b], k))):
          if len(table[key]) > 1:
            values[b, k] = np.mean(table[key])
            break
        else:
          values[b, k] = np.mean(by_group[gid[b]])
  raw = np.zeros((b_size, n))
  for b in range(b_size):
    next_value, last = 0.0, 0.0
    for k in reversed(range(n)):
      if mask[b, k]:
        last = rewards[b, k] + gamma * next_value - values[b, k] + gamma * lam * last
        next_value, raw[b, k] = values[b, k], last
  normalized = np.zeros((b_size, n))
  for b in range(b_size):
    for k in range(n):
      if mask[b, k]:
        vals = [raw[j, i] for j in range(b_size) for i in range(n) if mask[j, i] and gid[j] == gid[b]]
        normalized[b, k] = (raw[b, k] / (1 + eps) if len(vals) == 1
                            else _normalize(raw[b, k], vals, True, eps))
  return values, raw, normalized


@pytest.mark.parametrize("seed", [0, 1])
def test_gagpo_against_loop(seed):
  _, rewards, obs_hash, mask, gid = _random_case(seed)
  anchors = np.asarray(ANCHORS(obs_hash))
  out = GAGPO(rewards, anchors, mask, gid, 0.9, 0.8)
  values, raw, normalized = gagpo_loop(rewards, anchors, mask, gid, 0.9, 0.8, 1e-6)
  np.testing.assert_allclose(out.state_values, values, atol=1e-5)
  np.testing.assert_allclose(out.raw_advantages, raw, atol=1e-5)
  np.testing.assert_allclose(out.advantages, normalized, atol=1e-5)


def test_gagpo_lambda_one_telescopes_and_lambda_zero_is_td():
  _, rewards, obs_hash, mask, gid = _random_case(5)
  anchors = ANCHORS(obs_hash)
  g_ret = returns_loop(rewards, mask, 0.9)
  one = GAGPO(rewards, anchors, mask, gid, 0.9, 1.0)
  np.testing.assert_allclose(one.raw_advantages, np.where(mask, g_ret - one.state_values, 0),
                             atol=1e-5)
  zero = GAGPO(rewards, anchors, mask, gid, 0.9, 0.0)
  v = np.asarray(zero.state_values)
  next_v = np.concatenate([v[:, 1:] * mask[:, 1:], np.zeros((v.shape[0], 1))], axis=1)
  np.testing.assert_allclose(zero.raw_advantages, np.where(mask, rewards + 0.9 * next_v - v, 0),
                             atol=1e-5)
  # Normalised advantages have zero mean over the step rows of every group.
  a = np.asarray(one.advantages)
  for g in (0, 2):
    rows = mask & (gid[:, None] == g)
    np.testing.assert_allclose(a[rows].mean(), 0.0, atol=1e-5)


def test_gagpo_first_turn_is_grpo_baseline_and_time_fallback():
  # All trajectories start in the same state; later states are all distinct, so the fallback
  # baseline is the mean return of the group at the same turn index.
  rewards = jnp.array([[0.0, 1.0], [0.0, 3.0], [0.0, 2.0]])
  mask = jnp.ones((3, 2), bool)
  anchors = jnp.array([[0, 11], [0, 12], [0, 13]], jnp.int32)
  out = GAGPO(rewards, anchors, mask, jnp.zeros(3, jnp.int32), 1.0, 1.0)
  # G = [[1, 1], [3, 3], [2, 2]]; V̂(s0) = 2 = V̂(time k=1); raw = G − 2.
  np.testing.assert_allclose(out.state_values, [[2, 2], [2, 2], [2, 2]])
  np.testing.assert_allclose(out.raw_advantages, [[-1, -1], [1, 1], [0, 0]], atol=1e-6)
  with pytest.raises(ValueError, match="singleton"):
    step.gagpo_advantages(rewards, anchors, mask, jnp.zeros(3, jnp.int32), singleton="mean")


def test_similar_anchor_ids_cluster_near_duplicates_within_groups():
  observations = [
      ["You are in the kitchen.", "You see a red apple on the table."],
      ["You are in the kitchen!", "You see a green pear on the shelf."],
      ["You are in the kitchen."],
  ]
  ids = step.similar_anchor_ids(observations, [0, 0, 1], max_turns=3, threshold=0.9)
  # Row 1's first text differs by one character (ratio ≈ 0.96): it joins cluster 0. Its second
  # text is a new cluster. Row 2 is in another group, so its numbering starts again at 0.
  np.testing.assert_array_equal(ids, [[0, 1, -1], [0, 2, -1], [0, -1, -1]])
  exact = step.similar_anchor_ids(observations, [0, 0, 1], max_turns=3, threshold=1.0)
  np.testing.assert_array_equal(exact[1], [2, 3, -1])
  with pytest.raises(ValueError, match="max_turns"):
    step.similar_anchor_ids(observations, [0, 0, 1], max_turns=1)


def _gigpo_float64(scores, returns, anchors, gid, mode, eps=1e-6):
  """Vectorised float64 GiGPO on a full turn mask (episode stats over step rows), by bincount."""
  b, n = returns.shape
  normalize = mode == "mean_std_norm"

  def norm(x, key):
    _, inverse = np.unique(key, return_inverse=True)
    count = np.bincount(inverse)
    mean = np.bincount(inverse, weights=x) / count
    std = np.sqrt(np.bincount(inverse, weights=(x - mean[inverse]) ** 2)
                  / np.maximum(count - 1, 1))
    out = x - mean[inverse]
    return (out / (std[inverse] + eps) if normalize else out), count[inverse]

  rows_gid = np.repeat(gid, n)
  episode, _ = norm(np.repeat(scores.astype(np.float64), n), rows_gid)
  step_adv, count = norm(returns.astype(np.float64).reshape(-1),
                         rows_gid.astype(np.int64) << 32 | anchors.reshape(-1).astype(np.int64))
  step_adv = np.where(count > 1, step_adv, 0.0)
  return episode.reshape(b, n) + step_adv.reshape(b, n)


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
def test_gigpo_million_step_rows_at_large_offset_match_float64(mode):
  # Issue #21: step groups whose returns sit at 1000 with a 1e-4 spread. γ = 1 and a single
  # reward on the last turn make every return equal that reward exactly in float32, so the
  # comparison isolates the group statistics. Anchor k is shared by the 8 episodes of a group
  # (8-row step groups); for k ≥ 8, episodes 0 and 1 of each group share a state of their own
  # (two-row step groups) and the others are alone (step advantage 0).
  b, n, size = 62_504, 16, 8  # 1,000,064 step rows
  rng = np.random.default_rng(0)
  gid = (np.arange(b) // size).astype(np.int32)
  final = (1000.0 + 1e-4 * rng.standard_normal(b)).astype(np.float32)
  rewards = np.zeros((b, n), np.float32)
  rewards[:, -1] = final
  scores = (1000.0 + 1e-4 * rng.standard_normal(b)).astype(np.float32)
  member = np.arange(b) % size
  turn = np.arange(n)[None, :]
  anchors = np.where(turn < 8, turn, np.where(member[:, None] < 2, 1000 + turn,
                                             2000 + 100 * member[:, None] + turn)).astype(np.int32)
  mask = np.ones((b, n), bool)
  got = GIGPO(jnp.asarray(scores), jnp.asarray(rewards), jnp.asarray(anchors), jnp.asarray(mask),
              jnp.asarray(gid), num_groups=b // size, discount=1.0, mode=mode)
  returns = np.repeat(final[:, None], n, axis=1)
  want = _gigpo_float64(scores, returns, anchors, gid, mode)
  np.testing.assert_allclose(got.advantages, want, atol=1e-4)


def test_mix32_is_murmur3s_finaliser_and_a_bijection():
  def reference(h):  # MurmurHash3 fmix32, in Python integers
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)
  inputs = np.arange(1 << 16, dtype=np.uint32) * np.uint32(65_537)
  got = np.asarray(step.mix32(jnp.asarray(inputs)))
  assert [int(x) for x in got[:64]] == [reference(int(x)) for x in inputs[:64]]
  assert len(np.unique(got)) == len(inputs)
