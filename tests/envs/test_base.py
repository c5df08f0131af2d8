"""The free-text action checks every text env starts from."""

import pytest

from agentrl_jax.envs import base


@pytest.mark.parametrize("action, problem", [
    (None, "action of type NoneType"),
    (3, "action of type int"),
    ("   ", "empty action"),
    ("x" * 11, "action of 11 characters is longer than 10"),
    ("  go north  ", None),  # surrounding spaces do not count towards the limit
    ("x" * 10, None),
])
def test_text_action_problem(action, problem):
  assert base.text_action_problem(action, max_chars=10) == problem
