"""experiments/configs/hf_tiny_qwen2_grpo.gin trains from a local HF checkpoint on 8 fake devices.

Runs `experiments/run.py` in a subprocess (its own 8 fake CPU devices) for a two-iteration smoke
run, and checks that a wrong path, a config/weights mismatch and an unsupported architecture stop
it with a message naming the problem.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIN = ROOT / "experiments" / "configs" / "hf_tiny_qwen2_grpo.gin"
SMOKE = ["configs.TrainConfig.num_iterations = 2", "configs.TrainConfig.tasks_per_iteration = 4",
         "configs.WarmStartConfig.iterations = 1", "configs.WarmStartConfig.episodes_per_iteration = 8",
         "configs.EvalConfig.num_tasks = 4", "configs.EvalConfig.pass_k_tasks = 4",
         "configs.TrainConfig.checkpoint_every = 2"]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


# Fake devices are threads: on a loaded machine a collective may wait past XLA's default 40 s
# rendezvous limit and abort the process, so the limit is raised.
XLA_FLAGS = ("--xla_force_host_platform_device_count=8 "
             "--xla_cpu_collective_call_terminate_timeout_seconds=900 "
             "--xla_cpu_collective_timeout_seconds=900 "
             + os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", ""))


def _run(workdir, ckpt, extra=()):
  env = dict(os.environ, XLA_FLAGS=XLA_FLAGS, JAX_PLATFORMS="cpu")
  bindings = [f"learner.train.init_from = '{ckpt}'", *SMOKE, *extra]
  cmd = [sys.executable, str(ROOT / "experiments" / "run.py"), f"--gin_file={GIN}",
         f"--workdir={workdir}"] + [f"--gin_bindings={b}" for b in bindings]
  return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf") / "tiny_qwen2"
  subprocess.run([sys.executable, str(ROOT / "experiments" / "make_tiny_hf_checkpoint.py"),
                  f"--out={path}"], check=True, cwd=ROOT)
  return path


def test_trains_from_the_checkpoint_on_eight_devices(checkpoint, tmp_path):
  out = _run(tmp_path / "run", checkpoint)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert "0.0% of bytes fully replicated" in out.stdout
  assert "Done: 2 iterations" in out.stdout
  assert (tmp_path / "run" / "operative_config.gin").exists()


def _broken(checkpoint, tmp_path, **changes):
  path = tmp_path / "broken"
  shutil.copytree(checkpoint, path)
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))
  return path


@pytest.mark.parametrize("case,match", [
    ("wrong_path", "does not exist"),
    ("mismatch", "'model.layers.0.mlp.down_proj.weight' has shape (64, 256), but config.json implies (64, 128)"),
    ("architecture", "unsupported architecture model_type='mistral'"),
])
def test_bad_checkpoints_fail_naming_the_problem(checkpoint, tmp_path, case, match):
  ckpt = {"wrong_path": lambda: tmp_path / "nowhere",
          "mismatch": lambda: _broken(checkpoint, tmp_path, intermediate_size=128),
          "architecture": lambda: _broken(checkpoint, tmp_path, model_type="mistral")}[case]()
  out = _run(tmp_path / "run", ckpt)
  assert out.returncode != 0
  assert match in out.stderr + out.stdout
