"""Tests for agentrl_jax.advantages.group."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import group

# Jitted once and reused across tests (host-side checks are tested on the plain functions).
GRPO = jax.jit(group.group_relative_advantages, static_argnames=("num_groups", "normalize_by_std"))
RLOO = jax.jit(group.leave_one_out_advantages, static_argnames="num_groups")
STATS = jax.jit(group.group_statistics, static_argnames="num_groups")
FILTER = jax.jit(group.variance_filter, static_argnames=("num_groups", "keep_ratio", "mode"))


def _maybe_jit(fn, jit, **static):
  if not jit:
    return lambda *args: fn(*args, **static)
  return jax.jit(lambda *args: fn(*args, **static))


def grpo_loop(scores, group_id, normalize_by_std=True, eps=1e-6, weights=None):
  """NumPy reference: a dict of per-group lists, verl's n = 1 rule, rows with weight 0 skipped."""
  weights = np.ones_like(scores) if weights is None else weights
  members = collections.defaultdict(list)
  for s, g, w in zip(scores, group_id, weights):
    members[g].extend([float(s)] * int(w))
  out = np.zeros(len(scores))
  for i, (s, g, w) in enumerate(zip(scores, group_id, weights)):
    if w == 0:
      continue
    vals = np.array(members[g])
    mean, std = (0.0, 1.0) if len(vals) == 1 else (vals.mean(), vals.std(ddof=1))
    out[i] = (s - mean) / (std + eps) if normalize_by_std else s - mean
  return out


def rloo_loop(scores, group_id, weights=None):
  weights = np.ones_like(scores) if weights is None else weights
  out = np.zeros(len(scores))
  for i in range(len(scores)):
    if weights[i] == 0:
      continue
    others = [scores[j] for j in range(len(scores))
              if j != i and group_id[j] == group_id[i] and weights[j] != 0]
    out[i] = scores[i] - np.mean(others) if others else scores[i]
  return out


