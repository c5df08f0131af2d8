"""Tests for agentrl_jax.credit.pearl (docs/methods.md#pearl)."""

import json

import jax
import numpy as np
import pytest

from agentrl_jax.credit import pearl

from credit_batches import Turn, make_batch, outcome_advantages, random_batch


def sibling_batch():
  """One group of three: all start with action 10; then rows diverge at turn 1 or 2.

  Row 0 (success, R = 1): 10, 11, 12.   Row 1 (R = 0): 10, 13.   Row 2 (R = 0): 10, 11, 13.
  Row 1 pairs with row 0 at k* = 1; row 2 pairs with row 0 at k* = 2 (longer shared prefix).
  """
  rows = [
      [Turn(act=(10,)), Turn(act=(11,)), Turn(act=(12,), reward=1.0)],
      [Turn(act=(10,)), Turn(act=(13,))],
      [Turn(act=(10,)), Turn(act=(11,)), Turn(act=(13,))],
  ]
  return make_batch(rows)


def test_first_divergence_by_hand():
  traj = sibling_batch()
  features = pearl.decision_features(traj)
  d = jax.jit(pearl.first_divergence)(traj, features)
  np.testing.assert_array_equal(d.lower, [False, True, True])
  np.testing.assert_array_equal(d.turn[1:], [1, 2])
  np.testing.assert_array_equal(d.partner[1:], [0, 0])
  np.testing.assert_array_equal(d.upper_success, [False, True, True])
  np.testing.assert_allclose(d.lower_features[1], features[1, 1], atol=1e-6)
  np.testing.assert_allclose(d.upper_features[2], features[0, 2], atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(features[0, :3], axis=-1), 1.0, atol=1e-5)


def memory_with_recurring_failure(traj, **kw):
  """Failures of action 13 seen at 3 steps; no success looks like them."""
  memory = pearl.PearlMemory(**kw)
  d = memory.decisions(traj)
  lonely = d._replace(upper_success=np.zeros(3, bool))
  for _ in range(3):
    memory.observe(jax.device_get(lonely))
  return memory


def test_strengthens_only_negative_tokens_of_the_divergence_turn():
  traj = sibling_batch()
  memory = memory_with_recurring_failure(traj, update_memory=False)
  # Cluster of action-13 decisions: 2 per step × 3 steps = 6 → ρ = 6/10; factor 1 + 0.5·0.6 = 1.3.
  _, counts, distinct = memory.clusters()
  assert counts.max() == 6 and distinct.max() == 3
  a = outcome_advantages(traj, [1.0, -1.0, -2.0])
  out = np.asarray(memory(traj, a))
  expected = a.copy()
  expected[1][(traj.turn_of_token[1] == 1) & traj.action_mask[1]] *= 1.3
  expected[2][(traj.turn_of_token[2] == 2) & traj.action_mask[2]] *= 1.3
  np.testing.assert_allclose(out, expected, atol=1e-6)
  suffix = memory_with_recurring_failure(traj, update_memory=False, location="suffix")
  assert np.all(np.asarray(suffix(traj, a))[:, :] <= a + 1e-6)


def test_identity_on_empty_memory_or_success_match():
  traj = sibling_batch()
  a = outcome_advantages(traj, [1.0, -1.0, -2.0])
  np.testing.assert_array_equal(pearl.PearlMemory(update_memory=False)(traj, a), a)
  memory = memory_with_recurring_failure(traj, update_memory=False)
  # The same decisions now also recorded as successes: the veto applies.
  d = jax.device_get(memory.decisions(traj))
  memory.observe(d._replace(upper_features=d.lower_features, upper_success=d.lower))
  np.testing.assert_array_equal(memory(traj, a), a)


def test_bounds_on_random_batches():
  rng = np.random.default_rng(0)
  memory = pearl.PearlMemory(min_count=1, cluster_threshold=0.5)
  correct = jax.jit(memory)  # the memory still grows each call, through host callbacks
  for _ in range(4):
    traj = random_batch(rng, b=8)
    a = (rng.normal(size=traj.tokens.shape) * traj.action_mask).astype(np.float32)
    out = np.asarray(correct(traj, a))
    assert np.all(out[a >= 0] == a[a >= 0])                        # positives and zeros untouched
    neg = a < 0
    assert np.all(out[neg] <= a[neg] + 1e-7) and np.all(out[neg] >= 1.5 * a[neg] - 1e-6)


def test_memory_updates_under_jit_and_window():
  traj = sibling_batch()
  a = outcome_advantages(traj, [1.0, -1.0, -2.0])
  memory = pearl.PearlMemory(window=2)
  jitted = jax.jit(memory)
  outputs = [np.asarray(jitted(traj, a)) for _ in range(4)]
  assert memory.step == 4
  assert len(memory.state_dict()["failure_steps"]) == 4  # 2 per step, the last 2 steps
  np.testing.assert_array_equal(outputs[0], a)  # nothing remembered before the first batch


def test_state_dict_round_trip_and_validation():
  traj = sibling_batch()
  memory = memory_with_recurring_failure(traj)
  restored = pearl.PearlMemory()
  restored.load_state_dict(memory.state_dict())
  for x, y in zip(memory.memory_arrays(), restored.memory_arrays()):
    np.testing.assert_array_equal(x, y)
  assert restored.step == 3
  # Through JSON, as the learner's checkpoint `extra` stores host state; also when empty.
  for source in (memory, pearl.PearlMemory()):
    as_json = json.loads(json.dumps({k: v.tolist() for k, v in source.state_dict().items()}))
    again = pearl.PearlMemory()
    again.load_state_dict(as_json)
    for x, y in zip(source.memory_arrays(), again.memory_arrays()):
      np.testing.assert_array_equal(x, y)
  with pytest.raises(ValueError, match="missing"):
    restored.load_state_dict({"step": 1})
  with pytest.raises(ValueError, match="location must be one of"):
    pearl.PearlMemory(location="everywhere")


def test_recurrence_needs_two_training_steps():
  # One training step with 2 failures of action 13 (rows 1 and 2) fills a cluster to n_min = 2,
  # but it was seen in one step only: not recurring, so no strengthening. A second step makes it
  # recurring (count 4, 2 steps): ρ = 4/10, factor 1 + 0.5·0.4 = 1.2 on the divergence turns.
  traj = sibling_batch()
  a = outcome_advantages(traj, [1.0, -1.0, -2.0])
  memory = pearl.PearlMemory(min_count=2, update_memory=False)
  lonely = jax.device_get(memory.decisions(traj))._replace(upper_success=np.zeros(3, bool))
  memory.observe(lonely)
  _, counts, distinct = memory.clusters()
  assert counts.max() == 2 and distinct.max() == 1
  assert not memory.memory_arrays().recurring.any()
  np.testing.assert_array_equal(memory(traj, a), a)
  memory.observe(lonely)
  assert memory.memory_arrays().recurring.sum() == 1
  expected = a.copy()
  expected[1][(traj.turn_of_token[1] == 1) & traj.action_mask[1]] *= 1.2
  expected[2][(traj.turn_of_token[2] == 2) & traj.action_mask[2]] *= 1.2
  np.testing.assert_allclose(memory(traj, a), expected, atol=1e-6)
