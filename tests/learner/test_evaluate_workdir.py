"""experiments/evaluate.py: a finished run's checkpoint evaluated again, and exported.

One tiny quickstart run (rotary positions, so the policy has an HF layout) serves every test.
Re-evaluating it with its own settings must reproduce its last evaluation exactly (the same
held-out seeds and key), without touching the run's files; the export must hold the
checkpoint's weights.
"""

import importlib.util
import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from agentrl_jax.learner import evaluate_workdir
from agentrl_jax.models import hf

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = [
    "configs.TrainConfig.num_iterations = 2",
    "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2",
    "configs.TrainConfig.checkpoint_every = 1",
    "configs.WarmStartConfig.iterations = 2",
    "configs.WarmStartConfig.episodes_per_iteration = 8",
    "configs.EvalConfig.num_tasks = 8",
    "configs.EvalConfig.pass_k = 2",
    "configs.EvalConfig.pass_k_tasks = 2",
    "transformer.TransformerConfig.position = 'rope'",
    "transformer.TransformerConfig.alibi = False",
    "learner.train.hooks = []",
]


def _load(name):
  spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  path = tmp_path_factory.mktemp("finished_run")
  argv = [f"--gin_file={REPO / 'experiments/configs/quickstart.gin'}", f"--workdir={path}",
          *(f"--gin_bindings={b}" for b in TINY)]
  try:
    assert _load("run").main(argv) == 0
  finally:
    gin.clear_config()
  return path


def _files(path):
  return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_reevaluation_reproduces_the_runs_last_evaluation(workdir):
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  last = [r for r in rows if "eval/greedy_success" in r][-1]
  before = _files(workdir)
  try:
    evaluate_workdir.parse_run_config(str(workdir))
    result = evaluate_workdir.evaluate_workdir(str(workdir))
  finally:
    gin.clear_config()
  assert result["step"] == last["step"] == 2
  for key in ("eval/greedy_success", "eval/pass@2", "eval/invalid_action_rate", "eval/mean_turns"):
    assert result[key] == pytest.approx(last[key], abs=1e-9), key
  written = workdir / "evaluation" / "step_2.json"
  assert json.loads(written.read_text()) == result
  after = _files(workdir)
  del after[written.relative_to(workdir)]
  assert after == before, "evaluation changed the run's files"


def test_command_line_with_more_tasks_and_export(workdir, tmp_path, capsys):
  export = tmp_path / "policy"
  try:
    code = _load("evaluate").main([f"--workdir={workdir}", "--num_tasks=16", "--pass_k=0",
                                   f"--export={export}"])
  finally:
    gin.clear_config()
  assert code == 0
  out = capsys.readouterr().out
  assert "Checkpoint at iteration 2, 16 held-out tasks: greedy_success" in out, out
  result = json.loads((workdir / "evaluation" / "step_2.json").read_text())
  assert result["num_tasks"] == 16 and "eval/pass@2" not in result
  # The export holds the checkpoint's weights: restore them the way evaluate does and compare.
  _, _, exported = hf.load(str(export))
  try:
    evaluate_workdir.parse_run_config(str(workdir))
    arguments = evaluate_workdir.train_arguments()
    arguments["hooks"] = ()
    from agentrl_jax.learner import checkpoint as checkpoint_lib
    from agentrl_jax.learner import learner
    run = learner.build(**arguments)
    with checkpoint_lib.Checkpointer(str(workdir)) as ckpt:
      state, _ = ckpt.restore(ckpt.latest_step(), target=run.state)
    run.method.close()
  finally:
    gin.clear_config()
  leaves = lambda tree: {hf.path_name(p): np.asarray(v[...]) for p, v in
                         jax.tree_util.tree_leaves_with_path(
                             tree, is_leaf=lambda x: hasattr(x, "get_metadata"))}
  got, want = leaves(exported), leaves(state.policy_params)
  assert set(got) == set(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=1e-6, err_msg=name)


@pytest.mark.parametrize("make,message", [
    (lambda d: None, "has no config.gin"),
    (lambda d: (d / "config.gin").write_text(
        "from __gin__ import dynamic_registration\nfrom agentrl_jax.learner import configs\n"
        "configs.TrainConfig.seed = 1\n"), "has no checkpoint"),
    (lambda d: (d / "config.gin").write_text(
        "from __gin__ import dynamic_registration\nfrom agentrl_jax.learner import learner\n"
        "from agentrl_jax.offline import drift\nlearner.run.entry = @drift.train\n"),
     "online runs"),
])
def test_bad_workdirs_fail_in_one_line(tmp_path, capsys, make, message):
  make(tmp_path)
  try:
    code = _load("evaluate").main([f"--workdir={tmp_path}"])
  finally:
    gin.clear_config()
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("error: ") and message in err, err
  assert len(err.strip().splitlines()) == 1
  assert not (tmp_path / "checkpoints").exists()