def _random_case(seed, b=12):
  rng = np.random.RandomState(seed)
  scores = rng.randn(b).astype(np.float32)
  group_id = rng.randint(0, 4, size=b).astype(np.int32)
  group_id[-1] = 7  # a singleton group with a sparse id
  weights = (rng.rand(b) > 0.25).astype(np.float32)
  return scores, group_id, weights


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_grpo_hand_checked(jit):
  # Group 0 = {1, 3}: mean 2, unbiased std sqrt(2) -> ∓1/sqrt(2). Group 1 = {5}: n = 1 rule
  # (mean 0, std 1) -> 5/(1 + 1e-6). Dr.GRPO: ∓1 and 5.
  scores = jnp.array([1.0, 3.0, 5.0])
  gid = jnp.array([0, 0, 1], jnp.int32)
  fn = _maybe_jit(group.group_relative_advantages, jit, num_groups=3)
  np.testing.assert_allclose(fn(scores, gid), [-2**-0.5, 2**-0.5, 5 / (1 + 1e-6)], rtol=1e-5)
  dr = _maybe_jit(group.group_relative_advantages, jit, normalize_by_std=False)
  np.testing.assert_allclose(dr(scores, gid), [-1.0, 1.0, 5.0], rtol=1e-6)
  rloo = _maybe_jit(group.leave_one_out_advantages, jit)
  # 1 − 3 = −2, 3 − 1 = 2, singleton keeps 5.
  np.testing.assert_allclose(rloo(scores, gid), [-2.0, 2.0, 5.0], rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_dict_loop(seed):
  scores, group_id, weights = _random_case(seed)
  for normalize in (True, False):
    got = GRPO(scores, group_id, 8, normalize, weights=weights)
    np.testing.assert_allclose(got, grpo_loop(scores, group_id, normalize, weights=weights),
                               atol=1e-5)
  np.testing.assert_allclose(GRPO(scores, group_id, 8), grpo_loop(scores, group_id), atol=1e-5)
  np.testing.assert_allclose(RLOO(scores, group_id, 8, weights),
                             rloo_loop(scores, group_id, weights), atol=1e-5)


def test_integer_weights_equal_repeated_rows():
  # verl-agent's statistics over step rows: weight w = the row appears w times.
  scores = np.array([1.0, 2.0, 4.0], np.float32)
  gid = np.zeros(3, np.int32)
  weights = np.array([3.0, 1.0, 2.0], np.float32)
  stats = STATS(scores, gid, 1, weights)
  repeated = np.array([1, 1, 1, 2, 4, 4.0])
  np.testing.assert_allclose(stats.count, [6.0])
  np.testing.assert_allclose(stats.mean, [repeated.mean()], rtol=1e-6)
  np.testing.assert_allclose(stats.std, [repeated.std(ddof=1)], rtol=1e-6)
  np.testing.assert_allclose(jax.jit(group.group_std, static_argnums=2)(scores, gid, 1, weights),
                             [repeated.std(ddof=1)], rtol=1e-6)


def test_equal_scores_in_a_group_give_zero_advantage():
  scores = jnp.array([0.7, 0.7, 0.7, 1.0, 2.0])
  gid = jnp.array([1, 1, 1, 0, 0], jnp.int32)
  # The group mean of equal float32 values is the value up to rounding, hence the atol.
  np.testing.assert_allclose(GRPO(scores, gid)[:3], 0.0, atol=1e-6)
  np.testing.assert_allclose(RLOO(scores, gid)[:3], 0.0, atol=1e-6)


def test_group_mean_zero_and_affine_invariance():
  scores, gid, _ = _random_case(3)
  gid[-1] = 0  # no singleton here
  a = np.asarray(GRPO(scores, gid))
  for g in np.unique(gid):
    np.testing.assert_allclose(a[gid == g].mean(), 0.0, atol=1e-5)
  # eps breaks exact invariance; with std ~ 1 and a = 3 the difference is O(eps).
  b = GRPO(3.0 * scores + 2.0, gid)
  np.testing.assert_allclose(b, a, atol=1e-5)


def test_rloo_baseline_does_not_depend_on_own_score():
  scores = jnp.array([1.0, 2.0, 4.0, 3.0])
  gid = jnp.array([0, 0, 0, 1], jnp.int32)
  jacobian = jax.jit(jax.jacobian(group.leave_one_out_advantages))(scores, gid)
  # A_b = s_b − baseline_b, so ∂A_b/∂s_b = 1 exactly iff ∂baseline_b/∂s_b = 0.
  np.testing.assert_allclose(jnp.diag(jacobian), 1.0, atol=1e-6)
  np.testing.assert_allclose(jacobian[0, 1:3], -0.5, atol=1e-6)


def test_host_checks_name_the_bad_value():
  scores = np.array([1.0, 2.0, 3.0], np.float32)
  with pytest.raises(ValueError, match=r"group_id\[2\] = 3 is outside \[0, 3\)"):
    group.group_relative_advantages(scores, np.array([0, 1, 3], np.int32))
  with pytest.raises(ValueError, match=r"group_id\[0\] = -1"):
    group.leave_one_out_advantages(scores, np.array([-1, 1, 1], np.int32))
  with pytest.raises(ValueError, match=r"scores\[1\] = nan"):
    group.group_relative_advantages(np.array([1.0, np.nan, 3.0], np.float32),
                                    np.zeros(3, np.int32))
  # A NaN on a row with weight 0 is ignored.
  out = GRPO(np.array([1.0, np.nan, 3.0], np.float32), np.zeros(3, np.int32),
             weights=np.array([1.0, 0.0, 1.0], np.float32))
  np.testing.assert_allclose(out, [-2**-0.5, 0.0, 2**-0.5], rtol=1e-5)


def test_under_jit_bad_inputs_become_nan_not_garbage():
  fn = GRPO
  # Row 3 has an out-of-range id: only that row is NaN, the rest is unaffected.
  out = fn(jnp.array([1.0, 3.0, 5.0, 9.0]), jnp.array([0, 0, 1, 4], jnp.int32))
  np.testing.assert_allclose(out[:3], [-2**-0.5, 2**-0.5, 5 / (1 + 1e-6)], rtol=1e-5)
  assert np.isnan(out[3])
  out = fn(jnp.array([1.0, 3.0, 5.0, 9.0]), jnp.array([0, 0, 1, -1], jnp.int32))
  assert np.isnan(out[3]) and np.all(np.isfinite(out[:3]))
  # A NaN score poisons its own group only.
  out = fn(jnp.array([1.0, jnp.nan, 5.0, 7.0]), jnp.array([0, 0, 1, 1], jnp.int32))
  assert np.all(np.isnan(out[:2])) and np.all(np.isfinite(out[2:]))


class TestVarianceFilter:
  # Groups: 0 = {0, 0} (σ 0), 1 = {0, 2} (σ √2), 2 = {0, 4} (σ 2√2), 3 = {1, 2} (σ 1/√2).
  scores = jnp.array([0.0, 0.0, 0.0, 2.0, 0.0, 4.0, 1.0, 2.0])
  gid = jnp.array([0, 0, 1, 1, 2, 2, 3, 3], jnp.int32)

  def test_keep_ratio_one_keeps_everything(self):
    assert np.all(FILTER(self.scores, self.gid, keep_ratio=1.0))

  @pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
  def test_keeps_top_groups(self, jit):
    fn = _maybe_jit(group.variance_filter, jit, keep_ratio=0.5)
    # ⌊0.5 · 4⌋ = 2 groups kept: the two largest σ, groups 2 and 1.
    np.testing.assert_array_equal(fn(self.scores, self.gid), [0, 0, 1, 1, 1, 1, 0, 0])
    rev = _maybe_jit(group.variance_filter, jit, keep_ratio=0.25, mode="std_rev")
    np.testing.assert_array_equal(rev(self.scores, self.gid), [1, 1, 0, 0, 0, 0, 0, 0])

  def test_whole_groups_and_order_on_random_input(self):
    rng = np.random.RandomState(0)
    scores = rng.randn(40).astype(np.float32)
    gid = rng.randint(0, 10, 40).astype(np.int32)
    keep = np.asarray(FILTER(scores, gid, keep_ratio=0.3))
    std = np.asarray(STATS(scores, gid, 40).std)
    for g in np.unique(gid):
      assert keep[gid == g].all() or not keep[gid == g].any()
    kept, dropped = np.unique(gid[keep]), np.setdiff1d(np.unique(gid), gid[keep])
    assert len(kept) == int(0.3 * len(np.unique(gid)))
    assert std[kept].min() >= std[dropped].max()

  def test_rejects_bad_arguments(self):
    with pytest.raises(ValueError, match="keep_ratio"):
      group.variance_filter(self.scores, self.gid, keep_ratio=0.0)
    with pytest.raises(ValueError, match="mode"):
      group.variance_filter(self.scores, self.gid, mode="var")


def test_contiguous_groups_match_segment_version():
  # Hand case: one group [1, 3] → mean 2, unbiased std sqrt(2) → A = ∓1/1.41421 = ∓0.70711.
  np.testing.assert_allclose(
      group.contiguous_group_relative_advantages(jnp.asarray([1.0, 3.0]), 2), [-0.70711, 0.70711],
      atol=1e-5)
  rng = np.random.default_rng(0)
  for n in (1, 2, 5):
    scores = rng.standard_normal(6 * n).astype(np.float32)
    gid = np.arange(6 * n) // n
    for normalize in (True, False):
      want = group.group_relative_advantages(scores, gid, 6, normalize_by_std=normalize)
      got = jax.jit(group.contiguous_group_relative_advantages, static_argnums=(1, 2))(
          jnp.asarray(scores), n, normalize)
      np.testing.assert_allclose(got, want, atol=1e-5)
  with pytest.raises(ValueError, match="groups of 4"):
    group.contiguous_group_relative_advantages(jnp.zeros(6), 4)
