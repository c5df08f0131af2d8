"""Tests for agentrl_jax.advantages.group."""

import collections
import functools

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


# ---------------------------------------------------------------------------------------------
# Precision at large offsets (issue #21) and the contiguous-layout fast path (issue #23).

U = 2.0**-14  # the float32 spacing in [512, 1024)


def _float64_reference(scores, group_id, weights=None, eps=1e-6):
  """Vectorised NumPy float64 GRPO, Dr.GRPO and RLOO (bincount sums; n = 1 rules as in verl)."""
  s = np.asarray(scores, np.float64)
  g = np.asarray(group_id)
  w = np.ones_like(s) if weights is None else np.asarray(weights, np.float64)
  size = g.max() + 1
  count = np.bincount(g, weights=w, minlength=size)
  mean = np.bincount(g, weights=w * s, minlength=size) / np.maximum(count, 1e-300)
  squares = np.bincount(g, weights=w * (s - mean[g]) ** 2, minlength=size)
  std = np.sqrt(squares / np.maximum(count - 1, 1e-300))
  n, dev, sd = count[g], s - mean[g], std[g]
  alone = n <= 1
  grpo = np.where(alone, s / (1 + eps), dev / (np.where(alone, 1.0, sd) + eps))
  dr = np.where(alone, s, dev)
  rloo = np.where(alone, s, dev * n / np.maximum(n - 1, 1e-300))
  return [np.where(w > 0, x, 0.0) for x in (grpo, dr, rloo)]


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
@pytest.mark.parametrize("group_id", [[0, 0, 0], [1, 1, 1]], ids=["contiguous", "segment"])
def test_offset_group_keeps_the_precision_of_its_spread(jit, group_id):
  # s = 1000 + [0, u, u], u = 2^-14: exact mean 1000 + 2u/3, deviations [−2u/3, u/3, u/3],
  # unbiased std sqrt(((2u/3)² + 2(u/3)²)/2) = u/√3, so GRPO (eps = 0) gives [−2/√3, 1/√3, 1/√3]
  # and RLOO (×3/2) gives [−u, u/2, u/2]. The float32 sum 3000 + 2u rounds to a multiple of 4u,
  # so a mean taken from it is off by u/3 or 2u/3 — as large as the deviations themselves.
  scores = np.float32(1000.0) + np.array([0.0, U, U], np.float32)
  gid = np.array(group_id, np.int32)
  grpo = _maybe_jit(group.group_relative_advantages, jit, num_groups=2, eps=0.0)
  dr = _maybe_jit(group.group_relative_advantages, jit, num_groups=2, normalize_by_std=False)
  rloo = _maybe_jit(group.leave_one_out_advantages, jit, num_groups=2)
  np.testing.assert_allclose(grpo(scores, gid), np.array([-2, 1, 1]) / 3**0.5, rtol=1e-5)
  np.testing.assert_allclose(dr(scores, gid), np.array([-2, 1, 1]) * U / 3, rtol=1e-5)
  np.testing.assert_allclose(rloo(scores, gid), np.array([-1, 0.5, 0.5]) * U, rtol=1e-5)
  stats = _maybe_jit(group.group_statistics, jit, num_groups=2)(scores, gid)
  np.testing.assert_allclose(stats.std[gid[0]], U / 3**0.5, rtol=1e-5)


def _large_batch(rng, rows, contiguous):
  """10^6-row batch: groups of 8, alternating offset 1000 with a 1e-4 spread and unit scale;
  every 97th group is constant but for one row 0.75 × its scale away (7.5e-5 at offset 1000)."""
  n = 8
  num = rows // n
  offset = np.where(np.arange(num) % 2 == 0, 1000.0, 0.0)
  scale = np.where(np.arange(num) % 2 == 0, 1e-4, 1.0)
  noise = rng.standard_normal((num, n))
  noise[::97, 2:] = 0.0
  noise[::97, :2] = [0.0, 0.75]
  scores = (offset[:, None] + scale[:, None] * noise).astype(np.float32).reshape(-1)
  gid = (np.arange(rows) // n).astype(np.int32)
  if not contiguous:
    perm = rng.permutation(rows)
    scores, gid = scores[perm], gid[perm]
  return scores, gid


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "segment"])
def test_million_rows_match_float64_reference(contiguous):
  rows = 10**6
  scores, gid = _large_batch(np.random.default_rng(0), rows, contiguous)
  weights = (np.random.default_rng(1).random(rows) > 0.1).astype(np.float32)
  for w in (None, weights):
    want_grpo, want_dr, want_rloo = _float64_reference(scores, gid, w)
    # Host ids: the layout is found on the host, no jit needed (and no branches to compile).
    np.testing.assert_allclose(group.group_relative_advantages(scores, gid, weights=w),
                               want_grpo, atol=1e-4)
    np.testing.assert_allclose(
        group.group_relative_advantages(scores, gid, normalize_by_std=False, weights=w),
        want_dr, atol=1e-4)
    np.testing.assert_allclose(group.leave_one_out_advantages(scores, gid, weights=w),
                               want_rloo, atol=1e-4)
  # Under jit the layout is found at run time (lax.switch).
  got = jax.jit(group.group_relative_advantages)(jnp.asarray(scores), jnp.asarray(gid),
                                                 weights=jnp.asarray(weights))
  np.testing.assert_allclose(got, want_grpo, atol=1e-4)


