"""Env workers: exceptions, hangs and garbage are isolated per env and named."""

import os
import time

import pytest

from agentrl_jax.envs import base
from agentrl_jax.envs import registry
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


class _Counting:
  """A deterministic env whose observation names its seed, step count and action."""

  action_words = None
  max_turns = 10

  def __init__(self, behaviour="ok"):
    self.behaviour = behaviour

  def reset(self, seed):
    self.seed, self.n = seed, 0
    return f"start {seed}"

  def step(self, action):
    self.n += 1
    if self.behaviour == "raise":
      raise ValueError("boom")
    if self.behaviour == "hang" and self.n == 1:
      time.sleep(60)
    if self.behaviour == "die":
      os._exit(3)  # the whole worker process goes
    if self.behaviour == "garbage":
      return 42
    return base.StepResult(f"{self.seed}:{self.n}:{action}", 1.0, False, {})


def test_process_pool_isolates_faults_and_replays_the_survivors():
  stepper = workers.EnvStepper(workers.WorkerConfig(kind="process", num_processes=2, step_timeout_s=1.0))
  try:
    # Round robin: worker 0 owns envs 0, 2, 4 and worker 1 owns envs 1, 3, 5.
    behaviours = ["ok", "hang", "die", "ok", "raise", "garbage"]
    envs = [stepper.make_env(_Counting, behaviour=b) for b in behaviours]
    assert [env.reset(10 + i) for i, env in enumerate(envs)] == [f"start {10 + i}" for i in range(6)]
    start = time.perf_counter()
    out = stepper.step(envs, [f"a{i}" for i in range(6)])
    assert time.perf_counter() - start < 30  # the hang cost one timeout, not 60 s
    assert out[0].observation == "10:1:a0" and out[3].observation == "13:1:a3"
    assert out[1].kind == "timeout"
    assert out[2].kind == "exception" and "died" in out[2].detail
    assert out[4].kind == "exception" and "boom" in out[4].detail
    assert out[5].kind == "garbage" and "int" in out[5].detail
    # Both workers were replaced; envs 0 and 3 were rebuilt by replay and keep their step count.
    out = stepper.step(envs, [f"b{i}" for i in range(6)])
    assert out[0].observation == "10:2:b0" and out[3].observation == "13:2:b3"
    assert out[1].kind == "exception" and "lost" in out[1].detail
    assert envs[0].pool.restarts == 2
    assert envs[1].reset(11) == "start 11"  # a lost env is rebuilt by its next reset
  finally:
    stepper.close()


def test_process_pool_steps_a_registry_env_like_a_local_one():
  stepper = workers.EnvStepper(workers.WorkerConfig(kind="process", num_processes=2, step_timeout_s=20))
  try:
    remote = [stepper.make_env("frozenlake") for _ in range(3)]
    local = [registry.make("frozenlake") for _ in range(3)]
    assert remote[0].action_words == local[0].action_words
    # A chat model's system message: the rules reach the rollout from a worker too.
    assert remote[0].instructions == local[0].instructions and "FrozenLake" in local[0].instructions
    for seed, (r, l) in enumerate(zip(remote, local)):
      assert r.reset(seed) == l.reset(seed)
    for _ in range(3):
      actions = [r.expert_action() for r in remote]
      assert actions == [l.expert_action() for l in local]
      got = stepper.step(remote, actions)
      assert got == [l.step(a) for l, a in zip(local, actions)]
    remote[0].close()  # freed in its worker: a step is a fault, a reset an error
    assert stepper.step(remote[:1], ["left"])[0].kind == "exception"
    with pytest.raises(RuntimeError, match="closed"):
      remote[0].reset(0)
  finally:
    stepper.close()
  with pytest.raises(ValueError, match="kind"):
    workers.WorkerConfig(kind="fiber")
