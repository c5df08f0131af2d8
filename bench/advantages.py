"""Advantage-estimator benchmarks, reported as ratios against anchors measured in the same run.

GAE over [B, L] (default 4096 × 512, float32): our reverse `lax.scan` and `lax.associative_scan`
kernels against rlax under vmap, a NumPy reverse loop over time, and a plain device copy of the same
input bytes (the memory-bandwidth floor). Group baselines over 2^20 trajectories in 2^17 groups:
our segment-sum GRPO and RLOO against NumPy `bincount` and a per-sample Python dict loop (verl style).
Every implementation is checked against the first one of its table before it is timed.

Run from the repository root (after `pip install -e .`, or with `PYTHONPATH=.`):

    python bench/advantages.py                 # full size
    python bench/advantages.py --quick         # small shapes, a few seconds
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


def _block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if isinstance(a, jax.Array) else a, x)


def best_time(fn, *args, repeats: int) -> float:
  """Best wall time of `repeats` calls after one warm-up call (compilation excluded)."""
  _block(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    _block(fn(*args))
    times.append(time.perf_counter() - start)
  return min(times)


def numpy_gae(rewards, values, mask, discount, lambda_):
  """Reverse loop over time, vectorised over the batch (the §A.1 recursion in NumPy)."""
  b, t_len = rewards.shape
  next_value = np.zeros(b, rewards.dtype)
  last = np.zeros(b, rewards.dtype)
  out = np.zeros_like(rewards)
  for t in range(t_len - 1, -1, -1):
    delta = rewards[:, t] + discount * next_value - values[:, t]
    a = delta + discount * lambda_ * last
    m = mask[:, t]
    next_value = np.where(m, values[:, t], next_value)
    last = np.where(m, a, last)
    out[:, t] = np.where(m, last, 0.0)
  return out


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


def print_table(title, rows, anchor):
  anchor_time = dict((name, t) for name, t in rows)[anchor]
  print(f"\n{title}")
  print(f"  {'implementation':<34} {'time (ms)':>11} {'× ' + anchor:>26}")
  for name, t in rows:
    print(f"  {name:<34} {1e3 * t:>11.3f} {t / anchor_time:>26.2f}")


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
      for method in gae.GAE_METHODS
  }
  rlax_gae = jax.jit(jax.vmap(rlax.truncated_generalized_advantage_estimation,
                              in_axes=(0, 0, None, 0)))
  bootstrapped = jnp.concatenate([v, jnp.zeros((batch, 1), v.dtype)], axis=1)
  discounts = jnp.full((batch, length), gamma, jnp.float32)
  copy = jax.jit(lambda *xs: [jnp.copy(x) for x in xs])

  reference = np.asarray(ours["scan"](r, v, m).advantages)
  np.testing.assert_allclose(np.asarray(ours["associative"](r, v, m).advantages), reference,
                             atol=1e-3)
  np.testing.assert_allclose(numpy_gae(rewards, values, mask, gamma, lam), reference, atol=1e-3)
  full = np.ones_like(mask)
  np.testing.assert_allclose(np.asarray(rlax_gae(r, discounts, lam, bootstrapped)),
                             np.asarray(ours["scan"](r, v, full).advantages), atol=1e-3)

  rows = [
      ("ours: lax.scan (default)", best_time(lambda: ours["scan"](r, v, m), repeats=repeats)),
      ("ours: lax.associative_scan",
       best_time(lambda: ours["associative"](r, v, m), repeats=repeats)),
      ("rlax truncated GAE under vmap",
       best_time(lambda: rlax_gae(r, discounts, lam, bootstrapped), repeats=repeats)),
      ("NumPy reverse loop over L",
       best_time(lambda: numpy_gae(rewards, values, mask, gamma, lam),
                 repeats=max(1, repeats // 3))),
      ("device copy of r, v, mask", best_time(lambda: copy(r, v, m), repeats=repeats)),
  ]
  print_table(f"GAE [{batch}, {length}] float32, γ={gamma}, λ={lam}", rows,
              "device copy of r, v, mask")
  return rows


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

  start = time.perf_counter()
  loop_grpo = dict_loop_grpo(scores, gid)
  loop_grpo_time = time.perf_counter() - start
  np.testing.assert_allclose(loop_grpo, want, atol=1e-4)
  start = time.perf_counter()
  loop_rloo = dict_loop_rloo(scores, gid)
  loop_rloo_time = time.perf_counter() - start
  np.testing.assert_allclose(loop_rloo, numpy_rloo(s64, gid, num_groups), atol=1e-4)

  # The rollout's own layout: each group's members side by side, equal in number.
  order = np.argsort(gid, kind="stable")
  group_size = num_trajectories // num_groups
  s_sorted = jax.device_put(scores[order])
  contiguous = jax.jit(functools.partial(group.contiguous_group_relative_advantages,
                                         group_size=group_size))
  np.testing.assert_allclose(np.asarray(contiguous(s_sorted)), want[order], atol=1e-4)

  rows = [
      ("GRPO ours: segment_sum (jit)", best_time(lambda: grpo(s, g), repeats=repeats)),
      ("GRPO ours: contiguous groups (jit)", best_time(lambda: contiguous(s_sorted),
                                                      repeats=repeats)),
      ("GRPO NumPy bincount",
       best_time(lambda: numpy_grpo(s64, gid, num_groups), repeats=repeats)),
      ("GRPO Python dict loop", loop_grpo_time),
      ("RLOO ours: segment_sum (jit)", best_time(lambda: rloo(s, g), repeats=repeats)),
      ("RLOO NumPy bincount",
       best_time(lambda: numpy_rloo(s64, gid, num_groups), repeats=repeats)),
      ("RLOO Python dict loop", loop_rloo_time),
  ]
  print_table(f"Group baselines: {num_trajectories} trajectories in {num_groups} groups", rows,
              "GRPO ours: segment_sum (jit)")
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=4096)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--trajectories", type=int, default=1 << 20)
  parser.add_argument("--groups", type=int, default=1 << 17)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--quick", action="store_true", help="small shapes for a smoke run")
  args = parser.parse_args()
  if args.quick:
    args.batch, args.length, args.repeats = 256, 128, 3
    args.trajectories, args.groups = 1 << 14, 1 << 11
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), "
        f"{jax.device_count()} device(s)")
  bench_gae(args.batch, args.length, args.repeats)
  bench_groups(args.trajectories, args.groups, args.repeats)


if __name__ == "__main__":
  main()
