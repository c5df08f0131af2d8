"""Tests for agentrl_jax.credit.gca (docs/methods.md#gca)."""

import functools

import jax
import numpy as np
import pytest

from agentrl_jax.credit import gca

from credit_batches import Turn, make_batch, outcome_advantages

CORRECT = jax.jit(gca.grounded_credit)
SCOPED = {scope: jax.jit(functools.partial(gca.grounded_credit, bypass_scope=scope))
          for scope in gca.BYPASS_SCOPES}


def search_batch(found, correct, group_id=None):
  """Rows: search turn, search turn, answer turn (2 action tokens each)."""
  rows = [[Turn(act=(20, 21)), Turn(act=(20, 22)), Turn(act=(30, 31))] for _ in found]
  traj = make_batch(rows, group_id=group_id)
  search = np.zeros((len(found), 4), bool)
  search[:, :2] = True
  evidence = np.zeros_like(search)
  for i, f in enumerate(found):
    evidence[i, 1] = f  # the second search retrieved the answer
  return traj.replace(
      sub_outcomes={"answer_correct": np.asarray(correct, np.float32)},
      extras={"search_turn": search, "evidence_turn": evidence})


def token_masks(traj):
  search1 = traj.turn_of_token == 1
  answer = traj.turn_of_token == 2
  return search1 & traj.action_mask, answer & traj.action_mask


def test_case_table_by_hand():
  # Rows (found, correct): (1,0) misuse, (0,1) bypass (retrievable: row 0 of the group found),
  # (1,1) grounded, (0,0) nothing found. Advantages −1, +1, +2, −0.5; ε = 0.1.
  traj = search_batch([1, 0, 1, 0], [0, 1, 1, 0])
  a = outcome_advantages(traj, [-1.0, 1.0, 2.0, -0.5])
  out = np.asarray(CORRECT(traj, a))
  ev, answer = token_masks(traj)
  # Row 0: evidence search −1 + 0.1 = −0.9 (less blame); answer −1 − 0.1 = −1.1 (more blame).
  np.testing.assert_allclose(out[0][ev[0]], -0.9, atol=1e-6)
  np.testing.assert_allclose(out[0][answer[0]], -1.1, atol=1e-6)
  # Row 1: answered correctly without the evidence its group found: answer 1 − 0.1 = 0.9.
  np.testing.assert_allclose(out[1][answer[1]], 0.9, atol=1e-6)
  np.testing.assert_allclose(out[1][ev[1]], 1.0, atol=1e-6)
  # Row 2: evidence search 2 + 0.2 = 2.2; answer unchanged.
  np.testing.assert_allclose(out[2][ev[2]], 2.2, atol=1e-6)
  np.testing.assert_allclose(out[2][answer[2]], 2.0, atol=1e-6)
  # Row 3 unchanged; the first (evidence-less) search turn is unchanged everywhere.
  np.testing.assert_allclose(out[3], a[3])
  first = (traj.turn_of_token == 0) & traj.action_mask
  np.testing.assert_allclose(out[first], a[first])


def test_identity_when_nothing_found_and_not_retrievable():
  traj = search_batch([0, 0, 0], [1, 0, 1])
  a = outcome_advantages(traj, [0.3, -1.0, 0.7])
  np.testing.assert_array_equal(CORRECT(traj, a), a)


def test_invariants_on_random_cases():
  rng = np.random.default_rng(0)
  for _ in range(3):
    found, correct = rng.random(8) < 0.5, rng.random(8) < 0.5
    traj = search_batch(found, correct, group_id=np.arange(8) // 4)
    a = (rng.normal(size=traj.tokens.shape) * traj.action_mask).astype(np.float32)
    for scope in gca.BYPASS_SCOPES:
      out = np.asarray(SCOPED[scope](traj, a))
      assert np.all(np.abs(out - a) <= 0.1 * np.abs(a) + 1e-6)     # the 10% cap
      assert np.all(np.sign(out) == np.sign(a))                     # never flips; A = 0 ⇒ 0
      ev, _ = token_masks(traj)
      ev &= found[:, None]
      assert np.all(out[ev] - a[ev] >= 0)                           # never negative on evidence


def test_evidence_found_fallback_and_oracle_retrievable():
  traj = search_batch([0, 0], [1, 1])
  traj = traj.replace(extras={"search_turn": traj.extras["search_turn"]},
                      sub_outcomes={"answer_correct": np.ones(2, np.float32),
                                    "evidence_found": np.array([1, 0], np.float32),
                                    "evidence_retrievable": np.array([0, 0], np.float32)})
  a = outcome_advantages(traj, [1.0, 1.0])
  out = np.asarray(gca.grounded_credit(traj, a, retrievable="oracle"))
  search = (traj.turn_of_token <= 1) & traj.action_mask
  np.testing.assert_allclose(out[0][search[0]], 1.1, atol=1e-6)  # both searches of row 0 credited
  np.testing.assert_allclose(out[1], a[1])  # oracle says not retrievable: no bypass penalty


def test_config_validation_and_missing_keys():
  traj = search_batch([1], [1])
  a = outcome_advantages(traj, [1.0])
  with pytest.raises(ValueError, match=r"epsilon must be in \(0, 0.1\].*got 0.2"):
    gca.grounded_credit(traj, a, epsilon=0.2)
  with pytest.raises(ValueError, match=r"needs traj.sub_outcomes\['answer_correct'\]"):
    gca.grounded_credit(traj.replace(sub_outcomes={}), a)
  with pytest.raises(ValueError, match=r"needs traj.extras\['search_turn'\]"):
    gca.grounded_credit(traj.replace(extras={}), a)


def test_infer_search_turns_from_valid_actions_before_the_answer():
  # Without extras['search_turn']: turns 0 and 1 (valid, before the answer) count as searches;
  # row 0 found evidence and answered correctly → both searches 1 → 1.1, answer unchanged.
  traj = search_batch([1], [1])
  traj = traj.replace(extras={}, sub_outcomes={"answer_correct": np.ones(1, np.float32),
                                               "evidence_found": np.ones(1, np.float32)})
  a = outcome_advantages(traj, [1.0])
  out = np.asarray(gca.grounded_credit(traj, a, infer_search_turns=True))
  search = (traj.turn_of_token <= 1) & traj.action_mask
  np.testing.assert_allclose(out[search], 1.1, atol=1e-6)
  np.testing.assert_allclose(out[~search], a[~search])
