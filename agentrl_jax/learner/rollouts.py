"""Where each iteration's batch comes from: this host's share of the episodes, played now or
one batch ahead, with the sampler's copy of the policy in its own layout."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

import jax
import jax.numpy as jnp

from agentrl_jax import types
from agentrl_jax.learner import configs
from agentrl_jax.parallel import multihost
from agentrl_jax.parallel import rules as rules_lib
from agentrl_jax.rollout import loop as loop_lib


def task_batch(config: configs.TrainConfig, iteration: int) -> tuple[list[int], list[int]]:
  """Episode seeds and group ids of one iteration: each task played `group_size` times."""
  first = iteration * config.tasks_per_iteration
  seeds = [first + t for t in range(config.tasks_per_iteration) for _ in range(config.group_size)]
  groups = [t for t in range(config.tasks_per_iteration) for _ in range(config.group_size)]
  return seeds, groups


def collect_share(runner, strategy, make_env, batch_envs, config: configs.TrainConfig,
                  iteration: int, params, key) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
  """This host's share of the iteration's episodes, each sampled as its global row would be."""
  seeds, groups = task_batch(config, iteration)
  share = multihost.host_share(len(seeds))
  seeds, groups = seeds[share], groups[share]
  row_ids = list(range(share.start, share.stop))
  if strategy is None:
    return runner.collect(batch_envs(len(seeds)), seeds, groups, params=params, rng=key,
                          row_ids=row_ids)
  return strategy.collect(runner, make_env, seeds, groups, params=params, rng=key, row_ids=row_ids)


class Rollouts:
  """Plays each iteration's batch: synchronously, or (max_staleness=1) one batch ahead.

  Pipelined, `get(k)` starts batch k+1 in a background thread with the policy as it is before
  update k, then returns batch k (played the same way during update k−1), so sampling overlaps
  the update. The sampling copy is taken before the update donates the state's buffers.
  """

  def __init__(self, collect: Callable[[int, Any], tuple], sampling_params: Callable[[Any], Any],
               max_staleness: int, num_iterations: int):
    self._collect = collect
    self._sampling_params = sampling_params
    self._ahead = max_staleness > 0
    self._num_iterations = num_iterations
    self._executor = concurrent.futures.ThreadPoolExecutor(1) if self._ahead else None
    self._pending: tuple[int, concurrent.futures.Future] | None = None

  def get(self, iteration: int, params) -> tuple[types.Trajectories, loop_lib.RolloutStats, int]:
    """(batch, stats, policy lag in updates) for `iteration`; `params` is the current policy."""
    current = self._sampling_params(params)
    if self._pending is not None and self._pending[0] == iteration:
      (traj, stats), lag = self._pending[1].result(), 1
    else:  # the first batch of a run (or of a resumed run) is played now
      (traj, stats), lag = self._collect(iteration, current), 0
    self._pending = None
    if self._ahead and iteration + 1 < self._num_iterations:
      snapshot = jax.tree.map(jnp.copy, current)
      self._pending = (iteration + 1, self._executor.submit(self._collect, iteration + 1, snapshot))
    return traj, stats, lag

  def close(self) -> None:
    if self._executor is not None:
      self._executor.shutdown(wait=True, cancel_futures=True)


def env_source(runner: loop_lib.RolloutRunner, rollout: loop_lib.RolloutConfig,
                config: configs.TrainConfig, make_env) -> Callable[[int], list]:
  """`n -> envs` for one batch. Worker processes own their envs, so under kind='process' the
  batch's envs are built there once and reused (each collect resets them); threads get fresh ones."""
  if rollout.workers.kind != "process":
    return lambda n: [make_env() for _ in range(n)]
  pool: list = []

  def batch_envs(n: int) -> list:
    while len(pool) < n:
      pool.append(runner.make_env(config.env_name, **config.env_kwargs))
    return pool[:n]

  return batch_envs


def sampling_layout(params, device_mesh) -> Callable[[Any], Any]:
  """`params -> params` as the sampler should hold them.

  On one process with a mesh: resharded to the 'sample' rules (split over tensor only), so
  decoding a token never all-gathers fsdp shards. Across processes: a whole local copy per host.
  """
  if jax.process_count() > 1:
    return multihost.local_replica
  if device_mesh is None:
    return lambda p: p
  shardings = rules_lib.param_shardings(params, device_mesh, rules_lib.logical_rules("sample"))
  return lambda p: jax.device_put(p, shardings)
