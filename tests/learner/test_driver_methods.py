"""Every training method runs in the one driver and gets its behaviours, checked once for all.

For each method's own gin file at tiny size: a SIGTERM after iteration 1 stops the run with a
checkpoint; the relaunch resumes from it and ends exactly where an uninterrupted run ends; metrics
follow `log_every`; the operative config is written; and every trajectory keeps the
per-trajectory action-token budget.
"""

import importlib.util
import json
import math
import os
import pathlib

import gin
import numpy as np
import pytest

from agentrl_jax import config_errors

import preempt

REPO = pathlib.Path(__file__).resolve().parents[2]
BUDGET = 3  # action tokens per trajectory (one-token actions: at most 3 turns)
COMMON = [
    "configs.TrainConfig.num_iterations = 2",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.TrainConfig.checkpoint_every = 5",
    "configs.TrainConfig.log_every = 2",
    "configs.WarmStartConfig.iterations = 1",
    "configs.WarmStartConfig.episodes_per_iteration = 4",
    "configs.EvalConfig.num_tasks = 2",
    "configs.EvalConfig.pass_k = 0",
    "configs.EvalConfig.every = 5",
]
BUDGET_BINDING = f"loop.RolloutConfig.max_trajectory_action_tokens = {BUDGET}"
# RTPO samples its roots through the rollout strategies, which refuse a trajectory budget.
NO_BUDGET = ("rtpo",)
# name: (gin file, the entry whose `hooks` the test binds, extra bindings). Teachers re-sync at
# every batch so that a resumed run's teacher is the uninterrupted run's (the snapshot itself is
# not checkpointed, by design).
METHODS = {
    "online": ("quickstart", "learner.train", []),
    "drift": ("drift_frozenlake", "drift.train", ["drift.DriftConfig.num_batches = 1"]),
    "iterative_grpo": ("iterative_grpo_frozenlake", "iterative_grpo.train",
                       ["iterative_grpo.IterativeGRPOConfig.q_steps = 2",
                        "iterative_grpo.IterativeGRPOConfig.improve_steps = 1",
                        "iterative_grpo.IterativeGRPOConfig.contexts_per_step = 2"]),
    "ahead": ("ahead_frozenlake", "ahead.train", ["ahead.AheadConfig.sync_every = 1"]),
    "rtpo": ("rtpo_frozenlake", "rtpo.train",
             ["rtpo.RTPOConfig.num_roots = 2", "rtpo.RTPOConfig.branches = 2",
              "rtpo.RTPOConfig.max_prefixes = 1"]),
    "serl": ("serl_frozenlake", "learner.train", ["teacher.PrivilegedTeacher.sync_every = 1"]),
}
# Wall-clock and memory figures differ between any two runs.
_TIMING = ("time/", "memory/", "rollout/seconds", "rollout/tokens_per_s",
           "rollout/turns_per_s")


class Recorder:
  """Hook: the most action tokens any trajectory of each iteration's batch held.

  gin deep-copies bound values, so what a copy sees is kept in a class-level table by label.
  """

  seen: dict[str, list[int]] = {}

  def __init__(self, label):
    self.label = label
    Recorder.seen[label] = []

  def __call__(self, event):
    if event.traj is not None:
      per_row = np.asarray(event.traj.action_mask).sum(axis=1)
      Recorder.seen[self.label].append(int(per_row.max()))


def _run_module():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _launch(name, workdir, hooks):
  gin_file, entry, extra = METHODS[name]
  run = _run_module()
  gin.clear_config()
  try:
    config_errors.parse_config([str(REPO / "experiments" / "configs" / f"{gin_file}.gin")],
                               COMMON + ([] if name in NO_BUDGET else [BUDGET_BINDING]) + extra,
                               default_imports=run.DEFAULT_IMPORTS,
                               default_bindings=run.DEFAULT_BINDINGS)
    gin.bind_parameter(f"{entry}.hooks", list(hooks))
    return run.configured_run()(workdir=str(workdir))
  finally:
    gin.clear_config()


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _final(workdir):
  return {k: v for k, v in _rows(workdir)[-1].items() if not k.startswith(_TIMING)}


# Three launches per method (about a minute each on 2 cores, compiles dominate): DRIFT runs in
# the default suite, every method under `-m slow`; the driver's own behaviours are also checked
# with a toy method in test_driver.py.
DEFAULT_SUITE = ("drift",)


@pytest.mark.integration
@pytest.mark.parametrize("name", [
    n if n in DEFAULT_SUITE else pytest.param(n, marks=pytest.mark.slow) for n in sorted(METHODS)])
def test_method_gets_the_drivers_behaviours(tmp_path, name):
  done = _launch(name, tmp_path / "reference", [Recorder("reference")])
  assert not done.preempted and done.iterations == 2
  # log_every = 2: iteration 1 is not logged, iteration 2 (also the last) is.
  logged = [r["step"] for r in _rows(tmp_path / "reference") if "time/iteration_s" in r]
  assert logged == [2]
  assert math.isfinite(_final(tmp_path / "reference")["eval/greedy_success"])
  assert os.path.exists(tmp_path / "reference" / "operative_config.gin")
  most = Recorder.seen["reference"]
  assert most and (name in NO_BUDGET or max(most) <= BUDGET)

  stopped = _launch(name, tmp_path / "run", [Recorder("stopped"), preempt.StopAfter(1)])
  assert stopped.preempted and stopped.iterations == 1
  # checkpoint_every = 5: the checkpoint at iteration 1 is the stop's own.
  assert os.path.isdir(tmp_path / "run" / "checkpoints" / "1")
  resumed = _launch(name, tmp_path / "run", [Recorder("resumed")])
  assert resumed.resumed_from == 1 and resumed.iterations == 2 and not resumed.preempted
  assert _final(tmp_path / "run") == _final(tmp_path / "reference")
  assert resumed.success_after == done.success_after
  assert name in NO_BUDGET or max(Recorder.seen["stopped"] + Recorder.seen["resumed"]) <= BUDGET
