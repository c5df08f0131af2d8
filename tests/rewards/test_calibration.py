"""Tests for agentrl_jax.rewards.calibration (Iterative Reward Calibration)."""

import json

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.rewards import calibration

KEY = extra_keys.IRC_TURN_REWARD_KEY
NAMES = ("progress", "stalled", "noise")


def _batch(seed, b=8, n=4, success=None, faulted_row=None):
  """One token per action. Features: 'progress' rises with success, 'stalled' is its
  complement (anti-correlated), 'noise' has the same mean over the turns of successes and of
  failures (r_pb = 0)."""
  rng = np.random.RandomState(seed)
  traj = types.empty_trajectories(b, 2 * n, n)
  lengths = rng.randint(1, n + 1, size=b)
  for i in range(b):
    for k in range(lengths[i]):
      traj.turn_of_token[i, 2 * k:2 * k + 2] = k
      traj.action_mask[i, 2 * k + 1] = True
      traj.turn_start[i, k], traj.turn_end[i, k] = 2 * k + 1, 2 * k + 2
      traj.turn_mask[i, k] = traj.action_valid[i, k] = True
    traj.done[i, lengths[i] - 1] = True
  traj.success[:] = rng.rand(b) < 0.5 if success is None else success
  traj.outcome[:] = traj.success.astype(np.float32)
  traj.reward[np.arange(b), lengths - 1] = traj.outcome
  traj.group_id[:] = np.arange(b) // 4
  if faulted_row is not None:
    traj.env_error[faulted_row, 0] = True
  y = traj.success[:, None].astype(np.float32)
  progress = (y * rng.rand(b, n) + 0.3 * rng.rand(b, n)).astype(np.float32)
  noise = rng.randn(b, n)
  for outcome in (False, True):
    cell = traj.turn_mask & (traj.success == outcome)[:, None]
    noise[cell] -= noise[cell].mean() if cell.any() else 0.0
  traj = traj.replace(extras={
      "progress": np.where(traj.turn_mask, progress, 0).astype(np.float32),
      "stalled": np.where(traj.turn_mask, 1 - y, 0).astype(np.float32),
      "noise": np.where(traj.turn_mask, noise, 0).astype(np.float32)})
  traj.validate()
  return traj


def point_biserial_reference(f, y):
  """The point-biserial formula: (M1 − M0)/s_n · sqrt(n1·n0/n²), s_n the population std."""
  f, y = np.asarray(f, np.float64), np.asarray(y, bool)
  n1, n0 = y.sum(), (~y).sum()
  return (f[y].mean() - f[~y].mean()) / f.std() * np.sqrt(n1 * n0) / (n1 + n0)


def _pairs(traj):
  turns = traj.turn_mask & traj.valid_trajectory[:, None]
  features = np.stack([traj.extras[name] for name in NAMES], -1)
  return features[turns], np.broadcast_to(traj.success[:, None], turns.shape)[turns]


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_point_biserial_matches_the_formula_over_valid_turns(jit):
  traj = _batch(0, b=16, faulted_row=3)
  features = calibration.turn_features(traj, NAMES)
  fn = jax.jit(calibration.point_biserial) if jit else calibration.point_biserial
  r = np.asarray(fn(features, traj.success, calibration.calibration_turns(traj)))
  f, y = _pairs(traj)
  want = [point_biserial_reference(f[:, j], y) for j in range(len(NAMES))]
  np.testing.assert_allclose(r, want, atol=1e-6)
  np.testing.assert_allclose(r[1], -1.0, atol=1e-6)  # 'stalled' = 1 − success on every turn
  # The faulted row is not one of the pairs: including it changes the correlation.
  everything = traj.turn_mask.astype(bool)
  assert not np.allclose(fn(features, traj.success, everything), r, atol=1e-4)


def test_merged_moments_equal_the_pooled_turns():
  a, b = _batch(1), _batch(2, b=6)
  moments = [jax.device_get(calibration.correlation_moments(
      calibration.turn_features(t, NAMES), t.success, calibration.calibration_turns(t)))
             for t in (a, b)]
  window = calibration.empty_moments(len(NAMES))
  for m in moments:
    window = calibration.merge_moments(window, calibration.CorrelationMoments(
        *(np.asarray(x, np.float64) for x in m)))
  fa, ya = _pairs(a)
  fb, yb = _pairs(b)
  f, y = np.concatenate([fa, fb]), np.concatenate([ya, yb])
  want = [np.corrcoef(f[:, j], y)[0, 1] for j in range(len(NAMES))]
  np.testing.assert_allclose(calibration.correlation(window), want, atol=1e-6)
  assert window.count == len(y)


