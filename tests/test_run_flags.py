"""Tests for experiments/run.py and agentrl_jax.config_errors: bad configs fail early, clearly."""

import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import gin
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import metrics

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN_PY = REPO_ROOT / "experiments" / "run.py"

_TOY_MODULE = '''
import dataclasses

from agentrl_jax import config_errors


@config_errors.config_class
@dataclasses.dataclass(frozen=True)
class Checked:
  size: int = 1

  def __post_init__(self):
    if self.size < 1:
      raise ValueError(f"Checked.size must be >= 1, got {self.size}")


def run(workdir, config=None, fail_with=None, stopped=None):
  if fail_with == "config":
    raise config_errors.ConfigError("the loop found a conflict before computing")
  if fail_with == "bug":
    raise ValueError("a bug inside the loop")
  if stopped is not None:  # how the learner's loops end: a driver outcome
    from agentrl_jax.learner import driver
    return driver.Outcome(method="toy", state=None, iterations=1, resumed_from=None,
                          success_before=None, success_after_warm_start=None, success_after=0.0,
                          final_metrics={}, preempted=stopped)
  return workdir, config


def train(workdir, num_iterations=10, learning_rate=1e-3, optimizer=None):
  return workdir, num_iterations, learning_rate, optimizer


def make_optimizer(momentum=0.9):
  return momentum


@dataclasses.dataclass(frozen=True)
class Config:
  batch_size: int = 8
'''


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config(clear_constants=True)
  yield
  gin.clear_config(clear_constants=True)


@pytest.fixture(scope="session")
def _toy_module_dir(tmp_path_factory):
  """Makes `toylearner` importable, once: gin's registry outlives `clear_config`, and a second
  module object with the same name would clash with the functions registered from the first."""
  directory = tmp_path_factory.mktemp("toy_module")
  (directory / "toylearner.py").write_text(_TOY_MODULE)
  sys.path.insert(0, str(directory))
  importlib.invalidate_caches()
  yield directory
  sys.path.remove(str(directory))


@pytest.fixture
def toy(_toy_module_dir, tmp_path):
  """A gin file binding the configurable module `toylearner`."""
  gin_file = tmp_path / "toy.gin"
  gin_file.write_text(textwrap.dedent("""\
      from __gin__ import dynamic_registration
      import toylearner

      toylearner.train.num_iterations = 3
      """))
  return gin_file


def _parse(gin_files, bindings=()):
  config_errors.parse_config([str(f) for f in gin_files], list(bindings))


def _error(gin_files, bindings=()) -> str:
  with pytest.raises(config_errors.ConfigError) as info:
    _parse(gin_files, bindings)
  message = str(info.value)
  assert "\n" not in message, "errors must be one line"
  return message


def _load_run_module():
  spec = importlib.util.spec_from_file_location("experiments_run", RUN_PY)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_good_file_and_bindings_parse(toy):
  _parse([toy], ["toylearner.train.learning_rate = 0.5",
                 # A function the file never mentions can still be bound from the command line.
                 "toylearner.train.optimizer = @toylearner.make_optimizer()",
                 "toylearner.make_optimizer.momentum = 0.5"])
  assert gin.query_parameter("toylearner.train.num_iterations") == 3
  assert gin.query_parameter("toylearner.train.learning_rate") == 0.5
  assert gin.query_parameter("toylearner.make_optimizer.momentum") == 0.5


def test_misspelled_parameter_names_binding_and_suggests_the_real_one(toy):
  message = _error([toy], ["toylearner.train.num_iteratons = 3"])
  assert "'toylearner.train.num_iteratons = 3'" in message
  assert "no parameter 'num_iteratons'" in message
  assert "did you mean parameter 'num_iterations'?" in message


def test_misspelled_dataclass_field_suggests_the_field(toy):
  message = _error([toy], ["toylearner.Config.batch_sise = 4"])
  assert "did you mean parameter 'batch_size'?" in message


def test_parameter_with_no_close_match_lists_the_real_ones(toy):
  message = _error([toy], ["toylearner.make_optimizer.zzz = 1"])
  assert "no parameter 'zzz'" in message and "(its parameters: momentum)" in message


def test_misspelled_function_names_binding_and_suggests_the_real_one(toy):
  message = _error([toy], ["toylearner.trian.x = 1"])
  assert "'toylearner.trian.x = 1'" in message
  assert "no function or class 'toylearner.trian'" in message
  assert "did you mean 'toylearner.train'?" in message


def test_misspelled_module_alias_is_named(toy):
  message = _error([toy], ["toylerner.train.num_iterations = 1"])
  assert "'toylerner' is not imported by the config; did you mean alias 'toylearner'?" in message


def test_misspelled_reference_is_named(toy):
  message = _error([toy], ["toylearner.train.optimizer = @toylearner.make_optimiser()"])
  assert "toylearner.make_optimiser" in message
  assert "did you mean 'toylearner.make_optimizer'?" in message


