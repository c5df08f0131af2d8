"""Fault-isolated env stepping: a pool that steps many envs at once with a per-step timeout.

An env that raises, hangs past the timeout, or returns something that is not a `StepResult`
with a string observation produces a `StepFault` for its own row; the batch goes on. The rollout
loop turns a fault into `env_error` for that trajectory (counted, excluded from the loss).

Threads suit envs that release the GIL or wait on I/O (a Java engine, SQLite, a sleep); a hung
thread cannot be killed, so it is abandoned and its env is never stepped again.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import numbers
from typing import Any, Sequence

from agentrl_jax.envs import base as envs_base


@dataclasses.dataclass(frozen=True)
class StepFault:
  """Why an env step failed: 'exception', 'timeout' or 'garbage', with a one-line detail."""

  kind: str
  detail: str


def checked_result(result: Any) -> envs_base.StepResult | StepFault:
  """Accepts a well-formed step result, or names what is wrong with it."""
  if not isinstance(result, tuple) or len(result) != 4:
    return StepFault("garbage", f"step returned {type(result).__name__}, not a StepResult")
  observation, reward, done, info = result
  if not isinstance(observation, str):
    return StepFault("garbage", f"observation is a {type(observation).__name__}, not a str")
  if not isinstance(reward, numbers.Real) or reward != reward:
    return StepFault("garbage", f"reward {reward!r} is not a finite number")
  if not isinstance(info, dict):
    return StepFault("garbage", f"info is a {type(info).__name__}, not a dict")
  return envs_base.StepResult(observation, float(reward), bool(done), info)


def _safe_step(env, action: str) -> envs_base.StepResult | StepFault:
  try:
    return checked_result(env.step(action))
  except Exception as e:  # pylint: disable=broad-except
    return StepFault("exception", f"{type(e).__name__}: {e}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
  """How envs are stepped.

  Attributes:
    num_threads: 0 steps envs one after another in the caller's thread (no timeout is possible);
      > 0 steps them concurrently in that many threads.
    step_timeout_s: a step slower than this is a 'timeout' fault (threads only).
  """

  num_threads: int = 0
  step_timeout_s: float = 30.0

  def __post_init__(self):
    if self.num_threads < 0:
      raise ValueError(f"WorkerConfig.num_threads must be >= 0, got {self.num_threads}")
    if self.step_timeout_s <= 0:
      raise ValueError(f"WorkerConfig.step_timeout_s must be > 0, got {self.step_timeout_s}")


class EnvStepper:
  """Steps the given envs with their actions; returns a result or a fault per env."""

  def __init__(self, config: WorkerConfig = WorkerConfig()):
    self.config = config
    self._pool = (concurrent.futures.ThreadPoolExecutor(config.num_threads, "env")
                  if config.num_threads else None)

  def step(self, envs: Sequence[Any], actions: Sequence[str]
           ) -> list[envs_base.StepResult | StepFault]:
    if self._pool is None:
      return [_safe_step(env, action) for env, action in zip(envs, actions)]
    futures = [self._pool.submit(_safe_step, env, action) for env, action in zip(envs, actions)]
    done, _ = concurrent.futures.wait(futures, timeout=self.config.step_timeout_s)
    return [f.result() if f in done else
            StepFault("timeout", f"step took longer than {self.config.step_timeout_s} s")
            for f in futures]

  def close(self) -> None:
    if self._pool is not None:
      # Hung steps cannot be interrupted; do not wait for them.
      self._pool.shutdown(wait=False, cancel_futures=True)
