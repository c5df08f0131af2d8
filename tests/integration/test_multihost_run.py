"""`experiments/run.py` as a two-host job: two CPU processes on loopback, one global batch.

Each process plays its half of every batch (warm-start demonstrations, training episodes,
held-out evaluation) and joins the sharded update. The metrics must equal those of one process
with the same eight devices and the same global batch; SIGTERM to one host stops both at the
same iteration with a checkpoint that the next launch resumes.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
# Wall-clock figures differ between runs by nature; everything else must match.
TIMING_KEYS = ("time/", "memory/", "rollout/seconds", "rollout/tokens_per_s",
               "rollout/turns_per_s")


def _gin_file(tmp_path, num_iterations):
  path = tmp_path / "two_hosts.gin"
  path.write_text(f"""from __gin__ import dynamic_registration
include '{REPO / "experiments/configs/quickstart.gin"}'
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.parallel import mesh
learner.train.mesh = @mesh.MeshConfig()
learner.train.hooks = []
mesh.MeshConfig.data = 8
configs.TrainConfig.num_iterations = {num_iterations}
configs.TrainConfig.tasks_per_iteration = 2
configs.TrainConfig.group_size = 4
configs.TrainConfig.checkpoint_every = 2
configs.TrainConfig.log_every = 1
configs.WarmStartConfig.iterations = 2
configs.WarmStartConfig.episodes_per_iteration = 8
configs.EvalConfig.num_tasks = 4
configs.EvalConfig.pass_k = 2
configs.EvalConfig.pass_k_tasks = 2
configs.EvalConfig.every = 2
""")
  return path


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(devices, **extra):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             XLA_FLAGS=(f"--xla_force_host_platform_device_count={devices} "
                        "--xla_cpu_collective_call_terminate_timeout_seconds=900 "
                        "--xla_cpu_collective_timeout_seconds=900 "
                        + os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", "")), **extra)
  return env


def _command(gin_file, workdir, *flags):
  return [sys.executable, str(REPO / "experiments" / "run.py"), f"--gin_file={gin_file}",
          f"--workdir={workdir}", *flags]


def _launch_two(gin_file, workdir, *flags):
  port = _free_port()
  return [subprocess.Popen(
      _command(gin_file, workdir, *flags), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=_env(4, JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID=str(i))) for i in range(2)]


def _wait(procs, timeout=900, status=0):
  """Each process's output, once all have exited with `status` (75: stopped, resumable)."""
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for p, log in zip(procs, logs):
    assert p.returncode == status, log[-4000:]
  return logs


def _records(workdir):
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING_KEYS)}
          for line in lines]


@pytest.mark.integration
def test_two_hosts_match_one_host_with_the_same_global_batch(tmp_path):
  gin_file = _gin_file(tmp_path, num_iterations=2)
  # The one-host reference runs beside the pair: its compiles overlap their collective waits.
  one = subprocess.Popen(_command(gin_file, tmp_path / "one"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=_env(8))
  try:
    logs = _wait(_launch_two(gin_file, tmp_path / "two"))
  except BaseException:
    one.kill()
    raise
  _wait([one])

  want, got = _records(tmp_path / "one"), _records(tmp_path / "two")
  assert [r["step"] for r in got] == [r["step"] for r in want]
  assert any("loss/policy" in r for r in want) and any("eval/greedy_success" in r for r in want)
  for w, g in zip(want, got):
    assert sorted(g) == sorted(w)
    for key in w:
      np.testing.assert_allclose(g[key], w[key], rtol=1e-4, atol=1e-5, err_msg=f"{key} at step {w['step']}")
  # One metrics record, written by process 0 alone; both hosts checkpointed the same step.
  assert "Done: 2 iterations" in logs[0]
  assert (tmp_path / "two" / "checkpoints" / "2").is_dir()


# Slow: two processes and a relaunch; one-host SIGTERM is in the default suite
# (tests/learner/test_driver_methods.py), the two-host batch equivalence above too.
@pytest.mark.slow
@pytest.mark.integration
def test_sigterm_to_one_host_stops_both_with_a_checkpoint_that_resumes(tmp_path):
  gin_file = _gin_file(tmp_path, num_iterations=400)
  workdir = tmp_path / "run"
  procs = _launch_two(gin_file, workdir)
  deadline = time.time() + 600
  # Wait for the first RL iteration's metrics, then preempt process 1 only.
  while not any('"loss/policy"' in line for line in _lines(workdir / "metrics.jsonl")):
    assert time.time() < deadline and all(p.poll() is None for p in procs), "the job never trained"
    time.sleep(0.5)
  procs[1].send_signal(signal.SIGTERM)
  logs = _wait(procs, status=75)  # both stop, resumable
  stopped = [int(log.split("Stopped at iteration ")[1].split(";")[0]) for log in logs]
  assert stopped[0] == stopped[1] < 400
  assert (workdir / "checkpoints" / str(stopped[0])).is_dir()

  gin_file.write_text(gin_file.read_text().replace("num_iterations = 400",
                                                   f"num_iterations = {stopped[0] + 1}"))
  # Ending the run at the next iteration is a config change: the relaunch says it goes on.
  logs = _wait(_launch_two(gin_file, workdir, "--allow_config_change"))
  assert f"Resuming from the checkpoint at iteration {stopped[0]}" in logs[0]
  assert f"Done: {stopped[0] + 1} iterations" in logs[0]


def _lines(path):
  return path.read_text().splitlines() if path.exists() else []
