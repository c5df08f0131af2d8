"""Tests for agentrl_jax.rewards.progress (Progress-SQL, docs/methods.md#progress-sql)."""

import jax
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.rewards import progress

GOLD = "SELECT name, COUNT(*) FROM singer WHERE age > 30 GROUP BY name ORDER BY name DESC LIMIT 5"
SHAPE = jax.jit(progress.progressive_sql_reward)


def batch(scores, exec_ok, correct):
  """One row per trajectory; the env reward is EX of the last turn."""
  b, n = len(scores), max(len(s) for s in scores)
  traj = types.empty_trajectories(b, 4, n)
  sc, ok, co = (np.zeros((b, n), np.float32), np.zeros((b, n), bool), np.zeros((b, n), bool))
  for i in range(b):
    k = len(scores[i])
    traj.turn_mask[i, :k] = True
    sc[i, :k], ok[i, :k], co[i, :k] = scores[i], exec_ok[i], correct[i]
    traj.reward[i, k - 1] = float(correct[i][-1])
  traj.outcome[:] = traj.reward.sum(1)
  return traj.replace(extras={"sql_score": sc, "sql_exec_ok": ok, "sql_correct": co})


def test_gold_scores_one_and_alignment_is_normalised():
  assert progress.alignment_score(GOLD, GOLD) == pytest.approx(1.0)
  assert progress.alignment_score(GOLD.lower().replace(", ", ","), GOLD) == pytest.approx(1.0)
  assert progress.alignment_score("SELECT 1", GOLD) < 0.3


def test_structural_alignment_by_hand():
  # Clauses present in either: select, from, where → F1s 1, 1 and 0 (predicates differ): 2/3.
  assert progress.structural_alignment("SELECT a FROM t WHERE x = 1",
                                       "SELECT a FROM t WHERE x = 2") == pytest.approx(2 / 3)
  # Lexical: tokens {select a from t where x = 1} vs {... = 2}: 7 of 8 shared, F1 = 7/8.
  assert progress.lexical_alignment("SELECT a FROM t WHERE x = 1",
                                    "SELECT a FROM t WHERE x = 2") == pytest.approx(7 / 8)


def test_clause_profile_reads_subqueries_and_joins():
  profile = progress.clause_profile(
      "SELECT a FROM t JOIN u ON t.id = u.id WHERE b IN (SELECT c FROM v)")
  assert profile["from"] == {"t": 1, "u on t.id = u.id": 1}
  assert profile["sub:select"] == {"c": 1} and profile["where"] == {"b in subquery": 1}


def test_hand_checked_total():
  # q0 fails to run (score 0.2), q1 runs, q2 correct (score 1.0), K + 1 = 3 turns:
  # R_prog = 1.0 − 0.2 = 0.8; R_lat = 1 − 2/3; R_exec = +1 (recovered);
  # R = 1 + 0.5·0.8 + 0.25·(1/3) + 0.25·1 = 1.7333…
  traj = batch([[0.2, 0.6, 1.0]], [[False, True, True]], [[False, False, True]])
  shaped = SHAPE(traj)
  np.testing.assert_allclose(shaped.outcome, [1 + 0.4 + 0.25 / 3 + 0.25], atol=1e-6)
  np.testing.assert_allclose(shaped.reward[0, :2], [0.0, 0.0])


def test_unchanged_query_has_zero_progress_and_early_beats_late():
  bonuses = progress.progress_bonuses(
      np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.3, 0.6, 1.0]], np.float32),
      np.ones((3, 3), bool), np.array([[0, 0, 0], [1, 1, 1], [0, 0, 1]], bool),
      np.ones((3, 3), bool))
  assert bonuses.progress[0] == 0.0 and bonuses.progress[1] == 0.0
  assert bonuses.latency[1] > bonuses.latency[2] > 0 == bonuses.latency[0]
  np.testing.assert_allclose(bonuses.execution, [0, 0, 0])


def test_execution_status_cases():
  # ok→ok: 0, fail→ok: +1, ok→fail: −1, fail→fail: −1.
  ok = np.array([[1, 1], [0, 1], [1, 0], [0, 0]], bool)
  bonuses = progress.progress_bonuses(np.zeros((4, 2), np.float32), ok, np.zeros((4, 2), bool),
                                      np.ones((4, 2), bool))
  np.testing.assert_array_equal(bonuses.execution, [0, 1, -1, -1])


def test_total_is_bounded():
  rng = np.random.default_rng(0)
  b, n = 32, 4
  lengths = rng.integers(1, n + 1, b)
  traj = batch([list(rng.random(k)) for k in lengths],
               [list(rng.random(k) < 0.5) for k in lengths],
               [list(rng.random(k) < 0.3) for k in lengths])
  total = np.asarray(SHAPE(traj).outcome)
  assert np.all(total >= -0.5 - 0.25 - 1e-6) and np.all(total <= 1 + 0.5 + 0.25 + 0.25 + 1e-6)


def test_missing_key_is_named():
  traj = batch([[0.1]], [[True]], [[False]])
  traj = traj.replace(extras={k: v for k, v in traj.extras.items() if k != "sql_exec_ok"})
  with pytest.raises(ValueError, match=r"needs traj.extras\['sql_exec_ok'\]"):
    progress.progressive_sql_reward(traj)
