"""End to end: `experiments/run.py` with a composed credit config (curiosity + C³ after GRPO).

Two checked-in gin files parsed in order compose: `c3_frozenlake.gin` binds the correction,
`curiosity_frozenlake.gin` adds the reward shaper. One tiny iteration on FrozenLake.
"""

import json
import math
import os
import pathlib
import sys

import gin
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "experiments"))

import run  # noqa: E402

from agentrl_jax import config_errors  # noqa: E402

STAGE = {"corrections": ["c3_frozenlake", "deltattg_frozenlake", "pearl_frozenlake",
                         "serl_frozenlake", "gca_search_qa"],
         "reward_shapers": ["curiosity_frozenlake", "t1_terminal", "progress_sql",
                            "socialrl_dialogue"]}


@pytest.mark.parametrize("stage, name", [(s, n) for s, names in STAGE.items() for n in names])
def test_method_config_parses_and_binds_its_method(stage, name):
  gin.clear_config(clear_constants=True)
  try:
    config_errors.parse_config([str(REPO / "experiments" / "configs" / f"{name}.gin")], [],
                               default_imports=run.DEFAULT_IMPORTS)
    assert len(gin.query_parameter(f"learner.train.{stage}")) == 1
  finally:
    gin.clear_config(clear_constants=True)


@pytest.mark.slow
@pytest.mark.integration
def test_curiosity_and_c3_after_grpo_run_end_to_end(tmp_path, monkeypatch):
  monkeypatch.chdir(REPO)
  gin.clear_config(clear_constants=True)
  workdir = tmp_path / "run"
  bindings = ["configs.TrainConfig.num_iterations = 1", "configs.TrainConfig.tasks_per_iteration = 4",
              "configs.TrainConfig.group_size = 4", "configs.WarmStartConfig.iterations = 0",
              "configs.EvalConfig.num_tasks = 4", "configs.EvalConfig.pass_k = 0"]
  try:
    status = run.main(["--gin_file=experiments/configs/c3_frozenlake.gin",
                       "--gin_file=experiments/configs/curiosity_frozenlake.gin",
                       *[f"--gin_bindings={b}" for b in bindings], f"--workdir={workdir}"])
  finally:
    operative = gin.operative_config_str()
    gin.clear_config(clear_constants=True)
  assert status == 0
  assert "@c3.c3" in operative and "@curiosity.duplicate_observation_penalty" in operative
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  last = [m for m in lines if "loss/policy" in m][-1]
  assert all(math.isfinite(v) for v in last.values() if isinstance(v, float))
  assert os.listdir(workdir / "checkpoints")
