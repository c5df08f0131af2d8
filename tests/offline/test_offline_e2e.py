"""End to end: each offline/distillation gin file runs through experiments/run.py at tiny size."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = [
    "configs.TrainConfig.num_iterations = 2",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 4",
    # The warm start is the quickstart's, run by tests/integration; these launches show the
    # methods' own loops.
    "configs.WarmStartConfig.iterations = 0",
    "configs.EvalConfig.num_tasks = 4",
    "configs.EvalConfig.pass_k_tasks = 2",
]
EXTRA = {
    "drift_frozenlake": ["drift.DriftConfig.num_batches = 2"],
    "iterative_grpo_frozenlake": ["iterative_grpo.IterativeGRPOConfig.q_steps = 3",
                                  "iterative_grpo.IterativeGRPOConfig.improve_steps = 2",
                                  "iterative_grpo.IterativeGRPOConfig.contexts_per_step = 4"],
    "ahead_frozenlake": [],
    "slea_frozenlake": ["LIBRARY = 'e2e'",
                        "configs.TrainConfig.env_kwargs = {'env': 'frozenlake', 'library': "
                        "%LIBRARY, 'episodes_per_update': 8, 'admission_threshold': 0.1}"],
}


# About 30 s per config on 2 CPU cores; in the default suite: each method's gin file must be
# shown to run end to end.
# DRIFT's gin file also runs in the default suite through tests/learner/test_driver_methods.py
# (three launches with resume); its run.py launch here is under -m slow.
@pytest.mark.integration
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n == "drift_frozenlake" else n for n in sorted(EXTRA)])
def test_gin_file_runs_end_to_end(tmp_path, name):
  # One process per run, as a user launches it: gin's registrations outlive `clear_config`, so
  # runs sharing a process could see another file's `learner.run` binding.
  argv = [sys.executable, str(ROOT / "experiments" / "run.py"),
          f"--gin_file={ROOT / 'experiments' / 'configs' / (name + '.gin')}", f"--workdir={tmp_path}"]
  argv += [f"--gin_bindings={b}" for b in TINY + EXTRA[name]]
  done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  last = rows[-1]
  assert last["step"] == 2 and "eval/greedy_success" in last
  assert os.path.isdir(tmp_path / "checkpoints")
  if name in ("drift_frozenlake", "iterative_grpo_frozenlake"):
    assert os.path.isdir(tmp_path / "trajectories")


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_gin_file_parses_and_binds_its_entry(name):
  import gin  # pylint: disable=import-outside-toplevel
  from agentrl_jax import config_errors  # pylint: disable=import-outside-toplevel
  gin.clear_config()
  try:
    config_errors.parse_config([str(ROOT / "experiments" / "configs" / f"{name}.gin")], TINY,
                               default_imports=("from agentrl_jax.learner import learner",))
    text = gin.config_str()
  finally:
    gin.clear_config()
  if name == "slea_frozenlake":
    assert "env_name = 'slea'" in text and "LibraryCheckpoint" in text
  else:
    assert f"@{name.replace('_frozenlake', '')}.train" in text
