"""Tests for `python -m agentrl_jax.viewer`: clear errors, and a report from a real checkpoint."""

import html.parser
import os
import pathlib
import subprocess
import sys

import gin
import pytest

from agentrl_jax.learner import evaluate_workdir
from agentrl_jax.viewer import __main__ as viewer_main

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

_MINIMAL_CONFIG = """
from __gin__ import dynamic_registration
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner

learner.train.config = @configs.TrainConfig()
configs.TrainConfig.num_iterations = 1
"""


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config(clear_constants=True)
  yield
  gin.clear_config(clear_constants=True)


def test_missing_config_names_the_file(tmp_path, capsys):
  assert viewer_main.main(["--workdir", str(tmp_path)]) == 2
  assert "config.gin not found" in capsys.readouterr().err


def test_workdir_without_checkpoint_says_so(tmp_path, capsys):
  (tmp_path / "config.gin").write_text(_MINIMAL_CONFIG)
  assert viewer_main.main(["--workdir", str(tmp_path)]) == 2
  assert "no checkpoint" in capsys.readouterr().err


def test_misspelled_viewer_binding_fails_naming_it(tmp_path, capsys):
  (tmp_path / "config.gin").write_text(_MINIMAL_CONFIG)
  code = viewer_main.main(["--workdir", str(tmp_path),
                           "--gin_bindings", "report.ViewerConfig.num_exampels = 3"])
  assert code == 2
  assert "num_exampels" in capsys.readouterr().err


def test_train_arguments_read_back_the_bound_configs(tmp_path):
  (tmp_path / "config.gin").write_text(_MINIMAL_CONFIG)
  gin.parse_config_file(str(tmp_path / "config.gin"))
  arguments = evaluate_workdir.train_arguments()
  assert arguments["config"].num_iterations == 1
  assert arguments["corrections"] == ()  # learner.train's default


class _Pipelines(html.parser.HTMLParser):
  def __init__(self):
    super().__init__()
    self.pipelines = set()

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if "data-pipeline" in attrs:
      self.pipelines.add(attrs["data-pipeline"])


@pytest.mark.slow
@pytest.mark.integration
def test_report_from_a_trained_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  bindings = ["configs.TrainConfig.num_iterations = 1", "configs.TrainConfig.tasks_per_iteration = 2",
              "configs.TrainConfig.group_size = 2", "configs.WarmStartConfig.iterations = 0",
              "configs.EvalConfig.num_tasks = 2", "configs.EvalConfig.pass_k = 0"]
  train = [sys.executable, str(REPO_ROOT / "experiments" / "run.py"),
           f"--gin_file={REPO_ROOT / 'experiments' / 'configs' / 'quickstart.gin'}",
           f"--workdir={workdir}", *[f"--gin_bindings={b}" for b in bindings]]
  subprocess.run(train, check=True, cwd=REPO_ROOT, capture_output=True, timeout=600)

  code = viewer_main.main(["--workdir", str(workdir), "--num_tasks", "1", "--gin_bindings",
                           "report.ViewerConfig.estimators = ('grpo', 'rloo')"])
  assert code == 0
  page = workdir / "viewer" / "iter_1.html"
  parser = _Pipelines()
  parser.feed(page.read_text(encoding="utf-8"))
  assert parser.pipelines == {"run: grpo", "grpo", "rloo"}
  assert os.path.exists(workdir / "viewer" / "index.html")
