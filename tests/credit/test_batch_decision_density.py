"""The critic-free decision density of a batch: group means of return-to-go per state and per
(state, action), against a dictionary-loop reference."""

import collections

import numpy as np
import pytest

from agentrl_jax.advantages import density

from credit_batches import Turn, make_batch, random_batch


def reference(traj, threshold):
  """ρ̂ by dictionaries over (group, anchor state) and (group, anchor state, action ids)."""
  b, n = traj.turn_mask.shape
  returns = np.zeros((b, n))
  for i in range(b):
    running = 0.0
    for k in reversed(range(n)):
      if traj.turn_mask[i, k]:
        running += traj.reward[i, k]
        returns[i, k] = running
  state_sum, action_sum = collections.defaultdict(list), collections.defaultdict(list)
  keys = {}
  for i in range(b):
    for k in range(n):
      if not traj.turn_mask[i, k]:
        continue
      anchor = 0 if k == 0 else int(traj.obs_hash[i, k - 1])
      action = tuple(traj.tokens[i, traj.turn_start[i, k]:traj.turn_end[i, k]].tolist())
      state, act = (int(traj.group_id[i]), anchor), (int(traj.group_id[i]), anchor, action)
      keys[i, k] = state, act
      state_sum[state].append(returns[i, k])
      action_sum[act].append(returns[i, k])
  decisions = np.zeros((b, n), bool)
  for (i, k), (state, act) in keys.items():
    decisions[i, k] = abs(np.mean(action_sum[act]) - np.mean(state_sum[state])) > threshold
  return decisions, decisions.sum() / max(traj.turn_mask.sum(), 1)


def test_routine_turns_are_not_decisions_and_the_deciding_turn_is():
  # Turn 0's action never changes the return; turn 1's action 20 pays 1 (a DD-Chain in miniature).
  rows = [[Turn(act=(a,), obs_hash=1), Turn(act=(d,), obs_hash=2, reward=float(d == 20))]
          for a in (10, 11) for d in (20, 21)]
  got = density.batch_decision_density(make_batch(rows, max_len=12, max_turns=2), 0.1)
  np.testing.assert_array_equal(np.asarray(got.decisions), [[False, True]] * 4)
  assert float(got.density) == pytest.approx(0.5)


def test_action_order_matters():
  rows = [[Turn(act=(5, 6), reward=1.0)], [Turn(act=(6, 5), reward=0.0)]]
  hashes = np.asarray(density.action_hashes(make_batch(rows, max_len=8, max_turns=1)))
  assert hashes[0, 0] != hashes[1, 0]


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_dictionary_reference(seed):
  traj = random_batch(np.random.default_rng(seed), b=8, max_len=40, max_turns=4)
  want_decisions, want_density = reference(traj, 0.25)
  got = density.batch_decision_density(traj, 0.25)
  np.testing.assert_array_equal(np.asarray(got.decisions), want_decisions)
  assert float(got.density) == pytest.approx(want_density)
