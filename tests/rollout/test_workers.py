"""Env workers: exceptions, hangs and garbage are isolated per env and named."""

import time

import pytest

from agentrl_jax.envs import base
from agentrl_jax.rollout import workers


class _Env:
  def __init__(self, behaviour):
    self.behaviour = behaviour

  def step(self, action):
    if self.behaviour == "raise":
      raise ValueError("boom")
    if self.behaviour == "hang":
      time.sleep(2.0)
    if self.behaviour == "garbage":
      return 42
    if self.behaviour == "nan":
      return base.StepResult("obs", float("nan"), False, {})
    return base.StepResult(f"echo {action}", 1.0, False, {"action_valid": True})


@pytest.mark.parametrize("num_threads", [0, 4])
def test_faults_are_isolated_and_named(num_threads):
  stepper = workers.EnvStepper(workers.WorkerConfig(num_threads=num_threads, step_timeout_s=0.5))
  behaviours = ["ok", "raise", "garbage", "nan", "ok"] + (["hang"] if num_threads else [])
  out = stepper.step([_Env(b) for b in behaviours], [f"a{i}" for i in range(len(behaviours))])
  stepper.close()
  assert out[0] == base.StepResult("echo a0", 1.0, False, {"action_valid": True})
  assert out[4].observation == "echo a4"
  assert out[1].kind == "exception" and "boom" in out[1].detail
  assert out[2].kind == "garbage" and "int" in out[2].detail
  assert out[3].kind == "garbage" and "nan" in out[3].detail
  if num_threads:
    assert out[5].kind == "timeout"


def test_threads_overlap_slow_steps():
  """Eight 0.2 s steps on eight threads take about 0.2 s, not 1.6 s."""
  class Slow:
    def step(self, action):
      time.sleep(0.2)
      return base.StepResult("x", 0.0, False, {})
  stepper = workers.EnvStepper(workers.WorkerConfig(num_threads=8, step_timeout_s=5))
  start = time.perf_counter()
  out = stepper.step([Slow() for _ in range(8)], ["a"] * 8)
  elapsed = time.perf_counter() - start
  stepper.close()
  assert all(isinstance(r, base.StepResult) for r in out)
  assert elapsed < 1.0


def test_bad_config():
  with pytest.raises(ValueError, match="num_threads"):
    workers.WorkerConfig(num_threads=-1)
  with pytest.raises(ValueError, match="step_timeout_s"):
    workers.WorkerConfig(step_timeout_s=0)