def test_error_inside_a_gin_file_names_file_and_line(toy, tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text(toy.read_text() + "toylearner.train.learning_rat = 0.1\n")
  message = _error([bad])
  assert f"{bad}:5:" in message and "did you mean parameter 'learning_rate'?" in message


def test_syntax_error_names_the_binding(toy):
  message = _error([toy], ["toylearner.train.learning_rate = 0.1 +"])
  assert "'toylearner.train.learning_rate = 0.1 +'" in message and "syntax error" in message


def test_missing_gin_file_names_the_path(tmp_path):
  missing = tmp_path / "nope.gin"
  message = _error([missing])
  assert str(missing) in message and "no such file" in message


def test_gin_file_found_through_search_path(toy, tmp_path):
  config_errors.parse_config(["toy.gin"], [], search_paths=[str(tmp_path)])
  assert gin.query_parameter("toylearner.train.num_iterations") == 3


def test_failing_default_import_is_reported():
  with pytest.raises(config_errors.ConfigError, match="no_such_module_xyz"):
    config_errors.parse_config([], [], default_imports=["import no_such_module_xyz"])


def test_configure_writes_config_gin_before_compute(toy, tmp_path, monkeypatch):
  run = _load_run_module()
  monkeypatch.setattr(run, "DEFAULT_IMPORTS", ("import toylearner",))
  monkeypatch.setattr(run, "DEFAULT_BINDINGS", ())
  workdir = tmp_path / "work"
  args = run.parse_flags([f"--gin_file={toy}", "--gin_bindings=toylearner.train.learning_rate=2.0",
                          f"--workdir={workdir}"])
  assert run.configure(args) == str(workdir)
  written = (workdir / metrics.CONFIG_FILE).read_text()
  assert "toylearner.train.num_iterations = 3" in written
  assert "toylearner.train.learning_rate = 2.0" in written


def test_default_workdir_is_runs_slash_first_gin_stem(tmp_path):
  run = _load_run_module()
  assert run.default_workdir(["experiments/configs/quickstart.gin", "x.gin"]) == os.path.join(
      "runs", "quickstart")
  with pytest.raises(config_errors.ConfigError, match="--workdir"):
    run.default_workdir([])


def test_main_reports_a_bad_binding_with_exit_status_2(toy, tmp_path, monkeypatch, capsys):
  run = _load_run_module()
  monkeypatch.setattr(run, "DEFAULT_IMPORTS", ("import toylearner",))
  monkeypatch.setattr(run, "DEFAULT_BINDINGS", ())
  status = run.main([f"--gin_file={toy}", "--gin_bindings=toylearner.train.num_iteratons=3",
                     f"--workdir={tmp_path / 'work'}"])
  assert status == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --gin_bindings 'toylearner.train.num_iteratons=3'")
  assert len(err.strip().splitlines()) == 1
  assert not (tmp_path / "work").exists(), "nothing may be written before the config is valid"


def test_write_operative_config_only_on_process_0(toy, tmp_path):
  _parse([toy])
  toylearner = importlib.import_module("toylearner")
  gin.get_configurable(toylearner.train)(workdir="w")
  assert _write_operative(tmp_path, process_index=1) is None
  path = _write_operative(tmp_path, process_index=0)
  assert "num_iterations = 3" in pathlib.Path(path).read_text()


def _write_operative(workdir, process_index):
  """Calls the helper through run.py, where the brief exposes it."""
  return _load_run_module().write_operative_config(workdir, process_index=process_index)


def test_run_py_subprocess_rejects_a_misspelled_learner_binding(tmp_path):
  result = subprocess.run(
      [sys.executable, str(RUN_PY), "--gin_bindings=learner.train.num_iteratons=3",
       f"--workdir={tmp_path / 'work'}"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr.startswith("error: --gin_bindings 'learner.train.num_iteratons=3': "
                                  "learner.train has no parameter 'num_iteratons'")
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert not (tmp_path / "work").exists()


def test_run_py_subprocess_reports_a_missing_gin_file(tmp_path):
  missing = tmp_path / "missing.gin"
  result = subprocess.run(
      [sys.executable, str(RUN_PY), f"--gin_file={missing}"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 2
  assert str(missing) in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def _toy_run_module(monkeypatch):
  """experiments/run.py whose training loop is `toylearner.run`."""
  run = _load_run_module()
  monkeypatch.setattr(run, "DEFAULT_IMPORTS", ("import toylearner",))
  monkeypatch.setattr(run, "DEFAULT_BINDINGS", ())
  monkeypatch.setattr(run, "LEARNER_MODULE", "toylearner")
  return run


@pytest.mark.parametrize("binding,reported", [
    ("toylearner.run.config = @toylearner.Checked()\ntoylearner.Checked.size = 0",
     "Checked.size must be >= 1, got 0"),
    ("toylearner.run.fail_with = 'config'", "the loop found a conflict before computing"),
])
def test_main_reports_config_errors_by_type(toy, tmp_path, monkeypatch, capsys, binding, reported):
  run = _toy_run_module(monkeypatch)
  gin_file = tmp_path / "fail.gin"
  gin_file.write_text(f"from __gin__ import dynamic_registration\nimport toylearner\n{binding}\n")
  assert run.main([f"--gin_file={gin_file}", f"--workdir={tmp_path / 'work'}"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and reported in err and len(err.strip().splitlines()) == 1, err


def test_main_lets_a_bug_inside_the_loop_raise(toy, tmp_path, monkeypatch):
  run = _toy_run_module(monkeypatch)
  gin_file = tmp_path / "bug.gin"
  gin_file.write_text("from __gin__ import dynamic_registration\nimport toylearner\n"
                      "toylearner.run.fail_with = 'bug'\n")
  with pytest.raises(ValueError, match="a bug inside the loop"):
    run.main([f"--gin_file={gin_file}", f"--workdir={tmp_path / 'work'}"])


@pytest.mark.parametrize("stopped,status", [(False, 0), (True, 75)])
def test_a_stopped_run_exits_75_and_a_finished_one_0(toy, tmp_path, monkeypatch, stopped, status):
  # A scheduler relaunches on 75 (the checkpoint resumes); 0 is done, 2 a bad config.
  run = _toy_run_module(monkeypatch)
  gin_file = tmp_path / "stop.gin"
  gin_file.write_text("from __gin__ import dynamic_registration\nimport toylearner\n"
                      f"toylearner.run.stopped = {stopped}\n")
  assert run.main([f"--gin_file={gin_file}", f"--workdir={tmp_path / 'work'}"]) == status
