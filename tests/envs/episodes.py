"""Playing whole episodes in env tests: one loop, any policy."""

from typing import Callable

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.rollout import loop


def play(env: base.TextEnv, seed: int, act: Callable[[base.TextEnv], str]) -> list[base.StepResult]:
  """Resets `env` with `seed` and steps `act(env)` until the episode ends; returns every step."""
  env.reset(seed)
  results = []
  while not results or not results[-1].done:
    results.append(env.step(act(env)))
  return results


def expert_final(env: base.TextEnv, seed: int) -> base.StepResult:
  """The last step of the env's own expert playing `seed`."""
  return play(env, seed, lambda e: e.expert_action())[-1]


def noisy_expert_wins(env: base.TextEnv, seeds, noise: float = 0.3) -> int:
  """Plays `seeds` with `loop.noisy_expert(noise)` (generator seed 0), checking that every
  action is valid and every episode is won; returns how many actions were not the expert's."""
  act = loop.noisy_expert(noise)
  rng = np.random.default_rng(0)
  drawn = 0
  for seed in seeds:
    env.reset(seed)
    while not env.done:
      expert = env.expert_action()
      action = act(env, rng)
      drawn += action != expert
      result = env.step(action)
      assert result.info["action_valid"], (seed, action)
    assert result.info["success"], seed
  return drawn