def test_tiers_and_sign_agreement():
  r = np.array([0.5, -0.5, 0.3, 0.29, -0.2, 0.1, 0.099, -0.35, 0.0])
  signs = np.array([1, -1, 1, 1, -1, 1, 1, 1, 1], np.float64)
  w = calibration.tier_weights(r, signs)
  np.testing.assert_array_equal(w, [1.0, -1.0, 1.0, 0.3, -0.3, 0.3, 0.0, 0.0, 0.0])
  # Against its designed sign a feature is dropped whatever its strength.
  np.testing.assert_array_equal(calibration.tier_weights(-r, signs)[:6], 0.0)
  np.testing.assert_allclose(jax.jit(calibration.tier_weights)(jnp.asarray(r), jnp.asarray(signs)),
                             w)


def test_anti_correlated_designed_positive_feature_is_dropped():
  traj = _batch(3, b=16)
  shaper = calibration.IterativeRewardCalibration(features=NAMES, every=1)
  shaper(traj)
  assert shaper.calibrations == 1
  # progress: strongly positive; stalled: r = −1 against a designed +1; noise: weak.
  assert shaper.correlations[0] >= 0.3 and shaper.correlations[1] == pytest.approx(-1.0)
  assert abs(shaper.correlations[2]) < 1e-6, shaper.correlations
  np.testing.assert_array_equal(shaper.weights, [1.0, 0.0, 0.0])
  # Designed as a bad sign, the same feature keeps its full (negative) weight.
  negative = calibration.IterativeRewardCalibration(features=NAMES, designed_signs=(1, -1, 1),
                                                    every=1)
  negative(traj)
  np.testing.assert_array_equal(negative.weights, [1.0, -1.0, 0.0])


def test_recalibrates_every_n_steps_under_jit():
  shaper = calibration.IterativeRewardCalibration(features=NAMES, every=2,
                                                  initial_weights=(0.5, 0.5, 0.5))
  step = jax.jit(shaper)
  batches = [jax.tree.map(jnp.asarray, _batch(seed, b=16)) for seed in (4, 5, 6)]

  def turn_reward(traj, weights):
    features = np.stack([np.asarray(traj.extras[n]) for n in NAMES], -1)
    return np.where(traj.turn_mask, features @ np.asarray(weights, np.float32), 0)

  out = step(batches[0])
  jax.effects_barrier()
  np.testing.assert_allclose(out.extras[KEY], turn_reward(batches[0], [0.5] * 3), atol=1e-6)
  assert (shaper.step, shaper.calibrations) == (1, 0)
  out = step(batches[1])  # still the initial weights; the window is full after it
  jax.effects_barrier()
  np.testing.assert_allclose(out.extras[KEY], turn_reward(batches[1], [0.5] * 3), atol=1e-6)
  assert (shaper.step, shaper.calibrations) == (2, 1)
  np.testing.assert_array_equal(shaper.weights, [1.0, 0.0, 0.0])
  out = step(batches[2])  # the new weights, without retracing
  jax.effects_barrier()
  np.testing.assert_allclose(out.extras[KEY], turn_reward(batches[2], [1.0, 0.0, 0.0]), atol=1e-6)
  assert shaper.step == 3 and shaper.calibrations == 1
  for name in ("reward", "outcome"):
    np.testing.assert_array_equal(getattr(out, name), getattr(batches[2], name))


def test_a_window_without_success_variance_keeps_the_weights():
  shaper = calibration.IterativeRewardCalibration(features=NAMES, every=1)
  shaper(_batch(7, success=np.zeros(8, bool)))
  assert shaper.calibrations == 0 and shaper._window_steps == 1
  np.testing.assert_array_equal(shaper.weights, [1.0, 1.0, 1.0])
  shaper(_batch(8, b=16))  # the window now holds both batches and success varies
  assert shaper.calibrations == 1 and shaper._window_steps == 0


def test_stop_when_stable_freezes_after_an_unchanged_calibration():
  shaper = calibration.IterativeRewardCalibration(features=NAMES, every=1, stop_when_stable=True)
  traj = _batch(9, b=16)
  shaper(traj)
  assert not shaper.frozen  # [1, 1, 1] -> [1, 0, 0]
  shaper(traj)
  assert shaper.frozen and shaper.calibrations == 2
  shaper(_batch(10, b=16))
  assert shaper.calibrations == 2 and shaper.step == 3


