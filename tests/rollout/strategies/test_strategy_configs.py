"""End to end: each strategy's gin file through experiments/run.py at tiny size."""

import importlib.util
import json
import math
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
TINY = [
    "configs.TrainConfig.num_iterations = 2",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 4",
    "configs.TrainConfig.checkpoint_every = 2",
    "configs.WarmStartConfig.iterations = 0",
    "configs.EvalConfig.num_tasks = 2",
    "configs.EvalConfig.pass_k = 0",
    "configs.EvalConfig.every = 2",
    "loop.RolloutConfig.max_len = 160",
    "loop.RolloutConfig.length_buckets = (160,)",
]
EXTRA = {
    "tsr_frozenlake": ["tsr.BestOfN.num_candidates = 2", "tsr.FilterInstances.max_rounds = 1"],
    "t2po_frozenlake": [],
    "arpo_frozenlake": ["arpo.EntropyBranching.initial_rollouts = 2"],
    # Own entry (rtpo.train): 2 tasks x 4 roots = 8 root episodes, one update per turn reached.
    "rtpo_frozenlake": ["rtpo.RTPOConfig.branches = 2", "rtpo.RTPOConfig.max_prefixes = 1"],
}


def _run_main():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


# About 15-25 s per config on 2 CPU cores (compiles dominate); in the default suite because each
# strategy's gin switch must be shown to run end to end.
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(EXTRA))
def test_strategy_config_trains(tmp_path, name):
  workdir = str(tmp_path / name)
  argv = [f"--gin_file={REPO / 'experiments' / 'configs' / (name + '.gin')}", f"--workdir={workdir}"]
  argv += [f"--gin_bindings={b}" for b in TINY + EXTRA[name]]
  assert _run_main()(argv) == 0
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train = [r for r in rows if "loss/policy" in r]
  assert [r["step"] for r in train] == [1, 2]
  for r in train:
    assert math.isfinite(r["loss/policy"]) and r["rollout/episodes"] == 8
    # TITO: the learner's log-probs of the kept tokens equal the sampler's.
    assert r["rollout/logprob_drift"] < 1e-4
  config = open(os.path.join(workdir, "operative_config.gin")).read()
  assert name.split("_")[0] + "." in config  # the strategy was bound, not silently skipped
