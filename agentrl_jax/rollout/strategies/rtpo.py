"""RTPO — reverse-turn policy optimisation on sparse reverse trees (docs/methods.md#rtpo).

One iteration: sample `num_roots` root episodes per task with the policy, recording every turn's
token-exact prefix and the env state there. Then, for turn k = K_max − 1 down to 0, pick at most
`max_prefixes` roots per task that reached turn k; from each such prefix (the root's tokens up to
and including observation k, its env state by deep copy) sample `branches` turn-k actions and play
each to the end with the *current* policy — already updated on every turn after k. The group of
a prefix's branches gives turn-level advantages A = (G − mean G)/(std G + ε) (GRPO on the
prefix group), and one PPO update (`learner/step.py`, unchanged) trains the turn-k action tokens
only, on the exact prefix tokens they were sampled after.

The depth-k batch has a fixed number of rows (tasks × max_prefixes × branches; unused rows are
empty and carry no loss), so the sampler and the update compile once per length bucket.

Differences from the spec's formalisation: the continuation's KV cache is rebuilt from the prefix
tokens under the updated parameters (the prefix tokens are the root's, bit for bit); the return G
is the episode's total reward (the prefix part is shared by the group, so the advantage is the
same as for the return from turn k).

The sampling side lives here; the trainer that owns the schedule is `offline/rtpo.py`
(`learner.run.entry = @rtpo.train`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout.strategies import common

_PREFIX_SALT = 0x9E7
_DEPTH_SALT = 0xD39


@dataclasses.dataclass
class Roots:
  """Root episodes at full `max_len` and each row's env state at the start of every turn.

  Attributes:
    traj: host Trajectories [B, max_len].
    snapshots: snapshots[b][k] = deep copy of row b's env before its turn-k action (None where
      the row did not reach turn k).
    stats: rollout counters.
  """

  traj: types.Trajectories
  snapshots: list
  stats: loop_lib.RolloutStats


def sample_roots(runner: loop_lib.RolloutRunner, make_env: common.MakeEnv, seeds: Sequence[int],
                 group_ids: Sequence[int], *, params, rng: jax.Array,
                 row_ids: Sequence[int] | None = None) -> Roots:
  """Plays the root episodes with plain sampling, snapshotting each env before every action."""
  row_ids = common.check_inputs(seeds, group_ids, row_ids)
  start_time = time.perf_counter()
  tool = common.tools(runner)
  batch = common.start(runner, [make_env() for _ in seeds], seeds, group_ids, row_ids)
  stats = loop_lib.RolloutStats(episodes=len(seeds))
  snapshots = [[None] * runner.config.max_turns for _ in seeds]
  for turn in range(runner.config.max_turns):
    common.append_observations(runner, batch, turn, stats)
    if not batch.active.any():
      break
    for i in np.flatnonzero(batch.active):
      snapshots[i][turn] = copy.deepcopy(batch.envs[i])
    draw = common.sample_turn(tool, params, batch, turn, common.turn_key(rng, turn))
    common.play_turn(runner, tool, batch, draw, turn, stats)
  common.close(runner, batch, stats)
  stats.seconds = time.perf_counter() - start_time
  return Roots(traj=batch.traj, snapshots=snapshots, stats=stats)


def choose_prefixes(traj: types.Trajectories, depth: int, max_prefixes: int,
                    key: jax.Array) -> np.ndarray:
  """Root rows that reached turn `depth` (played its action), at most `max_prefixes` per group,
  chosen uniformly at random; sorted."""
  reached = np.asarray(traj.turn_mask)[:, depth] & ~np.asarray(traj.env_error).any(axis=1)
  order = np.asarray(jax.random.permutation(jax.random.fold_in(key, depth), traj.batch_size))
  chosen, per_group = [], {}
  for b in order:
    g = int(traj.group_id[b])
    if reached[b] and per_group.get(g, 0) < max_prefixes:
      chosen.append(int(b))
      per_group[g] = per_group.get(g, 0) + 1
  return np.sort(np.asarray(chosen, np.int64))


def _prefix_rows(roots: Roots, rows: np.ndarray, depth: int, size: int) -> types.Trajectories:
  """Host buffers [size, max_len] whose first len(rows) rows hold the roots' prefixes up to and
  including observation `depth` (its action and everything after erased)."""
  src = roots.traj
  out = types.empty_trajectories(size, src.max_len, src.max_turns)
  n = len(rows)
  cut = src.turn_start[rows, depth]
  keep = np.arange(src.max_len)[None] < cut[:, None]
  out.tokens[:n] = np.where(keep, src.tokens[rows], 0)
  out.action_mask[:n] = keep & src.action_mask[rows]
  out.turn_of_token[:n] = np.where(keep, src.turn_of_token[rows], -1)
  out.sample_logprob[:n] = np.where(keep, src.sample_logprob[rows], 0.0)
  earlier = np.arange(src.max_turns)[None] < depth
  for name in ("reward", "obs_hash", "action_valid", "turn_start", "turn_end", "turn_mask"):
    getattr(out, name)[:n] = np.where(earlier, getattr(src, name)[rows], 0)
  out.outcome[:n] = out.reward[:n].sum(axis=1)
  out.extras[extra_keys.INITIAL_OBS_HASH_KEY] = np.zeros((size,), np.int32)
  out.extras[extra_keys.INITIAL_OBS_HASH_KEY][:n] = src.extras[extra_keys.INITIAL_OBS_HASH_KEY][rows]
  return out


@dataclasses.dataclass
class DepthBatch:
  """The depth-k training batch and where its rows come from.

  Attributes:
    depth: k.
    traj: host Trajectories trimmed to a length bucket; action_mask covers turn-k actions only.
    prefix_root: [R] root row of each row's prefix (−1 for empty rows).
    prefix_len: [R] tokens of the shared prefix (up to and including observation k).
    stats: rollout counters of the continuations.
  """

  depth: int
  traj: types.Trajectories
  prefix_root: np.ndarray
  prefix_len: np.ndarray
  stats: loop_lib.RolloutStats


def sample_depth(runner: loop_lib.RolloutRunner, roots: Roots, prefixes: np.ndarray, depth: int,
                 *, branches: int, size: int, params, rng: jax.Array) -> DepthBatch:
  """Samples `branches` turn-`depth` actions from each prefix and plays them out with `params`.

  Rows p·M .. p·M + M − 1 branch from prefix p and form group p; rows past the prefixes stay
  empty (each its own group, no tokens, no loss).
  """
  start_time = time.perf_counter()
  tool = common.tools(runner)
  m = branches
  rows = np.repeat(prefixes, m)
  if len(rows) > size:
    raise ValueError(f"sample_depth: {len(prefixes)} prefixes x {m} branches exceed {size} rows")
  n = len(rows)
  traj = _prefix_rows(roots, rows, depth, size)
  traj.group_id[:] = np.arange(size, dtype=np.int32)
  traj.group_id[:n] = np.repeat(np.arange(len(prefixes), dtype=np.int32), m)
  src = roots.traj
  obs_start = src.turn_end[rows, depth - 1] if depth > 0 else np.zeros(n, np.int32)
  cut = src.turn_start[rows, depth]
  prefix_len = np.zeros(size, np.int32)
  prefix_len[:n] = cut
  cached = np.zeros(size, np.int32)
  cached[:n] = obs_start
  active = np.zeros(size, bool)
  active[:n] = True
  batch = common.RowBatch(
      traj=traj, envs=[copy.deepcopy(roots.snapshots[r][depth]) for r in rows] + [None] * (size - n),
      observations=[None] * size,
      chunks=[list(src.tokens[r, s:c]) for r, s, c in zip(rows, obs_start, cut)] + [[]] * (size - n),
      active=active, cursor=prefix_len.copy(),
      # The prefix is re-encoded under the current parameters, up to observation k (pending).
      cache=common.prefilled_cache(tool, params, traj, cached),
      row_ids=np.arange(size, dtype=np.int32))
  stats = loop_lib.RolloutStats(episodes=n)
  for turn in range(depth, runner.config.max_turns):
    if turn > depth:
      common.append_observations(runner, batch, turn, stats)
    if not batch.active.any():
      break
    draw = common.sample_turn(tool, params, batch, turn, common.turn_key(rng, turn))
    common.play_turn(runner, tool, batch, draw, turn, stats)
  common.close(runner, batch, stats)
  stats.seconds = time.perf_counter() - start_time
  out = batch.traj
  only_k = out.action_mask & (out.turn_of_token == depth)
  out = out.replace(action_mask=only_k, sample_logprob=np.where(only_k, out.sample_logprob, 0.0))
  root = np.full(size, -1, np.int64)
  root[:n] = rows
  return DepthBatch(depth=depth, traj=common.trim_to_bucket(runner, out), prefix_root=root,
                    prefix_len=prefix_len, stats=stats)


def reverse_depths(roots: Roots) -> list[int]:
  """K_max − 1, ..., 0 over the turns any root reached."""
  played = np.asarray(roots.traj.turn_mask).any(axis=0)
  k_max = int(np.flatnonzero(played)[-1]) + 1 if played.any() else 0
  return list(range(k_max - 1, -1, -1))


def rtpo_iteration(runner: loop_lib.RolloutRunner, make_env: common.MakeEnv, update,
                   state: types.ActorCriticState, seeds: Sequence[int], group_ids: Sequence[int],
                   *, max_prefixes: int, branches: int, num_tasks: int, rng: jax.Array,
                   on_depth=None):
  """One RTPO iteration: roots, then one update per turn in decreasing turn order.

  Args:
    update: `step.make_update_fn(...)` with the group advantage as its `advantage_fn`.
    seeds, group_ids: the roots (num_tasks × num_roots rows).
    max_prefixes, branches: P_max prefixes per task and turn, M continuations of each.
    on_depth: optional callback(DepthBatch, state before its update) (tests, diagnostics).
  Returns:
    (state, roots, list of per-depth metric dicts in update order).
  """
  roots = sample_roots(runner, make_env, seeds, group_ids, params=state.policy_params,
                       rng=jax.random.fold_in(rng, 0))
  size = num_tasks * max_prefixes * branches
  prefix_key = jax.random.fold_in(rng, _PREFIX_SALT)
  history = []
  for depth in reverse_depths(roots):
    prefixes = choose_prefixes(roots.traj, depth, max_prefixes, prefix_key)
    if not prefixes.size:
      continue
    batch = sample_depth(runner, roots, prefixes, depth, branches=branches, size=size,
                         params=state.policy_params,
                         rng=jax.random.fold_in(jax.random.fold_in(rng, _DEPTH_SALT), depth))
    if on_depth is not None:
      on_depth(batch, state)
    state, metrics = update(state, jax.tree.map(jnp.asarray, batch.traj))
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics.update({"rtpo/depth": depth, "rtpo/prefixes": len(prefixes),
                    "rtpo/branch_success": float(np.mean(batch.traj.success[:len(prefixes) * branches]))})
    history.append(metrics)
  return state, roots, history