def _dampened_outcome_reference(traj, eta, eps=1e-6):
  """η·Â^O per trajectory: GRPO over the group, unbiased std, verl's group of one."""
  out = np.zeros(traj.batch_size)
  for b in range(traj.batch_size):
    peers = traj.outcome[traj.group_id == traj.group_id[b]].astype(np.float64)
    mean, std = (0.0, 1.0) if len(peers) == 1 else (peers.mean(), peers.std(ddof=1))
    out[b] = eta * (traj.outcome[b] - mean) / (std + eps)
  return out


def test_all_zero_weights_make_the_hybrid_the_dampened_outcome():
  traj = _batch(11, b=8)
  shaper = calibration.IterativeRewardCalibration(features=NAMES, initial_weights=(0, 0, 0))
  shaped = shaper(traj)
  np.testing.assert_array_equal(shaped.extras[KEY], 0.0)
  hybrid = jax.jit(lambda t: estimators.gtpo_hybrid(t, None, outcome_coef=0.5,
                                                    turn_reward_key=KEY))
  got = np.asarray(hybrid(shaped).advantages)
  want = np.where(traj.action_mask, _dampened_outcome_reference(traj, 0.5)[:, None], 0)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert np.abs(want).max() > 0.1
  # The env's own turn rewards (the outcome on the last turn) would have moved it.
  plain = np.asarray(jax.jit(estimators.gtpo_hybrid)(shaped, None).advantages)
  assert not np.allclose(plain, want, atol=1e-3)


def test_state_round_trips_through_json():
  shaper = calibration.IterativeRewardCalibration(features=NAMES, every=2)
  for seed in (12, 13, 14):  # one calibration, then one step into the next window
    shaper(_batch(seed, b=16))
  state = json.loads(json.dumps({k: v.tolist() for k, v in shaper.state_dict().items()}))
  restored = calibration.IterativeRewardCalibration(features=NAMES, every=2)
  restored.load_state_dict(state)
  for key, value in shaper.state_dict().items():
    np.testing.assert_array_equal(restored.state_dict()[key], value, err_msg=key)
  nxt = _batch(15, b=16)
  a, b = shaper(nxt), restored(nxt)
  np.testing.assert_array_equal(a.extras[KEY], b.extras[KEY])
  assert shaper.calibrations == restored.calibrations == 2
  np.testing.assert_array_equal(shaper.weights, restored.weights)
  np.testing.assert_array_equal(shaper.correlations, restored.correlations)
  with pytest.raises(ValueError, match="calibrated features"):
    calibration.IterativeRewardCalibration(features=("progress",)).load_state_dict(state)
  with pytest.raises(ValueError, match="missing"):
    restored.load_state_dict({"weights": [0, 0, 0]})


def test_bad_arguments_and_missing_features():
  with pytest.raises(ValueError, match="designed_signs"):
    calibration.IterativeRewardCalibration(features=NAMES, designed_signs=(1, 0, 1))
  with pytest.raises(ValueError, match="every"):
    calibration.IterativeRewardCalibration(features=NAMES, every=0)
  with pytest.raises(ValueError, match="distinct"):
    calibration.IterativeRewardCalibration(features=("a", "a"))
  with pytest.raises(ValueError, match=r"\['tool_ok'\] are not in traj.extras"):
    calibration.IterativeRewardCalibration(features=("tool_ok",))(_batch(0))


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_gin_switch_builds_the_calibrated_hybrid(clean_gin):
  from agentrl_jax.learner import assembly
  from agentrl_jax.learner import configs
  gin.parse_config("""
from __gin__ import dynamic_registration
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import configs
from agentrl_jax.rewards import calibration
configs.TrainConfig.estimator = @estimators.gtpo_hybrid
estimators.gtpo_hybrid.turn_reward_key = 'irc_turn_reward'
calibration.IterativeRewardCalibration.features = ('progress', 'stalled', 'noise')
calibration.IterativeRewardCalibration.initial_weights = (0.0, 0.0, 0.0)
""")
  shaper = gin.get_configurable(calibration.IterativeRewardCalibration)()
  config = gin.get_configurable(configs.TrainConfig)(tasks_per_iteration=2, group_size=4)
  pipeline = assembly.credit_pipeline(config, [shaper])
  traj = _batch(16, b=8)
  got = np.asarray(pipeline(traj).advantages)
  want = np.where(traj.action_mask, _dampened_outcome_reference(traj, 0.5)[:, None], 0)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert shaper.step == 1
