"""Advantage-estimator benchmarks, reported as ratios against anchors measured in the same run.

GAE over [B, L] float32 at several sizes (default up to 4096 × 2048): our kernels ("blocked", the
default on long rows; the time-major "scan"; "associative") against rlax under vmap, a NumPy
reverse loop over time, and a plain device copy of the input arrays, from which the bandwidth limit
for the bytes the kernel must move (read r, v, mask; write advantages, returns) is derived.
GAE with per-step discounts (2% done flags, episodes ending mid-row) at 4096 × 512: the blocked
kernel against the scan, rlax, the NumPy loop and a copy. Group baselines over 2^20 trajectories
in 2^17 groups: segment-sum GRPO and RLOO, and the same ids in the learner's sorted order (the
reshape fast path), against NumPy `bincount`, a per-sample Python dict loop (verl style) and a
copy of scores and ids. GiGPO anchor grouping on 10^5 steps:
the hash-table `step.step_groups` against the earlier lexsort kernel, NumPy `unique(return_inverse)`
and a dict-hashing Python loop. Every implementation is checked against a reference before it is
timed. Timings are the best of interleaved repeats (the candidates of a table take turns), so a
burst of load on a shared machine hits all of them alike.

Run from the repository root (after `pip install -e .`, or with `PYTHONPATH=.`):

    python bench/advantages.py                 # full sizes, about 40 s on 2 shared CPU cores
    python bench/advantages.py --quick         # small shapes, a few seconds
    python bench/advantages.py --gae_only      # the GAE tables only
"""

from __future__ import annotations

import argparse
import collections
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import rlax

from agentrl_jax.advantages import gae
from agentrl_jax.advantages import group
from agentrl_jax.advantages import step


def _block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if isinstance(a, jax.Array) else a, x)


def best_times(candidates: dict, repeats: int) -> dict[str, float]:
  """Best wall time per candidate over `repeats` interleaved rounds, after one warm-up call each.

  `candidates` maps a name to `(fn, repeats_divisor)`; slow references run every `divisor`-th
  round only (at least once).
  """
  best = {}
  for name, (fn, _) in candidates.items():
    _block(fn())
    best[name] = float("inf")
  for round_index in range(repeats):
    for name, (fn, divisor) in candidates.items():
      if round_index % divisor:
        continue
      start = time.perf_counter()
      _block(fn())
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def print_table(title, times, anchor, note=""):
  anchor_time = times[anchor]
  print(f"\n{title}")
  print(f"  {'implementation':<40} {'time (ms)':>11} {'× ' + anchor:>30}")
  for name, t in times.items():
    print(f"  {name:<40} {1e3 * t:>11.3f} {t / anchor_time:>30.2f}")
  if note:
    print(f"  {note}")


# ---------------------------------------------------------------------------------------------
# GAE


def numpy_gae(rewards, values, mask, discount, lambda_):
  """Reverse loop over time, vectorised over the batch (the §A.1 recursion in NumPy); `discount`
  a scalar or `[B, L]` per-step discounts."""
  b, t_len = rewards.shape
  next_value = np.zeros(b, rewards.dtype)
  last = np.zeros(b, rewards.dtype)
  out = np.zeros_like(rewards)
  per_step = np.ndim(discount) == 2
  for t in range(t_len - 1, -1, -1):
    g = discount[:, t] if per_step else discount
    delta = rewards[:, t] + g * next_value - values[:, t]
    a = delta + g * lambda_ * last
    m = mask[:, t]
    next_value = np.where(m, values[:, t], next_value)
    last = np.where(m, a, last)
    out[:, t] = np.where(m, last, 0.0)
  return out


