"""RTPO's trainer: reverse-turn policy optimisation on sparse reverse trees (docs/methods.md#rtpo).

The tree sampling and the per-depth iteration are `rollout/strategies/rtpo.py`; this module owns
the schedule: one PPO update (`learner/step.py`, unchanged) per turn depth, in decreasing turn
order, with GRPO over each prefix's branches as the advantage.

Entry point for `experiments/run.py`: `learner.run.entry = @rtpo.train`.
"""

from __future__ import annotations

import dataclasses
import functools

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import transformer
from agentrl_jax.offline import common as offline_common
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout.strategies import rtpo as rtpo_tree


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RTPOConfig:
  """The reverse tree (defaults: the spec's, our choices).

  Attributes:
    num_roots: N_root root episodes per task.
    branches: M turn-k actions sampled from each chosen prefix (the advantage group).
    max_prefixes: P_max prefixes per task and turn.
    eps: ε of the group normalisation.
  """

  num_roots: int = 4
  branches: int = 4
  max_prefixes: int = 2
  eps: float = 1e-6

  def __post_init__(self):
    config_errors.check_field_types(self)
    for name in ("num_roots", "branches", "max_prefixes"):
      if getattr(self, name) < 1:
        raise ValueError(f"RTPOConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.eps <= 0:
      raise ValueError(f"RTPOConfig.eps must be > 0, got {self.eps}")


def make_rtpo_update(graphdef, optimizer, loss: step_lib.LossConfig, *, allowed, temperature: float,
                     max_actions: int, num_groups: int, eps: float):
  """The PPO update of `learner/step.py` with GRPO over prefix groups as the advantage."""
  grpo = estimators.get_estimator("grpo")
  return step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optimizer,
      critic_optimizer=None, advantage_fn=functools.partial(grpo, num_groups=num_groups, eps=eps),
      loss=loss, allowed=allowed, temperature=temperature, max_actions=max_actions)


def train(workdir: str, *, config: configs.TrainConfig = configs.TrainConfig(),
          model: transformer.TransformerConfig | None = None,
          rollout: loop_lib.RolloutConfig = loop_lib.RolloutConfig(),
          loss: step_lib.LossConfig = step_lib.LossConfig(),
          optim: configs.OptimConfig = configs.OptimConfig(),
          rtpo: RTPOConfig = RTPOConfig(),
          warm_start: configs.WarmStartConfig = configs.WarmStartConfig(),
          evaluation: configs.EvalConfig = configs.EvalConfig(),
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None) -> driver.Outcome:
  """Runs `num_iterations` RTPO iterations of `tasks_per_iteration` tasks.

  `config.group_size` is not used: each task gets `rtpo.num_roots` roots and every prefix group
  `rtpo.branches` continuations. The optimizer schedule counts one step per depth update
  (at most `rollout.max_turns` per iteration).
  """
  setup, params = offline_common.resolve(config, model, rollout, tokenizer_path)
  optimizer = assembly.make_optimizer(optim, config.num_iterations * setup.rollout.max_turns)
  size = config.tasks_per_iteration * rtpo.max_prefixes * rtpo.branches
  update = make_rtpo_update(setup.graphdef, optimizer, loss, allowed=setup.allowed,
                            temperature=setup.temperature, max_actions=setup.max_actions,
                            num_groups=size, eps=rtpo.eps)
  base_key = jax.random.key(config.seed)
  # A copy of the key data: the update donates the state, and `base_key` is used again.
  state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                 rng=jnp.array(jax.random.key_data(base_key)), policy_params=params,
                                 policy_opt_state=optimizer.init(params))
  method = RTPOMethod(setup=setup, config=config, rtpo=rtpo, update=update, base_key=base_key)
  return offline_common.drive(workdir, method, state, setup=setup, config=config,
                              warm=warm_start, evaluation=evaluation, hooks=hooks)


class RTPOMethod(offline_common.PolicyMethod):
  """One RTPO iteration: root episodes, then one update per turn depth from the last back."""

  name = "rtpo"

  def __init__(self, *, setup, config, rtpo: RTPOConfig, update, base_key):
    self._setup, self._config, self._rtpo = setup, config, rtpo
    self._update, self._base_key = update, base_key

  def iteration(self, state, iteration: int) -> driver.IterationResult:
    tasks, rtpo = self._config.tasks_per_iteration, self._rtpo
    first = iteration * tasks
    seeds = [first + t for t in range(tasks) for _ in range(rtpo.num_roots)]
    groups = [t for t in range(tasks) for _ in range(rtpo.num_roots)]
    state, roots, history = rtpo_tree.rtpo_iteration(
        self._setup.runner, self._setup.make_env, self._update, state, seeds, groups,
        max_prefixes=rtpo.max_prefixes, branches=rtpo.branches, num_tasks=tasks,
        rng=jax.random.fold_in(self._base_key, iteration + 1))
    metrics = {"train/success": float(np.mean(roots.traj.success)),
               "train/outcome": float(np.mean(roots.traj.outcome)),
               "train/turns": float(np.mean(roots.traj.turn_mask.sum(axis=1))),
               "rtpo/depth_updates": len(history), **roots.stats.as_metrics()}
    for key in history[0] if history else ():
      if key.startswith(("loss/", "credit/", "rollout/logprob_drift")):
        metrics[key] = float(np.mean([h[key] for h in history]))
    return driver.IterationResult(state, metrics, roots.traj)
