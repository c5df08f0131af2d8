"""Held-out evaluation: greedy success and sampled pass@k on seeds never used for training."""

from __future__ import annotations

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
  traj, stats = _play_share(greedy, make_env, seeds, list(range(len(seeds))), params, rng)
  per_episode = multihost.gather_rows({"success": traj.success.astype(np.float32),
                                       "turns": traj.turn_mask.sum(axis=1).astype(np.float32)})
  counts = multihost.gather_rows(np.asarray([[stats.invalid_actions, stats.turns]])).sum(axis=0)
  metrics = {
      "eval/greedy_success": float(np.mean(per_episode["success"])),
      "eval/mean_turns": float(np.mean(per_episode["turns"])),
      "eval/invalid_action_rate": float(counts[0] / max(counts[1], 1)),
  }
  if config.pass_k and config.pass_k_tasks:
    tasks = seeds[:config.pass_k_tasks]
    attempt_seeds = [s for s in tasks for _ in range(config.pass_k)]
    groups = [i for i in range(len(tasks)) for _ in range(config.pass_k)]
    traj, _ = _play_share(sampled, make_env, attempt_seeds, groups, params, jax.random.fold_in(rng, 1))
    success = multihost.gather_rows(traj.success)
    solved = np.asarray(success).reshape(len(tasks), config.pass_k).any(axis=1)
    metrics[f"eval/pass@{config.pass_k}"] = float(np.mean(solved))
  return metrics


def _play_share(runner: loop_lib.RolloutRunner, make_env, seeds, groups, params, rng):
  """This process's contiguous share of the episodes, each sampled as its global row would be."""
  share = multihost.host_share(len(seeds))
  return runner.collect([make_env() for _ in seeds[share]], seeds[share], groups[share],
                        params=params, rng=rng, row_ids=list(range(share.start, share.stop)))
