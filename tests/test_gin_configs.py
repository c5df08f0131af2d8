"""Every checked-in gin file parses, opens with its header, and names only real parameters."""

import pathlib

import gin
import pytest

from agentrl_jax import config_errors

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / "experiments" / "configs").glob("*.gin"))


def test_configs_found():
  assert len(CONFIGS) >= 20


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses_and_has_a_header(path):
  text = path.read_text()
  header = text.split("from __gin__", 1)[0]
  assert header.lstrip().startswith("#"), f"{path.name} must open with a header comment"
  assert "experiments/run.py" in header, f"{path.name}'s header must show the launch command"
  gin.clear_config()
  try:
    config_errors.parse_config([str(path)], [])
  finally:
    gin.clear_config()


BASES = sorted((CONFIGS[0].parent / "base").glob("*.gin"))


@pytest.mark.parametrize("path", BASES, ids=lambda p: p.stem)
def test_base_file_parses_alone(path):
  gin.clear_config()
  try:
    config_errors.parse_config([str(path)], [])
  finally:
    gin.clear_config()


def test_a_config_elsewhere_can_include_a_shipped_one(tmp_path):
  # quickstart.gin includes base/online.gin relative to itself; that must hold when quickstart.gin
  # is itself included by absolute path from another directory.
  mine = tmp_path / "mine.gin"
  mine.write_text(f"from __gin__ import dynamic_registration\n"
                  f"include '{CONFIGS[0].parent / 'quickstart.gin'}'\n"
                  "from agentrl_jax.learner import configs\n"
                  "configs.TrainConfig.num_iterations = 3\n")
  gin.clear_config()
  try:
    config_errors.parse_config([str(mine)], [])
    assert gin.query_parameter("configs.TrainConfig.num_iterations") == 3
    assert gin.query_parameter("configs.TrainConfig.env_name") == "frozenlake"  # from the base
  finally:
    gin.clear_config()
