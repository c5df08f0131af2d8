"""Tests of the multi-turn Text-to-SQL env and its read-only executor."""

import collections
import hashlib
import sqlite3
import time

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs import sql


def _run(env, seed, policy):
  env.reset(seed)
  results = []
  while not results or not results[-1].done:
    results.append(env.step(policy(env)))
  return results


def _sha(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_registered_and_builds_by_name():
  assert isinstance(registry.make("sql", max_turns=3), sql.TextToSQL)


def test_expert_succeeds_on_100_seeds_and_covers_schemas_and_tiers():
  env = sql.TextToSQL()
  wins, seen = 0, collections.Counter()
  for seed in range(100):
    results = _run(env, seed, lambda e: e.expert_action())
    wins += results[-1].info["success"]
    seen[(env.task["schema"], env.task["tier"])] += 1
    assert len(results) == 2  # One exploratory query, then the submission.
  assert wins >= 95
  assert len(seen) == 9  # 3 schemas x 3 tiers all drawn.


def test_random_policy_success():
  # A random policy: a random table dump or a garbage string, submitted on a random turn.
  # Measured: 0.005 over seeds 0..199 (docs/envs_table_a.md).
  rng = np.random.default_rng(0)

  def policy(env):
    tables = list(sql.SCHEMAS[env.task["schema"]].tables)
    query = [f"SELECT * FROM {tables[rng.integers(3)]}", "SELECT 1", "SELEC name FRM x"][
        rng.integers(3)]
    return f"ANSWER: {query}" if rng.random() < 0.4 else query

  env = sql.TextToSQL()
  wins = sum(_run(env, seed, policy)[-1].info["success"] for seed in range(100))
  assert wins <= 10


def test_same_seed_same_episode():
  actions = ["SELECT * FROM customers", "bad sql", "", "ANSWER: SELECT 1"]
  a, b = sql.TextToSQL(), sql.TextToSQL()
  assert [a.reset(4)] + [a.step(x) for x in actions] == [b.reset(4)] + [b.step(x) for x in actions]
  assert a.task == sql.make_task(4)
  assert len({sql.make_task(s)["question"] for s in range(40)}) > 20


def test_execution_match_rules():
  ok = lambda *rows: sql.ExecResult(ok=True, columns=("a",), rows=tuple(rows))
  # Multiset equality without ORDER BY: order free, multiplicity counts, 2 == 2.0.
  assert sql.results_match(ok((1,), (2,)), ok((2.0,), (1,)), ordered=False)
  assert not sql.results_match(ok((1,), (1,)), ok((1,),), ordered=False)
  assert not sql.results_match(ok((1,), (2,)), ok((2,), (1,)), ordered=True)
  assert not sql.results_match(sql.ExecResult(ok=False, error="x"), ok(), ordered=False)
  assert sql.has_order_by("SELECT a FROM t ORDER BY a")
  assert not sql.has_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a)")
  assert not sql.has_order_by("SELECT 'order by' FROM t")


def test_submitting_an_equivalent_query_succeeds_and_a_wrong_one_fails():
  env = sql.TextToSQL()
  for seed in range(30):
    env.reset(seed)
    if env.task["gold_sql"].startswith("SELECT name FROM customers WHERE city"):
      city = env.task["gold_sql"].split("'")[1]
      # Same rows in another order and with an alias: still a match.
      good = f"ANSWER: SELECT c.name AS n FROM customers c WHERE c.city = '{city}' ORDER BY 1 DESC"
      result = env.step(good)
      assert result.done and result.reward == 1.0 and result.info["success"]
      env.reset(seed)
      result = env.step("ANSWER: SELECT name FROM customers")
      assert result.done and result.reward == 0.0
      assert result.info["sub_outcomes"] == {"executable": 1.0, "result_match": 0.0}
      return
  pytest.fail("no customers-by-city question in seeds 0..29")


def test_query_result_and_error_observations():
  env = sql.TextToSQL(schemas=("shop",))
  env.reset(0)
  result = env.step("SELECT COUNT(*) FROM customers")
  assert result.observation == "ok: 1 row; columns: COUNT(*)\n12"
  # sql_score: a valid but unrelated query scores in (0, 1); the exact value is tested with
  # sql_diagnostics below.
  score = result.info.pop("sql_score")
  assert 0.0 < score < 1.0
  assert result.info == {"action_valid": True, "submitted": False, "sql_exec_ok": True,
                         "sql_correct": False}
  result = env.step("SELEC * FRM customers")
  assert result.observation.startswith("error: near \"SELEC\": syntax error")
  assert not result.info["action_valid"] and not result.done
  result = env.step("SELECT * FROM orders")
  assert "... 25 more" in result.observation  # 30 orders, 5 shown.


