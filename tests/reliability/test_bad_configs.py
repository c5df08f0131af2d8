"""Bad configs and bindings: each fails before any compute with an error naming the problem."""

import importlib.util
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "experiments" / "configs" / "quickstart.gin")

# (binding, fragment the one-line error must contain)
BAD_BINDINGS = [
    ("configs.TrainConfig.num_iteratons = 3", "num_iterations"),
    ("configs.TrainConfg.seed = 1", "TrainConfig"),
    ("configs.TrainConfig.num_iterations = 0", "num_iterations"),
    ("configs.TrainConfig.estimator = 'gae'", "needs a critic"),
    ("configs.TrainConfig.estimator = 'grpoo'", "unknown advantage estimator 'grpoo'"),
    ("configs.TrainConfig.env_name = 'frozenlak'", "did you mean 'frozenlake'"),
    ("configs.TrainConfig.env_kwargs = {'sizee': 4}", "sizee"),
    ("estimators.gae.gama = 1.0", "gama"),
    ("configs.TrainConfig.estimator = @estimators.gae", "needs a critic"),
    ("configs.TrainConfig.estimator = 3", "estimator"),
    ("step.LossConfig.dual_clip = 0.5", "dual_clip"),
    ("step.LossConfig.num_minibatches = 3", "divisible"),
    ("step.LossConfig.micro_batches = 3", "LossConfig.micro_batches=3"),
    ("step.LossConfig.head_chunk = 0", "head_chunk"),
    ("sampler.SamplingConfig.temperature = -1.0", "temperature"),
    ("loop.RolloutConfig.obs_buckets = (64, 48)", "ascending"),
    ("loop.RolloutConfig.max_turns = 5", "runs up to 10 turns"),
    ("configs.OptimConfig.learning_rate = 0.0", "learning_rate"),
    ("configs.WarmStartConfig.expert_noise = 1.5", "expert_noise"),
    ("configs.EvalConfig.num_tasks = 0", "num_tasks"),
    ("transformer.TransformerConfig.num_heads = 3", "divisible"),
    ("transformer.TransformerConfig.position = 'learned'", "position"),
    ("transformer.TransformerConfig.max_turns = 4", "max_turns"),
    ("learner.train.tokenizer_path = '/nonexistent/tok.model'", "/nonexistent/tok.model"),
    ("configs.TrainConfig.seed = ", "configs.TrainConfig.seed"),
]


@pytest.fixture(scope="module")
def main():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


@pytest.mark.parametrize("binding,fragment", BAD_BINDINGS, ids=[b for b, _ in BAD_BINDINGS])
def test_bad_binding_fails_before_compute(main, tmp_path, capsys, binding, fragment):
  workdir = tmp_path / "run"
  code = main([f"--gin_file={QUICKSTART}", f"--gin_bindings={binding}", f"--workdir={workdir}"])
  err = capsys.readouterr().err
  assert code == 2
  assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
  assert fragment in err, err
  # Nothing was computed: no metrics, no checkpoints.
  assert not os.path.exists(workdir / "metrics.jsonl")
  assert not os.path.exists(workdir / "checkpoints")


def test_missing_gin_file_is_named(main, tmp_path, capsys):
  missing = str(tmp_path / "nope.gin")
  assert main([f"--gin_file={missing}", f"--workdir={tmp_path}"]) == 2
  assert missing in capsys.readouterr().err
