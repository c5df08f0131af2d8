"""Tests of the TFDS trajectory store: exact round trips, versions, parts, errors."""

import numpy as np
import pytest

pytest.importorskip("tensorflow_datasets")

from agentrl_jax import types  # noqa: E402
from agentrl_jax.offline import store as store_lib  # noqa: E402


def _batch(seed, b=4, l=12, n=3):
  rng = np.random.default_rng(seed)
  t = types.empty_trajectories(b, l, n)
  t.tokens[:] = rng.integers(0, 500, size=(b, l))
  t.action_mask[:] = rng.random((b, l)) < 0.3
  t.turn_of_token[:] = rng.integers(-1, n, size=(b, l))
  t.sample_logprob[:] = rng.normal(size=(b, l)).astype(np.float32)
  t.turn_mask[:] = rng.random((b, n)) < 0.8
  t.reward[:] = rng.normal(size=(b, n)).astype(np.float32)
  t.done[:] = rng.random((b, n)) < 0.3
  t.obs_hash[:] = rng.integers(-2**31, 2**31 - 1, size=(b, n))
  t.action_valid[:] = rng.random((b, n)) < 0.9
  t.turn_start[:] = rng.integers(0, l, size=(b, n))
  t.turn_end[:] = t.turn_start + 1
  t.group_id[:] = np.arange(b) // 2
  t.outcome[:] = rng.normal(size=b).astype(np.float32)
  t.success[:] = rng.random(b) < 0.5
  return t.replace(sub_outcomes={"found": rng.random(b).astype(np.float32)})


def _assert_same(a, b):
  for name in ("tokens", "action_mask", "turn_of_token", "sample_logprob", "turn_mask", "reward",
               "done", "obs_hash", "action_valid", "env_error", "turn_start", "turn_end",
               "group_id", "outcome", "success"):
    x, y = getattr(a, name), getattr(b, name)
    assert x.dtype == y.dtype, name
    np.testing.assert_array_equal(x, y, err_msg=name)
  assert sorted(a.sub_outcomes) == sorted(b.sub_outcomes)
  for k in a.sub_outcomes:
    np.testing.assert_array_equal(a.sub_outcomes[k], b.sub_outcomes[k])


def test_round_trip_is_exact(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  batch = _batch(0)
  store.write(batch, seeds=[10, 11, 12, 13], policy_version=3)
  back, seeds = store.read(3)
  _assert_same(batch, back)
  np.testing.assert_array_equal(seeds, [10, 11, 12, 13])
  assert store.versions() == [3]


def test_parts_concatenate_with_rollout_padding(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  a, b = _batch(1, l=12), _batch(2, l=8)
  store.write(a, seeds=range(4), policy_version=0, part=0)
  store.write(b, seeds=range(4, 8), policy_version=0, part=1)
  both, seeds = store.read(0)
  assert both.tokens.shape == (8, 12)
  np.testing.assert_array_equal(both.tokens[4:, :8], b.tokens)
  np.testing.assert_array_equal(both.turn_of_token[4:, 8:], -1)
  assert not both.action_mask[4:, 8:].any()
  _assert_same(b, store.read(0, part=1)[0])
  np.testing.assert_array_equal(seeds, range(8))


def test_errors_name_the_problem(tmp_path):
  store = store_lib.TrajectoryStore(tmp_path)
  with pytest.raises(ValueError, match="no trajectories for policy version 5"):
    store.read(5)
  with pytest.raises(ValueError, match="3 seeds for 4"):
    store.write(_batch(0), seeds=[1, 2, 3], policy_version=0)
  store.write(_batch(0), seeds=range(4), policy_version=0)
  with pytest.raises(ValueError, match="already holds"):
    store.write(_batch(0), seeds=range(4), policy_version=0)
  with pytest.raises(ValueError, match="extras"):
    store.write(_batch(0).replace(extras={"x": np.zeros(4)}), seeds=range(4), policy_version=1)


def test_replayable_drops_derived_extras_but_refuses_context_floors():
  traj = types.empty_trajectories(2, 8, 3)
  traj.extras["search_turn"] = np.zeros((2, 3), np.float32)
  assert store_lib.replayable(traj).extras == {}
  traj.extras["context_floor"] = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match="context-window policy"):
    store_lib.replayable(traj)
