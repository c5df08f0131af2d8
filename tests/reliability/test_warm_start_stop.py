"""A run stopped (SIGTERM) during its behaviour-cloning warm start exits 75, keeps the progress,
and the relaunch ends with the same metrics, bit for bit, as an uninterrupted run.

Slow (three process starts): `python -m pytest -m slow tests/reliability/test_warm_start_stop.py`.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BINDINGS = [
    "configs.TrainConfig.num_iterations = 1",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.WarmStartConfig.iterations = 80",
    "configs.WarmStartConfig.episodes_per_iteration = 8",
    "configs.EvalConfig.num_tasks = 8",
    "configs.EvalConfig.pass_k = 0",
]
TIMING = ("time/", "memory/", "rollout/seconds", "rollout/tokens_per_s", "rollout/turns_per_s")


def _command(workdir):
  return [sys.executable, str(REPO / "experiments" / "run.py"),
          f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={workdir}"
          ] + [f"--gin_bindings={b}" for b in BINDINGS]


def _records(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
  return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in rows]


def _cloned_steps(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  return max([json.loads(line).get("warm_start/iteration", 0) for line in open(path)
              if line.strip()] or [0])


@pytest.mark.slow
def test_a_stop_during_the_warm_start_resumes_to_the_uninterrupted_run(tmp_path):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  reference = tmp_path / "reference"
  subprocess.run(_command(reference), check=True, capture_output=True, env=env, timeout=900)

  run = tmp_path / "run"
  process = subprocess.Popen(_command(run), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=env)
  deadline = time.monotonic() + 600
  while _cloned_steps(run) < 20 and process.poll() is None and time.monotonic() < deadline:
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  output = process.communicate(timeout=300)[0].decode()
  assert process.returncode == 75, output
  assert "Stopped the warm start at step" in output
  assert (run / "warm_start_progress.npz").exists()
  assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())

  resumed = subprocess.run(_command(run), capture_output=True, env=env, timeout=900, text=True)
  assert resumed.returncode == 0, resumed.stdout + resumed.stderr
  assert "Resuming the warm start at step" in resumed.stdout
  assert not (run / "warm_start_progress.npz").exists()
  assert _records(run) == _records(reference)
