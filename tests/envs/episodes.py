"""Playing whole episodes in env tests: one loop, any policy."""

from typing import Callable

from agentrl_jax.envs import base


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
