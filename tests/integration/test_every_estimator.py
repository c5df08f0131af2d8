"""Every registered estimator trains end to end from gin at tiny size (one iteration each)."""

import json
import math
import os
import pathlib

import pytest

from agentrl_jax.advantages import estimators

from test_quickstart_e2e import _run_main  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[2]
# SPO scores against a prefix embedding the rollout does not produce (extras['prefix_embedding']).
NEEDS_EXTRA_INPUTS = {"spo"}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(set(estimators.ESTIMATORS) - NEEDS_EXTRA_INPUTS))
def test_estimator_trains_from_gin(name, tmp_path):
  bindings = [
      f"configs.TrainConfig.estimator = @estimators.{name}",
      f"configs.TrainConfig.use_critic = {estimators.get_estimator(name).needs_critic}",
      "configs.TrainConfig.num_iterations = 1",
      "configs.TrainConfig.tasks_per_iteration = 2",
      "configs.TrainConfig.group_size = 2",
      "configs.WarmStartConfig.iterations = 0",
      "configs.EvalConfig.num_tasks = 2",
      "configs.EvalConfig.pass_k = 0",
      "learner.train.hooks = []",
  ]
  workdir = tmp_path / name
  argv = [f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={workdir}"]
  assert _run_main()(argv + [f"--gin_bindings={b}" for b in bindings]) == 0
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  losses = [r["loss/policy"] for r in rows if "loss/policy" in r]
  assert len(losses) == 1 and math.isfinite(losses[0])
