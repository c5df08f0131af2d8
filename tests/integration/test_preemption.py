"""SIGTERM mid-run: the run stops at an iteration boundary, checkpoints, and the rerun resumes."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BINDINGS = [
    "configs.TrainConfig.num_iterations = 200",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.TrainConfig.checkpoint_every = 1000",
    "configs.WarmStartConfig.iterations = 0",
    "configs.EvalConfig.num_tasks = 2",
    "configs.EvalConfig.pass_k = 0",
    "configs.EvalConfig.every = 1000",
]


def _command(workdir, extra=()):
  cmd = [sys.executable, str(REPO / "experiments" / "run.py"),
         f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={workdir}"]
  return cmd + [f"--gin_bindings={b}" for b in list(BINDINGS) + list(extra)]


@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_checkpoints_then_resume(tmp_path):
  workdir = tmp_path / "run"
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(_command(workdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env)
  lines = []
  deadline = time.time() + 600
  for line in proc.stdout:
    lines.append(line)
    if line.startswith("iteration ") or time.time() > deadline:
      break
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  text = "".join(lines) + out
  assert proc.returncode == 75, text  # preemption.EXIT_STOPPED: relaunch to resume
  assert "Stopped at iteration" in text
  stopped_at = int(text.split("Stopped at iteration ")[1].split(";")[0])
  assert (workdir / "checkpoints" / str(stopped_at)).is_dir()

  # One more iteration to finish sooner: a changed config, which the relaunch must allow.
  finish = _command(workdir, [f"configs.TrainConfig.num_iterations = {stopped_at + 1}"])
  done = subprocess.run([*finish, "--allow_config_change"], capture_output=True, text=True,
                        env=env, timeout=600)
  assert done.returncode == 0, done.stdout + done.stderr
  assert f"Resuming from the checkpoint at iteration {stopped_at}" in done.stdout
