"""Launching a study notebook as a script, the way a user does, with its STUDY_* settings."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def launch_notebook(tmp_path):
  """`launch(name, **study_env)` runs `notebooks/<name>.py` with its outputs and runs under
  `tmp_path` and returns the finished process (stdout and stderr captured)."""

  def launch(name: str, **study_env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **study_env, STUDY_OUTPUT_DIR=str(tmp_path),
               STUDY_RUNS_DIR=str(tmp_path / "runs"), MPLBACKEND="Agg", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env["XLA_FLAGS"] = os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", "")
    return subprocess.run([sys.executable, str(ROOT / "notebooks" / f"{name}.py")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600, check=False)

  return launch
