"""A relaunch whose config differs from the one its workdir's checkpoints were made with stops
with a one-line diff, unless --allow_config_change says to go on; then the change is recorded."""

import importlib.util
import pathlib

import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import metrics

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "experiments" / "configs" / "quickstart.gin")


@pytest.fixture(scope="module")
def run():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _args(run, workdir, *bindings, allow=False):
  return run.parse_flags([f"--gin_file={QUICKSTART}", f"--workdir={workdir}",
                          *[f"--gin_bindings={b}" for b in bindings],
                          *(["--allow_config_change"] if allow else [])])


@pytest.fixture
def resumable(run, tmp_path):
  """A workdir as a launch with seed 0 leaves it: its config and a finalised checkpoint step 3."""
  workdir = tmp_path / "run"
  run.configure(_args(run, workdir, "configs.TrainConfig.seed = 0"))
  (workdir / "checkpoints" / "3").mkdir(parents=True)
  return workdir


def test_changed_config_stops_with_a_one_line_diff(run, resumable, capsys):
  recorded = (resumable / metrics.CONFIG_FILE).read_text()
  code = run.main([f"--gin_file={QUICKSTART}", f"--workdir={resumable}",
                   "--gin_bindings=configs.TrainConfig.seed = 1",
                   "--gin_bindings=configs.OptimConfig.learning_rate = 0.01"])
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
  assert "configs.TrainConfig.seed: 0 -> 1" in err, err
  assert "configs.OptimConfig.learning_rate: 0.0003 -> 0.01" in err, err
  assert "--allow_config_change" in err
  assert (resumable / metrics.CONFIG_FILE).read_text() == recorded, "the record must survive"
  assert not (resumable / metrics.CONFIG_CHANGES_FILE).exists()


def test_changed_config_raises_at_configure(run, resumable):
  with pytest.raises(config_errors.ConfigError, match=r"configs\.TrainConfig\.seed: 0 -> 1"):
    run.configure(_args(run, resumable, "configs.TrainConfig.seed = 1"))


def test_allowed_change_goes_on_and_is_recorded_with_its_iteration(run, resumable):
  assert run.configure(_args(run, resumable, "configs.TrainConfig.seed = 1", allow=True)) == str(
      resumable)
  (change,) = metrics.read_config_changes(resumable)
  assert change["iteration"] == 3
  assert change["changes"] == ["configs.TrainConfig.seed: 0 -> 1"]
  assert "configs.TrainConfig.seed = 1" in (resumable / metrics.CONFIG_FILE).read_text()
  # The same launch again is no new change.
  run.configure(_args(run, resumable, "configs.TrainConfig.seed = 1"))
  assert len(metrics.read_config_changes(resumable)) == 1


def test_same_config_resumes_silently(run, resumable):
  run.configure(_args(run, resumable, "configs.TrainConfig.seed = 0"))
  assert not (resumable / metrics.CONFIG_CHANGES_FILE).exists()


def test_workdir_without_a_checkpoint_takes_any_config(run, tmp_path):
  workdir = tmp_path / "run"
  run.configure(_args(run, workdir, "configs.TrainConfig.seed = 0"))
  run.configure(_args(run, workdir, "configs.TrainConfig.seed = 1"))  # nothing to resume
  assert "configs.TrainConfig.seed = 1" in (workdir / metrics.CONFIG_FILE).read_text()


def test_unfinished_checkpoint_is_not_a_resume(run, tmp_path):
  workdir = tmp_path / "run"
  run.configure(_args(run, workdir, "configs.TrainConfig.seed = 0"))
  (workdir / "checkpoints" / "3.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)
  run.configure(_args(run, workdir, "configs.TrainConfig.seed = 1"))


def test_diff_of_wrapped_values_and_unset_bindings():
  old = "a.B.x = 1\na.B.long = [1,\n    2]\n# comment\na.B.gone = 'y'\n"
  new = "a.B.x = 1\na.B.long = [1, 3]\na.B.new = True\n"
  assert metrics.config_changes(old, new) == [
      "a.B.gone: 'y' -> (unset)", "a.B.long: [1, 2] -> [1, 3]", "a.B.new: (unset) -> True"]
  assert metrics.config_changes(old, old) == []