@pytest.mark.parametrize("action, expected", [
    ("", "empty action"), ("   \n", "empty action"), (None, "invalid action of type NoneType"),
    (12, "invalid action of type int"), ("x" * 5000, "action too long (5000 characters"),
    ("ANSWER:", "empty query after 'ANSWER:'"), ("DROP TABLE orders", "error: not authorized"),
])
def test_malformed_actions_get_a_clear_observation(action, expected):
  env = sql.TextToSQL(schemas=("shop",))
  env.reset(1)
  result = env.step(action)
  assert result.observation.startswith(expected)
  assert not result.done and not result.info["action_valid"] and result.reward == 0.0
  assert len(result.observation) < 200


def test_step_cap_without_submission_fails():
  env = sql.TextToSQL(max_turns=2)
  env.reset(0)
  env.step("SELECT 1")
  result = env.step("SELECT 2")
  assert result.done and not result.info["success"]
  assert "out of turns" in result.observation
  assert result.info["sub_outcomes"] == {"executable": 0.0, "result_match": 0.0}


HOSTILE = [
    "DROP TABLE customers", "DELETE FROM customers", "UPDATE customers SET name = 'x'",
    "INSERT INTO customers VALUES (99, 'x', 'y', 2000)", "CREATE TABLE evil (a)",
    "CREATE VIEW v AS SELECT 1", "CREATE INDEX i ON customers(name)",
    "CREATE TRIGGER t AFTER INSERT ON orders BEGIN DELETE FROM orders; END",
    "ALTER TABLE customers ADD COLUMN z", "ALTER TABLE customers RENAME TO c2",
    "ATTACH DATABASE '/tmp/evil.db' AS evil", "ATTACH ':memory:' AS m", "DETACH DATABASE main",
    "PRAGMA query_only = OFF", "PRAGMA journal_mode = DELETE", "PRAGMA user_version = 7",
    "PRAGMA writable_schema = ON", "PRAGMA foreign_keys = ON", "PRAGMA page_size = 1024",
    "PRAGMA table_info(customers)", "VACUUM", "VACUUM INTO '/tmp/copy.db'", "REINDEX",
    "ANALYZE", "BEGIN", "BEGIN EXCLUSIVE", "COMMIT", "ROLLBACK", "SAVEPOINT s", "RELEASE s",
    "SELECT load_extension('/tmp/evil.so')", "SELECT load_extension('libc.so.6')",
    "SELECT 1; DROP TABLE customers", "SELECT 1; DELETE FROM orders;",
    "DROP TABLE customers; SELECT 1",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r "
    "ORDER BY n DESC LIMIT 1",
    "SELECT COUNT(*) FROM orders a, orders b, orders c, orders d, orders e, orders f",
    "SELECT zeroblob(2000000000)", "SELECT randomblob(1000000000)",
    "SELECT printf('%.*c', 2000000000, 'x')", "REPLACE INTO customers VALUES (1, 'x', 'y', 1)",
    "INSERT OR IGNORE INTO orders SELECT * FROM orders",
    "WITH x AS (SELECT 1) DELETE FROM customers",
    "UPDATE products SET price = 0 WHERE 1", "DELETE FROM sqlite_master",
    "CREATE TEMP TABLE t AS SELECT * FROM customers",
    "SELECT writefile('/tmp/x', 'y')", "SELECT * FROM pragma_table_info('customers')",
    "DROP TABLE IF EXISTS orders",
]


def test_fifty_hostile_queries_leave_the_database_byte_identical_each_within_a_second():
  assert len(HOSTILE) == 50
  env = sql.TextToSQL(schemas=("shop",))
  env.reset(0)
  before = _sha(env.database_path)
  for query in HOSTILE:
    for action in (query, f"ANSWER: {query}"):
      if env.done:
        env.reset(0)
      start = time.monotonic()
      result = env.step(action)
      assert time.monotonic() - start < 1.0, query
      assert isinstance(result.observation, str)
  assert _sha(env.database_path) == before
  # The rows are all still there, read by an independent connection.
  conn = sqlite3.connect(env.database_path)
  assert conn.execute("SELECT COUNT(*) FROM customers").fetchone() == (12,)
  assert conn.execute("SELECT COUNT(*) FROM orders").fetchone() == (30,)
  conn.close()


def test_runaway_query_is_stopped_by_the_time_limit():
  env = sql.TextToSQL(time_limit_ms=100)
  env.reset(0)
  start = time.monotonic()
  result = env.step(
      "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r")
  assert time.monotonic() - start < 0.5
  assert result.observation.startswith("error: time limit exceeded")


def test_writes_are_denied_even_without_the_env():
  env = sql.TextToSQL()
  env.reset(0)
  db = sql.ReadOnlyDatabase(env.database_path)
  for query in ("DELETE FROM customers", "PRAGMA query_only = OFF", "ATTACH ':memory:' AS m"):
    result = db.execute(query)
    assert not result.ok and "not authorized" in result.error
  db.close()


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="schemas"):
    sql.TextToSQL(schemas=("zoo",))
  with pytest.raises(ValueError, match="tiers"):
    sql.TextToSQL(tiers=("extreme",))


