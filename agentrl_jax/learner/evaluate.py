"""Held-out evaluation: greedy success and sampled pass@k on seeds never used for training."""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from agentrl_jax.envs import base as envs_base
from agentrl_jax.learner import configs
from agentrl_jax.rollout import loop as loop_lib


def held_out_seeds(config: configs.EvalConfig, count: int) -> list[int]:
  return [config.seed_offset + i for i in range(count)]


def evaluate(params, *, greedy: loop_lib.RolloutRunner, sampled: loop_lib.RolloutRunner,
             make_env: Callable[[], envs_base.TextEnv], config: configs.EvalConfig,
             rng: jax.Array) -> dict[str, float]:
  """Plays the held-out tasks greedily, then `pass_k` sampled attempts on the first tasks.

  Returns metrics under `eval/`: greedy success rate, pass@k, mean turns, invalid-action rate.
  """
  seeds = held_out_seeds(config, config.num_tasks)
  envs = [make_env() for _ in seeds]
  traj, stats = greedy.collect(envs, seeds, list(range(len(seeds))), params=params, rng=rng)
  metrics = {
      "eval/greedy_success": float(np.mean(traj.success)),
      "eval/mean_turns": float(np.mean(traj.turn_mask.sum(axis=1))),
      "eval/invalid_action_rate": stats.invalid_actions / max(stats.turns, 1),
  }
  if config.pass_k and config.pass_k_tasks:
    tasks = seeds[:config.pass_k_tasks]
    attempt_seeds = [s for s in tasks for _ in range(config.pass_k)]
    groups = [i for i in range(len(tasks)) for _ in range(config.pass_k)]
    envs = [make_env() for _ in attempt_seeds]
    traj, _ = sampled.collect(envs, attempt_seeds, groups, params=params,
                              rng=jax.random.fold_in(rng, 1))
    solved = np.asarray(traj.success).reshape(len(tasks), config.pass_k).any(axis=1)
    metrics[f"eval/pass@{config.pass_k}"] = float(np.mean(solved))
  return metrics
