"""End to end: experiments/run.py on the quickstart config at tiny size, then a resume."""

import importlib.util
import json
import math
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = [
    "configs.TrainConfig.num_iterations = {n}",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.TrainConfig.checkpoint_every = 1",
    "configs.WarmStartConfig.iterations = 1",
    "configs.WarmStartConfig.episodes_per_iteration = 4",
    "configs.EvalConfig.num_tasks = 4",
    "configs.EvalConfig.pass_k = 2",
    "configs.EvalConfig.pass_k_tasks = 2",
    "configs.EvalConfig.every = 1",
]


def _run_main():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


def _argv(workdir, iterations):
  argv = [f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={workdir}"]
  return argv + [f"--gin_bindings={b.format(n=iterations)}" for b in TINY]


def _manifest(workdir, step):
  with open(os.path.join(workdir, "checkpoints", str(step), "manifest", "metadata")) as f:
    return json.load(f)["leaves"]


def _policy_fingerprints(workdir, step):
  return {k: v["fingerprint"] for k, v in _manifest(workdir, step).items() if "policy_params" in k}


@pytest.mark.integration
def test_two_iterations_then_resume(tmp_path, capsys):
  main = _run_main()
  workdir = str(tmp_path / "run")
  assert main(_argv(workdir, 2)) == 0
  out = capsys.readouterr().out
  assert "before training" in out and "after RL" in out

  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train_rows = [r for r in rows if "loss/policy" in r]
  assert [r["step"] for r in train_rows] == [1, 2]
  assert all(math.isfinite(r["loss/policy"]) for r in train_rows)
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  assert steps[-1] == 2
  assert _policy_fingerprints(workdir, 1) != _policy_fingerprints(workdir, 2), "parameters unchanged"
  assert os.path.exists(os.path.join(workdir, "operative_config.gin"))
  assert os.path.exists(os.path.join(workdir, "config.gin"))

  # Training longer is a config change (num_iterations 2 -> 3): the relaunch says it goes on.
  assert main(_argv(workdir, 3) + ["--allow_config_change"]) == 0
  out = capsys.readouterr().out
  assert "Resuming from the checkpoint at iteration 2" in out
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in rows if "loss/policy" in r] == [1, 2, 3]
  # The warm start and the "before" evaluation ran once: the resume skipped them.
  assert sum("eval/greedy_success_before" in r for r in rows) == 1