def bench_gae(batch, length, repeats, seed=0):
  rng = np.random.default_rng(seed)
  rewards = rng.standard_normal((batch, length), np.float32)
  values = rng.standard_normal((batch, length), np.float32)
  # Multi-turn layout: roughly a third of the tokens are observations.
  mask = rng.random((batch, length)) > 0.33
  gamma, lam = 0.99, 0.95
  r, v, m = (jax.device_put(x) for x in (rewards, values, mask))

  ours = {
      method: jax.jit(functools.partial(
          gae.generalized_advantage_estimation, discount=gamma, lambda_=lam, method=method))
      for method in ("blocked", "scan", "associative")
  }
  rlax_gae = jax.jit(jax.vmap(rlax.truncated_generalized_advantage_estimation,
                              in_axes=(0, 0, None, 0)))
  bootstrapped = jnp.concatenate([v, jnp.zeros((batch, 1), v.dtype)], axis=1)
  discounts = jnp.full((batch, length), gamma, jnp.float32)
  copy = jax.jit(lambda *xs: [jnp.copy(x) for x in xs])

  reference = numpy_gae(rewards, values, mask, gamma, lam)
  for method, fn in ours.items():
    np.testing.assert_allclose(np.asarray(fn(r, v, m).advantages), reference, atol=1e-3,
                               err_msg=method)
  full = jnp.ones_like(m)
  np.testing.assert_allclose(np.asarray(rlax_gae(r, discounts, lam, bootstrapped)),
                             np.asarray(ours["scan"](r, v, full).advantages), atol=1e-3)

  loop_divisor = max(1, repeats // 3)
  times = best_times({
      "ours: blocked (default)": (lambda: ours["blocked"](r, v, m), 1),
      "ours: lax.scan, time-major": (lambda: ours["scan"](r, v, m), 1),
      "ours: lax.associative_scan": (lambda: ours["associative"](r, v, m), 1),
      "rlax truncated GAE under vmap": (lambda: rlax_gae(r, discounts, lam, bootstrapped), 1),
      "NumPy reverse loop over L": (lambda: numpy_gae(rewards, values, mask, gamma, lam),
                                    loop_divisor),
      "device copy of r, v, mask": (lambda: copy(r, v, m), 1),
  }, repeats)
  # The kernel reads r, v (4 B each) and mask (1 B) and writes advantages and returns (4 B each):
  # 17 bytes per token; the copy reads and writes r, v, mask: 18 bytes per token.
  limit = times["device copy of r, v, mask"] * 17 / 18
  times["bandwidth limit (17 B/token at copy speed)"] = limit
  ours_time = times["ours: blocked (default)"]
  note = (f"blocked: {times['rlax truncated GAE under vmap'] / ours_time:.2f}× rlax, "
          f"{times['NumPy reverse loop over L'] / ours_time:.1f}× the NumPy loop, "
          f"{ours_time / limit:.1f}× the bandwidth limit (targets ≥ 2, ≥ 20, ≤ 2)")
  print_table(f"GAE [{batch}, {length}] float32, γ={gamma}, λ={lam}", times,
              "bandwidth limit (17 B/token at copy speed)", note)
  return times


def bench_gae_terminations(batch, length, repeats, done_rate=0.02, seed=0):
  """GAE with per-step discounts γ·(1 − done): episodes that end inside a row."""
  rng = np.random.default_rng(seed)
  rewards = rng.standard_normal((batch, length), np.float32)
  values = rng.standard_normal((batch, length), np.float32)
  mask = np.ones((batch, length), bool)
  gamma, lam = 0.99, 0.95
  discount = (gamma * (rng.random((batch, length)) >= done_rate)).astype(np.float32)
  r, v, m, d = (jax.device_put(x) for x in (rewards, values, mask, discount))
  ours = {method: jax.jit(functools.partial(gae.generalized_advantage_estimation, lambda_=lam,
                                            method=method))
          for method in ("auto", "scan")}
  rlax_gae = jax.jit(jax.vmap(rlax.truncated_generalized_advantage_estimation,
                              in_axes=(0, 0, None, 0)))
  bootstrapped = jnp.concatenate([v, jnp.zeros((batch, 1), v.dtype)], axis=1)
  copy = jax.jit(lambda *xs: [jnp.copy(x) for x in xs])

  reference = numpy_gae(rewards, values, mask, discount, lam)
  for method, fn in ours.items():
    np.testing.assert_allclose(np.asarray(fn(r, v, m, d).advantages), reference, atol=1e-3,
                               err_msg=method)
  np.testing.assert_allclose(np.asarray(rlax_gae(r, d, lam, bootstrapped)), reference, atol=1e-3)

  loop_divisor = max(1, repeats // 3)
  times = best_times({
      "ours: blocked, per-step γ (auto)": (lambda: ours["auto"](r, v, m, d), 1),
      "ours: lax.scan, time-major": (lambda: ours["scan"](r, v, m, d), 1),
      "rlax truncated GAE under vmap": (lambda: rlax_gae(r, d, lam, bootstrapped), 1),
      "NumPy reverse loop over L": (lambda: numpy_gae(rewards, values, mask, discount, lam),
                                    loop_divisor),
      "device copy of r, v, mask, discount": (lambda: copy(r, v, m, d), 1),
  }, repeats)
  # Reads r, v, discount (4 B each) and mask (1 B), writes advantages and returns: 21 B/token;
  # the copy reads and writes all four inputs: 26 B/token.
  limit = times["device copy of r, v, mask, discount"] * 21 / 26
  times["bandwidth limit (21 B/token at copy speed)"] = limit
  ours_time = times["ours: blocked, per-step γ (auto)"]
  note = (f"blocked: {times['rlax truncated GAE under vmap'] / ours_time:.2f}× rlax, "
          f"{times['NumPy reverse loop over L'] / ours_time:.1f}× the NumPy loop, "
          f"{ours_time / limit:.1f}× the bandwidth limit (targets ≥ 2, ≥ 20, ≤ 3)")
  print_table(f"GAE [{batch}, {length}] float32, γ_t = {gamma}·(1 − done), "
              f"{done_rate:.0%} done, λ={lam}", times,
              "bandwidth limit (21 B/token at copy speed)", note)
  return times


# ---------------------------------------------------------------------------------------------
# Group baselines


def numpy_grpo(scores, gid, num_groups, eps=1e-6):
  count = np.bincount(gid, minlength=num_groups).astype(np.float64)
  mean = np.bincount(gid, weights=scores, minlength=num_groups) / np.maximum(count, 1)
  sq = np.bincount(gid, weights=(scores - mean[gid]) ** 2, minlength=num_groups)
  std = np.sqrt(sq / np.maximum(count - 1, 1))
  alone = count <= 1
  mean, std = np.where(alone, 0.0, mean), np.where(alone, 1.0, std)
  return (scores - mean[gid]) / (std[gid] + eps)


def numpy_rloo(scores, gid, num_groups):
  count = np.bincount(gid, minlength=num_groups).astype(np.float64)[gid]
  total = np.bincount(gid, weights=scores, minlength=num_groups)[gid]
  return np.where(count > 1, scores - (total - scores) / np.maximum(count - 1, 1), scores)


def dict_loop_grpo(scores, gid, eps=1e-6):
  """Per-sample Python loop with a dict of lists, as verl's `compute_grpo_outcome_advantage`."""
  members = collections.defaultdict(list)
  for s, g in zip(scores.tolist(), gid.tolist()):
    members[g].append(s)
  stats = {}
  for g, vals in members.items():
    n = len(vals)
    if n == 1:
      stats[g] = (0.0, 1.0)
    else:
      mean = sum(vals) / n
      stats[g] = (mean, (sum((v - mean) ** 2 for v in vals) / (n - 1)) ** 0.5)
  return np.array([(s - stats[g][0]) / (stats[g][1] + eps)
                   for s, g in zip(scores.tolist(), gid.tolist())])


def dict_loop_rloo(scores, gid):
  members = collections.defaultdict(list)
  for s, g in zip(scores.tolist(), gid.tolist()):
    members[g].append(s)
  totals = {g: (sum(v), len(v)) for g, v in members.items()}
  out = []
  for s, g in zip(scores.tolist(), gid.tolist()):
    total, n = totals[g]
    out.append(s - (total - s) / (n - 1) if n > 1 else s)
  return np.array(out)


def _timed_once(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def bench_groups(num_trajectories, num_groups, repeats, seed=0):
  rng = np.random.default_rng(seed)
  scores = rng.standard_normal(num_trajectories).astype(np.float32)
  gid = rng.permutation(np.arange(num_trajectories) % num_groups).astype(np.int32)
  s, g = jax.device_put(scores), jax.device_put(gid)
  grpo = jax.jit(functools.partial(group.group_relative_advantages, num_groups=num_groups))
  rloo = jax.jit(functools.partial(group.leave_one_out_advantages, num_groups=num_groups))
  s64 = scores.astype(np.float64)

  want = numpy_grpo(s64, gid, num_groups)
  np.testing.assert_allclose(np.asarray(grpo(s, g)), want, atol=1e-4)
  np.testing.assert_allclose(np.asarray(rloo(s, g)), numpy_rloo(s64, gid, num_groups), atol=1e-4)
  loop_grpo, loop_grpo_time = _timed_once(lambda: dict_loop_grpo(scores, gid))
  np.testing.assert_allclose(loop_grpo, want, atol=1e-4)
  loop_rloo, loop_rloo_time = _timed_once(lambda: dict_loop_rloo(scores, gid))
  np.testing.assert_allclose(loop_rloo, numpy_rloo(s64, gid, num_groups), atol=1e-4)

  # The rollout's own layout: each group's members side by side, equal in number.
  order = np.argsort(gid, kind="stable")
  group_size = num_trajectories // num_groups
  s_sorted = jax.device_put(scores[order])
  contiguous = jax.jit(functools.partial(group.contiguous_group_relative_advantages,
                                         group_size=group_size))
  np.testing.assert_allclose(np.asarray(contiguous(s_sorted)), want[order], atol=1e-4)

  # The same ids in the learner's order (group b // n): group_relative_advantages finds the
  # layout at run time and takes the reshape branch (no segment scatter).
  g_sorted = jax.device_put(gid[order])
  np.testing.assert_allclose(np.asarray(grpo(s_sorted, g_sorted)), want[order], atol=1e-4)
  np.testing.assert_allclose(np.asarray(rloo(s_sorted, g_sorted)),
                             numpy_rloo(s64, gid, num_groups)[order], atol=1e-4)
  copy = jax.jit(lambda *xs: [jnp.copy(x) for x in xs])

  times = best_times({
      "GRPO ours: segment_sum (jit)": (lambda: grpo(s, g), 1),
      "GRPO ours: sorted ids, auto fast path (jit)": (lambda: grpo(s_sorted, g_sorted), 1),
      "GRPO ours: contiguous_group_relative (jit)": (lambda: contiguous(s_sorted), 1),
      "GRPO NumPy bincount": (lambda: numpy_grpo(s64, gid, num_groups), 1),
      "RLOO ours: segment_sum (jit)": (lambda: rloo(s, g), 1),
      "RLOO ours: sorted ids, auto fast path (jit)": (lambda: rloo(s_sorted, g_sorted), 1),
      "RLOO NumPy bincount": (lambda: numpy_rloo(s64, gid, num_groups), 1),
      "device copy of scores, group ids": (lambda: copy(s, g), 1),
  }, repeats)
  times["GRPO Python dict loop (1 run)"] = loop_grpo_time
  times["RLOO Python dict loop (1 run)"] = loop_rloo_time
  # The kernel reads scores and ids and writes advantages (12 B/row); the copy moves 16 B/row.
  limit = times["device copy of scores, group ids"] * 12 / 16
  times["copy limit (12 B/row at copy speed)"] = limit
  fast = times["GRPO ours: sorted ids, auto fast path (jit)"]
  segment = times["GRPO ours: segment_sum (jit)"]
  note = (f"GRPO sorted ids: {fast / limit:.1f}× the copy limit, "
          f"{times['GRPO NumPy bincount'] / fast:.1f}× faster than NumPy bincount (target ≤ 5× "
          f"the limit); segment path: {segment / limit:.1f}× the limit, "
          f"{times['GRPO NumPy bincount'] / segment:.1f}× faster than bincount")
  print_table(f"Group baselines: {num_trajectories} trajectories in {num_groups} groups", times,
              "copy limit (12 B/row at copy speed)", note)
  return times


# ---------------------------------------------------------------------------------------------
# GiGPO anchor grouping


def lexsort_step_groups(group_id, anchor_hash, turn_mask):
  """The earlier kernel: a 3-key lexsort, key changes and a cumsum (dense ids), for comparison."""
  b, n = anchor_hash.shape
  gid = jnp.broadcast_to(group_id[:, None], (b, n)).reshape(-1)
  key = anchor_hash.reshape(-1)
  exists = turn_mask.reshape(-1)
  order = jnp.lexsort((key, gid, ~exists))
  gid_s, key_s, exists_s = gid[order], key[order], exists[order]
  changed = (gid_s[1:] != gid_s[:-1]) | (key_s[1:] != key_s[:-1]) | (exists_s[1:] != exists_s[:-1])
  dense = jnp.cumsum(jnp.concatenate([jnp.zeros(1, jnp.int32), changed.astype(jnp.int32)]))
  return jnp.zeros(b * n, jnp.int32).at[order].set(dense).reshape(b, n)


def numpy_unique_groups(group_id, anchor_hash, turn_mask):
  """Packs (group, hash) into one int64 key (-1 for missing turns); dense ids by np.unique."""
  n = anchor_hash.shape[1]
  key = (np.repeat(group_id.astype(np.int64), n) << 32) | (
      anchor_hash.reshape(-1).astype(np.int64) & 0xFFFFFFFF)
  key = np.where(turn_mask.reshape(-1), key, -1)
  return np.unique(key, return_inverse=True)[1].reshape(anchor_hash.shape)


def dict_loop_groups(group_id, anchor_hash, turn_mask):
  """One pass, one dict from (group, anchor hash) to its first row: the leanest Python loop."""
  n = anchor_hash.shape[1]
  first = {}
  ids = []
  for row, (g, h, exists) in enumerate(zip(np.repeat(group_id, n).tolist(),
                                           anchor_hash.reshape(-1).tolist(),
                                           turn_mask.reshape(-1).tolist())):
    ids.append(first.setdefault((g, h) if exists else None, row))
  return np.array(ids, np.int32).reshape(anchor_hash.shape)


def verl_agent_loop_groups(group_id, anchor_hash, turn_mask):
  """The structure of verl-agent's `build_step_group`, kept linear: rows by group, then per group
  a dict from anchor to member rows, then every member gets its cluster's id (the first row)."""
  n = anchor_hash.shape[1]
  by_group = collections.defaultdict(list)
  for row, (g, exists) in enumerate(zip(np.repeat(group_id, n).tolist(),
                                        turn_mask.reshape(-1).tolist())):
    by_group[g if exists else None].append(row)
  flat_hash = anchor_hash.reshape(-1).tolist()
  ids = np.zeros(anchor_hash.size, np.int32)
  for g, rows in by_group.items():
    clusters = collections.defaultdict(list)
    for row in rows:
      clusters[flat_hash[row] if g is not None else None].append(row)
    for members in clusters.values():
      for row in members:
        ids[row] = members[0]
  return ids.reshape(anchor_hash.shape)


def first_row_ids(ids):
  """Relabels any grouping by the flat index of each group's first row (a canonical form)."""
  flat = np.asarray(ids).reshape(-1)
  _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
  return first[inverse].reshape(np.shape(ids)).astype(np.int32)


def anchor_batch(num_trajectories, max_turns, group_size, num_states, rng):
  """Groups of `group_size` episodes with varying lengths; hashes are random int32s.

  `num_states` given: every episode walks (steps −1, 0, +1) a ring of that many states from state
  0, so a group's episodes share many states. None: every step's hash is random (all distinct).
  """
  gid = np.repeat(np.arange(num_trajectories // group_size, dtype=np.int32), group_size)
  shape = (num_trajectories, max_turns)
  if num_states is None:
    state_hash = rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32)
    states = None
  else:
    state_hash = rng.integers(-2**31, 2**31 - 1, size=num_states, dtype=np.int64).astype(np.int32)
    states = np.cumsum(rng.integers(-1, 2, size=shape), axis=1) % num_states
    states[:, 0] = 0
  lengths = rng.integers(max_turns // 4, max_turns + 1, size=num_trajectories)
  mask = np.arange(max_turns)[None, :] < lengths[:, None]
  return gid, (state_hash if states is None else state_hash[states]), mask


def bench_anchor_groups(num_trajectories, max_turns, repeats, num_states, label, seed=0):
  rng = np.random.default_rng(seed)
  gid, anchors, mask = anchor_batch(num_trajectories, max_turns, 8, num_states, rng)
  g, a, m = (jax.device_put(x) for x in (gid, anchors, mask))
  ours = jax.jit(step.step_groups)
  lexsort = jax.jit(lexsort_step_groups)

  loop_ids = verl_agent_loop_groups(gid, anchors, mask)
  np.testing.assert_array_equal(dict_loop_groups(gid, anchors, mask), loop_ids)
  np.testing.assert_array_equal(np.asarray(ours(g, a, m)), loop_ids)
  # The lexsort kernel splits missing turns by (group, hash); compare on existing turns.
  np.testing.assert_array_equal(first_row_ids(lexsort(g, a, m))[mask], loop_ids[mask])
  np.testing.assert_array_equal(first_row_ids(numpy_unique_groups(gid, anchors, mask)), loop_ids)

  times = best_times({
      "ours: hash table, segment_min (jit)": (lambda: ours(g, a, m), 1),
      "ours before: lexsort + cumsum (jit)": (lambda: lexsort(g, a, m), 1),
      "NumPy unique(return_inverse)": (lambda: numpy_unique_groups(gid, anchors, mask), 1),
      "Python loop, verl-agent structure": (
          lambda: verl_agent_loop_groups(gid, anchors, mask), max(1, repeats // 3)),
      "Python loop, one dict pass": (
          lambda: dict_loop_groups(gid, anchors, mask), max(1, repeats // 3)),
  }, repeats)
  loop_time = times["Python loop, verl-agent structure"]
  lean_time = times["Python loop, one dict pass"]
  ours_time = times["ours: hash table, segment_min (jit)"]
  distinct = len(np.unique(loop_ids[mask]))
  note = (f"{distinct} distinct anchor states; ours: {loop_time / ours_time:.0f}× the verl-agent "
          f"loop ({lean_time / ours_time:.0f}× the one-pass loop), "
          f"{times['NumPy unique(return_inverse)'] / ours_time:.1f}× unique (targets ≥ 50, ≥ 3)")
  print_table(f"GiGPO anchor grouping: {num_trajectories} × {max_turns} = "
              f"{num_trajectories * max_turns} steps, groups of 8, {label}", times,
              "ours: hash table, segment_min (jit)", note)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--quick", action="store_true", help="small shapes for a smoke run")
  parser.add_argument("--gae_only", action="store_true", help="the GAE tables only")
  args = parser.parse_args()
  if args.quick:
    gae_sizes = [(256, 128), (512, 256)]
    group_sizes = (1 << 14, 1 << 11)
    anchor_sizes = (200, 50)
    args.repeats = 3
  else:
    gae_sizes = [(1024, 512), (4096, 512), (4096, 2048)]
    group_sizes = (1 << 20, 1 << 17)
    anchor_sizes = (2000, 50)
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), "
        f"{jax.device_count()} device(s)")
  for batch, length in gae_sizes:
    bench_gae(batch, length, args.repeats)
  for batch, length in gae_sizes[:-1]:
    bench_gae_terminations(batch, length, args.repeats)
  if args.gae_only:
    return
  bench_groups(*group_sizes, args.repeats)
  bench_anchor_groups(*anchor_sizes, args.repeats, num_states=16,
                      label="16-state walk (realistic)")
  bench_anchor_groups(*anchor_sizes, args.repeats, num_states=None,
                      label="random hashes (all distinct)")


if __name__ == "__main__":
  main()