def test_contiguous_group_size_on_host():
  assert group.contiguous_group_size(np.arange(12) // 4) == 4
  assert group.contiguous_group_size(np.arange(12)) == 1
  assert group.contiguous_group_size(np.array([0, 0, 1, 1, 1, 2])) is None  # unequal sizes
  assert group.contiguous_group_size(np.array([0, 1, 0, 1])) is None  # interleaved
  assert group.contiguous_group_size(np.array([1, 1, 2, 2])) is None  # does not start at 0
  assert group.contiguous_group_size(np.array([0, 0, 0, 1, 1])) is None  # 2 ∤ 5


@pytest.mark.parametrize("ids", [
    np.arange(24) // 4,  # contiguous, n = 4: the reshape branch
    np.arange(24) // 6,  # n = 6
    np.r_[np.arange(20) // 4, [5, 5, 5, 5]],  # contiguous but its ids reach 5 < G = 6: reshape
    np.r_[[0, 0, 0], np.arange(3, 24) // 3],  # sorted, first group of 3 then of 3: n = 3
    np.r_[[0, 0, 0, 0, 0], np.arange(5, 24) // 4 + 1],  # sorted, unequal sizes: segments
    (np.arange(24) // 4)[::-1].copy(),  # groups side by side but in reverse order: segments
    np.r_[np.arange(23) // 4, [6]],  # last id is out of range under jit: NaN, not a reshape
], ids=["n4", "n6", "n4-again", "n3", "unequal", "reversed", "out-of-range"])
def test_fast_path_equals_segment_path(ids, monkeypatch):
  monkeypatch.setattr(group, "MIN_TRACED_CONTIGUOUS_ROWS", 0)  # the lax.switch at 24 rows
  rng = np.random.default_rng(0)
  scores = (rng.standard_normal(24) + 100).astype(np.float32)
  weights = (rng.random(24) > 0.3).astype(np.float32)
  gid = ids.astype(np.int32)
  for w in (None, weights):
    want = group._segment_deviations(jnp.asarray(scores), jnp.asarray(gid), 6,
                                     None if w is None else jnp.asarray(w))
    got = jax.jit(functools.partial(group.group_deviations, num_groups=6))(scores, gid, weights=w)
    for name, a, b in zip(want._fields, got, want):
      np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
    if np.all(gid < 6):  # host inputs are checked, so only in-range ids go through here
      host = group.group_deviations(scores, gid, 6, w)
      for name, a, b in zip(want._fields, host, want):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=name)
  assert np.isnan(got.deviation[-1]) == (gid[-1] >= 6)


def test_traced_detection_picks_the_group_size():
  detect = jax.jit(group._traced_contiguous_group_size)
  assert int(detect(jnp.arange(24, dtype=jnp.int32) // 4)) == 4
  assert int(detect(jnp.asarray(np.r_[[0, 0, 0, 0, 0], np.arange(5, 24) // 4 + 1],
                                jnp.int32))) == 0
  assert int(detect(jnp.asarray([0, 1, 0, 1], jnp.int32))) == 0
  assert int(detect(jnp.asarray([0, 0, 0, -1], jnp.int32))) == 0


def test_fast_path_gradient_matches_segment_path():
  rng = np.random.default_rng(2)
  scores = jnp.asarray(rng.standard_normal(12).astype(np.float32))
  gid = np.arange(12, dtype=np.int32) // 4  # host ids: the reshape path, found on the host
  loss = lambda s, g: jnp.sum(jnp.sin(group.leave_one_out_advantages(s, g)))
  segment = lambda s, g: jnp.sum(jnp.sin(
      jnp.where(group._segment_deviations(s, g, 12, None).count > 1,
                group._segment_deviations(s, g, 12, None).deviation * 4 / 3, s)))
  np.testing.assert_allclose(jax.grad(loss)(scores, gid), jax.grad(segment)(scores, gid),
                             atol=1e-5)
