"""Held-out evaluation: greedy success and sampled pass@k on seeds never used for training."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from agentrl_jax.envs import base as envs_base
from agentrl_jax.learner import configs
from agentrl_jax.parallel import multihost
from agentrl_jax.rollout import loop as loop_lib


def held_out_seeds(config: configs.EvalConfig, count: int) -> list[int]:
  return [config.seed_offset + i for i in range(count)]


def evaluate(params, *, greedy: loop_lib.RolloutRunner, sampled: loop_lib.RolloutRunner,
             make_env: Callable[[], envs_base.TextEnv], config: configs.EvalConfig,
             rng: jax.Array) -> dict[str, float]:
  """Plays the held-out tasks greedily, then `pass_k` sampled attempts on the first tasks.

  Returns metrics under `eval/`: greedy success rate, pass@k, mean turns, invalid-action rate.
  With several processes each plays its share of the episodes and the results are combined.
  """
  seeds = held_out_seeds(config, config.num_tasks)
  played = _play_share(greedy, make_env, seeds, list(range(len(seeds))), params, rng,
                       config.batch_size)
  per_episode = multihost.gather_rows({"success": played.success.astype(np.float32),
                                       "turns": played.turns.astype(np.float32)})
  counts = multihost.gather_rows(np.asarray([[played.invalid_actions, played.total_turns]])).sum(axis=0)
  metrics = {
      "eval/greedy_success": float(np.mean(per_episode["success"])),
      "eval/mean_turns": float(np.mean(per_episode["turns"])),
      "eval/invalid_action_rate": float(counts[0] / max(counts[1], 1)),
  }
  if config.pass_k and config.pass_k_tasks:
    tasks = seeds[:config.pass_k_tasks]
    attempt_seeds = [s for s in tasks for _ in range(config.pass_k)]
    groups = [i for i in range(len(tasks)) for _ in range(config.pass_k)]
    played = _play_share(sampled, make_env, attempt_seeds, groups, params,
                         jax.random.fold_in(rng, 1), config.batch_size)
    success = multihost.gather_rows(played.success)
    solved = np.asarray(success).reshape(len(tasks), config.pass_k).any(axis=1)
    metrics[f"eval/pass@{config.pass_k}"] = float(np.mean(solved))
  return metrics


@dataclasses.dataclass(frozen=True)
class _Played:
  """What the metrics read of a process's share of evaluation episodes."""

  success: np.ndarray  # [n] bool
  turns: np.ndarray  # [n] int, turns played per episode
  invalid_actions: int
  total_turns: int


def _play_share(runner: loop_lib.RolloutRunner, make_env, seeds, groups, params, rng,
                batch_size: int | None = None) -> _Played:
  """This process's contiguous share of the episodes, `batch_size` at a time, each sampled as
  its global row would be (the row id keys its sampling, so batching changes nothing)."""
  share = multihost.host_share(len(seeds))
  rows = list(range(share.start, share.stop))
  step = batch_size or max(len(rows), 1)
  success, turns, invalid, total = [], [], 0, 0
  for start in range(0, len(rows), step):
    batch = rows[start:start + step]
    traj, stats = runner.collect([make_env() for _ in batch], [seeds[i] for i in batch],
                                 [groups[i] for i in batch], params=params, rng=rng, row_ids=batch)
    success.append(np.asarray(traj.success))
    turns.append(np.asarray(traj.turn_mask.sum(axis=1)))
    invalid, total = invalid + stats.invalid_actions, total + stats.turns
  return _Played(success=np.concatenate(success) if success else np.zeros((0,), bool),
                 turns=np.concatenate(turns) if turns else np.zeros((0,), np.int64),
                 invalid_actions=invalid, total_turns=total)
