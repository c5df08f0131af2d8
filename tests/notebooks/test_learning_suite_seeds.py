"""The learning-suite notebook's STUDY_SEEDS: a malformed list stops the launch before any run."""

import pytest


@pytest.mark.parametrize("seeds", ["3,x", "-1", "3;4"])
def test_a_malformed_seed_list_stops_before_any_run(tmp_path, launch_notebook, seeds):
  result = launch_notebook("learning_suite", STUDY_SET="rl_share",
                           STUDY_ENVS="frozenlake_clone30", STUDY_SEEDS=seeds)
  assert result.returncode != 0
  assert result.stderr.strip().splitlines()[-1] == (
      f"STUDY_SEEDS={seeds!r} must be seeds >= 0 separated by commas, e.g. 3,4")
  assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
