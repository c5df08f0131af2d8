"""The Text-to-SQL sandbox runs reads only: every other statement kind is refused with a message.

SQLite's authorizer alone is not enough: a statement that touches no table or index (a bare
`REINDEX`, `REINDEX NOCASE`, `EXPLAIN REINDEX`) never consults it and used to come back as
"ok: 0 rows". Each statement below must be refused by kind, before it runs.
"""

import hashlib

import pytest

from agentrl_jax.envs import sql

REFUSED = [
    "REINDEX", "REINDEX customers", "REINDEX NOCASE", "reindex binary", "VACUUM",
    "VACUUM INTO '/tmp/agentrl_copy.db'", "ANALYZE", "ANALYZE customers",
    "PRAGMA query_only = OFF", "PRAGMA user_version = 7", "PRAGMA journal_mode = WAL",
    "PRAGMA writable_schema = ON", "PRAGMA optimize", "PRAGMA table_info(customers)",
    "ATTACH ':memory:' AS m", "ATTACH DATABASE '/tmp/agentrl_evil.db' AS evil", "DETACH main",
    "BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT s", "RELEASE s",
    "INSERT INTO customers VALUES (99, 'x', 'y', 2000)", "REPLACE INTO customers VALUES (1, 'x', 'y', 1)",
    "UPDATE customers SET name = 'x'", "DELETE FROM customers", "DROP TABLE customers",
    "CREATE TABLE evil (a)", "CREATE TEMP VIEW v AS SELECT 1", "ALTER TABLE customers RENAME TO c",
    "EXPLAIN REINDEX", "EXPLAIN QUERY PLAN VACUUM", "EXPLAIN DELETE FROM customers",
    "WITH x AS (SELECT 1) DELETE FROM customers",
    "/* hidden */ REINDEX", "-- a comment\nREINDEX", "  \n\tANALYZE",
]
ALLOWED = [
    "SELECT COUNT(*) FROM customers", "select 1", "WITH x AS (SELECT 2) SELECT * FROM x",
    "EXPLAIN SELECT 1", "EXPLAIN QUERY PLAN SELECT * FROM customers", "VALUES (1), (2)",
    "/* a comment */ SELECT 3", "-- a comment\nSELECT 4",
]


@pytest.fixture(scope="module")
def database():
  env = sql.TextToSQL(schemas=("shop",))
  env.reset(0)
  db = sql.ReadOnlyDatabase(env.database_path)
  yield env.database_path, db
  db.close()


def _sha(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("statement", REFUSED)
def test_every_statement_kind_but_reads_is_refused_with_a_message(database, statement):
  path, db = database
  before = _sha(path)
  result = db.execute(statement)
  assert not result.ok, f"{statement!r} ran: {result}"
  assert "not authorized" in result.error, result.error
  assert _sha(path) == before


@pytest.mark.parametrize("statement", ALLOWED)
def test_reads_still_run(database, statement):
  _, db = database
  result = db.execute(statement)
  assert result.ok, result.error


def test_the_refusal_names_the_statement_kind(database):
  _, db = database
  error = db.execute("REINDEX").error
  assert "REINDEX" in error and "SELECT" in error, error


def test_the_env_observation_says_the_statement_was_refused():
  env = sql.TextToSQL(schemas=("shop",))
  env.reset(0)
  observation = env.step("REINDEX").observation
  assert observation.startswith("error: not authorized"), observation
