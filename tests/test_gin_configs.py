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
