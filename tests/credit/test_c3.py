"""Tests for agentrl_jax.credit.c3 (docs/methods.md#c3)."""

import functools

import jax
import numpy as np
import pytest

from agentrl_jax.credit import c3

from credit_batches import Turn, make_batch, outcome_advantages

CORRECT = jax.jit(c3.c3)


def test_hand_checked_invalid_and_repeated_turns():
  # Row 0: turn 1 invalid (logp −0.5 on both tokens → conf = e^−0.5 = 0.6065, φ = 0.3935).
  # Row 1: turn 2 repeats turn 1's action from the same state (obs after turn 0 and after turn 1
  # both hash to 7), logp −2 → conf = e^−2 = 0.1353, φ = 0.8647. Row 1's advantage is negative
  # on row 2: untouched.
  rows = [
      [Turn(act=(10, 11), obs_hash=1), Turn(act=(12, 11), valid=False, obs_hash=2), Turn(act=(13,), obs_hash=3)],
      [Turn(act=(10,), obs_hash=7), Turn(act=(11,), obs_hash=7, logp=-2.0), Turn(act=(11,), obs_hash=7, logp=-2.0)],
      [Turn(act=(10,), obs_hash=7), Turn(act=(11,), obs_hash=7), Turn(act=(11,), obs_hash=7)],
  ]
  traj = make_batch(rows)
  a = outcome_advantages(traj, [1.0, 2.0, -1.0])
  out = np.asarray(CORRECT(traj, a))
  expected = a.copy()
  expected[0][(traj.turn_of_token[0] == 1) & traj.action_mask[0]] = 1 - np.exp(-0.5)
  expected[1][(traj.turn_of_token[1] == 2) & traj.action_mask[1]] = 2 * (1 - np.exp(-2.0))
  np.testing.assert_allclose(out, expected, atol=1e-6)


def test_only_positive_flagged_tokens_change_and_never_grow():
  rng = np.random.default_rng(0)
  from credit_batches import random_batch
  traj = random_batch(rng, b=8)
  a = (rng.normal(size=traj.tokens.shape) * traj.action_mask).astype(np.float32)
  out = np.asarray(CORRECT(traj, a))
  flagged = np.asarray(c3.flagged_turns(traj, ("invalid_action", "repeat_action")))
  in_span = np.take_along_axis(flagged, np.clip(traj.turn_of_token, 0, 3), 1) & traj.action_mask
  untouched = ~in_span | (a <= 0)
  np.testing.assert_array_equal(out[untouched], a[untouched])
  assert np.all((out[~untouched] >= 0) & (out[~untouched] <= a[~untouched]))
  assert np.any(out != a)


def test_higher_confidence_span_is_corrected_more():
  rows = [[Turn(act=(10,), valid=False, logp=-0.1)], [Turn(act=(10,), valid=False, logp=-1.0)]]
  traj = make_batch(rows)
  a = outcome_advantages(traj, [1.0, 1.0])
  out = np.asarray(CORRECT(traj, a))
  assert out[0].sum() < out[1].sum()
  low = np.asarray(jax.jit(functools.partial(c3.c3, direction="low_conf_stronger"))(traj, a))
  assert low[0].sum() > low[1].sum()


def test_behaviour_flag_extra_and_inputs_not_mutated():
  traj = make_batch([[Turn(act=(10, 11, 12), logp=-1.0)]])
  flag = np.zeros(traj.tokens.shape, bool)
  flag[0, 2:4] = True  # the first two of the three action tokens (after 2 obs tokens)
  traj = traj.replace(extras={"behaviour_flag": flag})
  a = outcome_advantages(traj, [1.0])
  before = a.copy()
  out = np.asarray(CORRECT(traj, a))
  np.testing.assert_allclose(out[0, 2:4], 1 - np.exp(-1.0), atol=1e-6)
  assert out[0, 4] == 1.0
  np.testing.assert_array_equal(a, before)


def test_validation_and_detector_keys():
  traj = make_batch([[Turn()]])
  a = outcome_advantages(traj, [1.0])
  with pytest.raises(ValueError, match="min_factor must be in"):
    c3.c3(traj, a, min_factor=-0.1)
  with pytest.raises(ValueError, match="unknown"):
    c3.c3(traj, a, detectors=("loops",))
  with pytest.raises(ValueError, match=r"needs traj.extras\['tool_call'\]"):
    c3.c3(traj, a, detectors=("redundant_tool_call",))
