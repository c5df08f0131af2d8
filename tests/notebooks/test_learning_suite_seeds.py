"""The learning-suite notebook's STUDY_SEEDS: a malformed list stops the launch before any run."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "learning_suite.py"


@pytest.mark.parametrize("seeds", ["3,x", "-1", "3;4"])
def test_a_malformed_seed_list_stops_before_any_run(tmp_path, seeds):
  env = dict(os.environ, STUDY_SET="rl_share", STUDY_ENVS="frozenlake_clone30",
             STUDY_SEEDS=seeds, STUDY_OUTPUT_DIR=str(tmp_path),
             STUDY_RUNS_DIR=str(tmp_path / "runs"), MPLBACKEND="Agg", JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  result = subprocess.run([sys.executable, str(NOTEBOOK)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"STUDY_SEEDS={seeds!r} must be seeds >= 0 separated by commas, e.g. 3,4")
  assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
