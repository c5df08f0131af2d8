"""Exact resume: a run SIGKILLed at random points (also mid-checkpoint) and relaunched each time
ends with the same metrics, bit for bit, as an uninterrupted run.

Slow (one process start per kill): `python -m pytest -m slow tests/reliability/test_kill_resume.py`.
AGENTRL_KILLS sets the number of kills (default 20).
"""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ITERATIONS = 150
BINDINGS = [
    f"configs.TrainConfig.num_iterations = {ITERATIONS}",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.TrainConfig.checkpoint_every = 1",
    "configs.WarmStartConfig.iterations = 2",
    "configs.WarmStartConfig.episodes_per_iteration = 4",
    "configs.EvalConfig.num_tasks = 4",
    "configs.EvalConfig.pass_k = 0",
    "configs.EvalConfig.every = 10",
]
# Wall-clock measurements differ between runs by nature; everything else must match exactly.
TIMING = ("time/", "memory/", "rollout/seconds", "rollout/tokens_per_s",
          "rollout/turns_per_s")


def _command(workdir):
  return [sys.executable, str(REPO / "experiments" / "run.py"),
          f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={workdir}"
          ] + [f"--gin_bindings={b}" for b in BINDINGS]


def _final_metrics(workdir):
  """The last record written for every step (a resumed run rewrites steps after its checkpoint)."""
  by_step = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    if line.strip():
      row = json.loads(line)
      key = (row["step"], tuple(sorted(row)))
      by_step[key] = {k: v for k, v in row.items() if not k.startswith(TIMING)}
  return by_step


@pytest.mark.slow
def test_random_kills_then_resume_match_uninterrupted_run(tmp_path):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  reference = tmp_path / "reference"
  subprocess.run(_command(reference), check=True, capture_output=True, env=env, timeout=900)

  kills = int(os.environ.get("AGENTRL_KILLS", "20"))
  rng = random.Random(0)
  workdir = tmp_path / "killed"
  survived = 0
  for _ in range(kills):
    proc = subprocess.Popen(_command(workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    time.sleep(rng.uniform(4.0, 20.0))  # start-up, warm start, iterations or a checkpoint write
    if proc.poll() is not None:
      break  # finished before the kill landed
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    survived += 1
  done = subprocess.run(_command(workdir), capture_output=True, text=True, env=env, timeout=900)
  assert done.returncode == 0, done.stdout + done.stderr
  assert _final_metrics(workdir) == _final_metrics(reference)
  assert survived == kills, f"only {survived} of {kills} kills landed before the run finished"
