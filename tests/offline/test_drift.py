"""Tests of DRIFT's return and config (the weights and loss are tested in tests/losses/test_sft.py)."""

import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.offline import drift


def test_trajectory_returns_hand_case():
  t = types.empty_trajectories(2, 4, 3)
  t.turn_mask[:] = [[1, 1, 1], [1, 1, 0]]
  t.reward[:] = [[0, 0, 1], [0, 1, 0]]
  t.action_valid[:] = [[1, 0, 1], [1, 1, 0]]
  t.obs_hash[:] = [[7, 7, 8], [3, 4, 0]]
  cfg = drift.DriftConfig(gamma=0.9, repetition_coef=0.5, format_penalty=-0.1)
  # Row 0: G = 0.81; one invalid action -0.1; 2 distinct of 3 turns -> 0.5*(1-2/3) = 1/6.
  # Row 1: G = 0.9; no invalid action; 2 distinct of 2 turns -> 0.
  np.testing.assert_allclose(drift.trajectory_returns(t, cfg), [0.81 - 0.1 - 1 / 6, 0.9], atol=1e-6)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"reference": "oracle"}, "reference"), ({"beta": 0.0}, "beta"), ({"gamma": 1.5}, "gamma"),
    ({"num_batches": 0}, "num_batches")])
def test_config_rejects_bad_values(kwargs, fragment):
  with pytest.raises(ValueError, match=fragment):
    drift.DriftConfig(**kwargs)