# sql_diagnostics (Progress-SQL clause-level comparison, docs/methods.md#progress-sql).

GOLD = ("SELECT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
        "GROUP BY c.customer_id HAVING COUNT(*) >= 3")


def test_equivalent_spellings_align_fully():
  from agentrl_jax.envs import sql_diagnostics as diag
  # Other aliases / qualifiers / join side order / keyword case: same profile.
  same = ("select customers.name from orders join customers on orders.customer_id = "
          "customers.customer_id group by customers.customer_id having count(*) >= 5")
  assert diag.clause_profile(same) == diag.clause_profile(GOLD)
  assert diag.structural_alignment(same, GOLD) == 1.0
  assert diag.first_mismatch(GOLD, GOLD) is None
  assert diag.score(GOLD, GOLD) == 1.0


def test_partial_structure_scores_by_clause_f1():
  from agentrl_jax.envs import sql_diagnostics as diag
  pred = "SELECT name FROM customers"
  per_clause = diag.clause_f1(pred, GOLD)
  # Clauses in either query: select, from, join, group_by, having (5).
  # select {name} vs {name}: 1; from {customers} vs {customers, orders}: P=1, R=1/2 -> F1 2/3;
  # join, group_by, having: missing -> 0.  Mean = (1 + 2/3) / 5 = 1/3.
  assert per_clause == pytest.approx({"select": 1.0, "from": 2 / 3, "join": 0.0,
                                      "group_by": 0.0, "having": 0.0})
  assert diag.structural_alignment(pred, GOLD) == pytest.approx(1 / 3)
  assert diag.first_mismatch(pred, GOLD) == "FROM differs: missing orders"


def test_lexical_alignment_is_token_multiset_f1():
  from agentrl_jax.envs import sql_diagnostics as diag
  # Tokens: pred [select, name, from, customers] (4); gold [select, name, from, customers,
  # where, city, =, 'Oslo'] (8); common 4 -> P = 1, R = 1/2, F1 = 2/3.
  gold = "SELECT name FROM customers WHERE city = 'Oslo'"
  assert diag.lexical_alignment("select NAME from customers", gold) == pytest.approx(2 / 3)
  assert diag.score("select NAME from customers", gold, alpha=0.0) == pytest.approx(2 / 3)


def test_garbage_and_nested_queries():
  from agentrl_jax.envs import sql_diagnostics as diag
  for garbage in ("SELEC * FRM t", "", "hello world", "DROP TABLE x"):
    assert diag.clause_profile(garbage) == {}
    assert diag.structural_alignment(garbage, GOLD) == 0.0
    assert diag.first_mismatch(garbage, GOLD) == "the query does not parse as a SELECT"
  nested = diag.clause_profile(
      "SELECT name FROM products WHERE product_id NOT IN (SELECT product_id FROM orders)")
  assert nested["where"] == {"not product_id in subquery": 1}
  assert nested["subquery"] == {"select:product_id": 1, "from:orders": 1}
  order = diag.clause_profile("SELECT name AS n FROM products ORDER BY n DESC LIMIT 3")
  assert order["order_by"] == {"name desc": 1} and order["limit"] == {"3": 1}
  with pytest.raises(ValueError, match="alpha"):
    diag.score(GOLD, GOLD, alpha=2.0)


@pytest.fixture(scope="module")
def shop_env():
  env = sql.TextToSQL(schemas=("shop",), max_turns=50)
  env.reset(0)
  return env, _sha(env.database_path)


_ANY_ACTION = st.one_of(st.text(max_size=300), st.text(max_size=60).map("ANSWER: {}".format),
                        st.sampled_from(HOSTILE))


@hypothesis.settings(max_examples=60, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(action=_ANY_ACTION)
def test_arbitrary_text_never_raises_and_never_writes(shop_env, action):
  env, sha = shop_env
  if env.done:
    env.reset(0)
  result = env.step(action)
  assert isinstance(result.observation, str) and result.reward in (0.0, 1.0)
  assert _sha(env.database_path) == sha


def test_per_turn_progress_signals():
  from agentrl_jax.envs import sql_diagnostics as diag
  env = sql.TextToSQL()
  env.reset(2)
  broken = env.step("SELEC nothing")
  assert broken.info["sql_exec_ok"] is False and broken.info["sql_correct"] is False
  assert broken.info["sql_score"] == pytest.approx(diag.score("SELEC nothing", env.gold_sql))
  gold = env.step(env.gold_sql)  # Not submitted: a refinement turn that happens to be right.
  assert gold.info["sql_correct"] and gold.info["sql_score"] == 1.0 and not gold.done
  empty = env.step("")
  assert empty.info["sql_score"] == 0.0
  final = env.step(f"ANSWER: {env.gold_sql}")
  assert final.info["sql_correct"] and final.info["submitted"] and final.info["success"]
  plain = sql.TextToSQL(score_queries=False)
  plain.reset(2)
  assert "sql_score" not in plain.step("SELECT 1").info
