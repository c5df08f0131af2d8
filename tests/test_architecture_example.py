"""docs/architecture.md's worked example: a new correction in one file, composed in the pipeline."""

import importlib.util
import pathlib
import re

import jax.numpy as jnp
import numpy as np

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import pipeline

GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _example_module(tmp_path):
  text = GUIDE.read_text()
  code = re.search(r"### Worked example: a new correction.*?```python\n(.*?)```", text, re.S).group(1)
  assert len(code.strip().splitlines()) <= 30, "the guide promises a correction in <= 30 lines"
  path = tmp_path / "invalid_halving.py"
  path.write_text(code)
  spec = importlib.util.spec_from_file_location("invalid_halving", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _batch():
  # Two trajectories of two one-token turns; row 0's second action was invalid.
  traj = types.empty_trajectories(2, 6, 2)
  traj.tokens[:, :4] = [[5, 7, 5, 8], [5, 7, 5, 7]]
  traj.turn_of_token[:, :4] = [0, 0, 1, 1]
  traj.action_mask[:, [1, 3]] = True
  traj.turn_start[:] = [1, 3]
  traj.turn_end[:] = [2, 4]
  traj.turn_mask[:] = True
  traj.action_valid[:] = True
  traj.action_valid[0, 1] = False
  traj.outcome[:] = [1.0, 0.0]
  traj.group_id[:] = 0
  return traj.replace(**{k: jnp.asarray(getattr(traj, k)) for k in (
      "tokens", "turn_of_token", "action_mask", "turn_start", "turn_end", "turn_mask",
      "action_valid", "outcome", "group_id")})


def test_the_guides_correction_halves_invalid_turns_after_any_estimator(tmp_path):
  module = _example_module(tmp_path)
  traj = _batch()
  plain = pipeline.CreditPipeline(estimator=estimators.get_estimator("grpo"))(traj).advantages
  corrected = pipeline.CreditPipeline(estimator=estimators.get_estimator("grpo"),
                                      corrections=(module.halve_invalid_turns,))(traj).advantages
  plain, corrected = np.asarray(plain), np.asarray(corrected)
  # Row 0 token 3 is the invalid turn's action: halved; every other token unchanged.
  np.testing.assert_allclose(corrected[0, 3], 0.5 * plain[0, 3], rtol=1e-6)
  keep = np.ones_like(plain, bool)
  keep[0, 3] = False
  np.testing.assert_array_equal(corrected[keep], plain[keep])
  assert plain[0, 3] != 0  # the case is not vacuous


def test_the_guides_gin_line_names_the_function():
  text = GUIDE.read_text()
  assert "learner.train.corrections = [@invalid_halving.halve_invalid_turns]" in text
