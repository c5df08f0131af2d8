"""An empty config and an unusable workdir each fail at launch: one line, exit status 2."""

import importlib.util
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "experiments" / "configs" / "quickstart.gin")
# Cheap bindings: these tests fail before any compute, so they never run.
FAST = ["--gin_bindings=configs.TrainConfig.num_iterations = 1"]


@pytest.fixture(scope="module")
def main():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


def _one_line_error(capsys) -> str:
  err = capsys.readouterr().err
  assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
  assert "Traceback" not in err
  return err


@pytest.mark.parametrize("argv", [[], ["--gin_file={empty}"]], ids=["no_flags", "empty_file"])
def test_empty_config_is_refused_naming_the_quickstart(main, tmp_path, capsys, argv):
  empty = tmp_path / "empty.gin"
  empty.write_text("from __gin__ import dynamic_registration\n# nothing bound\n")
  workdir = tmp_path / "run"
  code = main([a.format(empty=empty) for a in argv] + [f"--workdir={workdir}"])
  err = _one_line_error(capsys)
  assert code == 2
  assert "experiments/configs/quickstart.gin" in err, err
  assert not workdir.exists()


def test_workdir_that_is_a_file(main, tmp_path, capsys):
  workdir = tmp_path / "a_file"
  workdir.write_text("not a directory")
  code = main([f"--gin_file={QUICKSTART}", *FAST, f"--workdir={workdir}"])
  err = _one_line_error(capsys)
  assert code == 2 and str(workdir) in err and "not a directory" in err, err
  assert workdir.read_text() == "not a directory"


def test_workdir_that_cannot_be_created(main, tmp_path, capsys):
  parent = tmp_path / "a_file"
  parent.write_text("")
  workdir = parent / "run"
  code = main([f"--gin_file={QUICKSTART}", *FAST, f"--workdir={workdir}"])
  err = _one_line_error(capsys)
  assert code == 2 and str(workdir) in err and "cannot create" in err, err


def _unwritable_directory(tmp_path) -> str:
  if os.geteuid() != 0:
    directory = tmp_path / "read_only"
    directory.mkdir()
    directory.chmod(0o500)
    return str(directory)
  # root ignores permission bits; sysfs takes no new files from anyone.
  if not os.path.isdir("/sys"):
    pytest.skip("running as root without /sys: no directory root cannot write")
  return "/sys"


def test_workdir_that_is_not_writable(main, tmp_path, capsys):
  workdir = _unwritable_directory(tmp_path)
  code = main([f"--gin_file={QUICKSTART}", *FAST, f"--workdir={workdir}"])
  err = _one_line_error(capsys)
  assert code == 2 and workdir in err and "not writable" in err, err
