"""Multi-turn Text-to-SQL over small SQLite databases generated from the seed.

An episode is one question about one database. The agent writes SQL; every turn it sees the
statement's result (first rows) or the SQLite error, so it can refine. It submits with an action
that starts with `ANSWER:` followed by the final query, e.g.

    ANSWER: SELECT name FROM customers WHERE city = 'Oslo'

The episode then ends with reward 1 when the submitted query's result equals the gold query's
result (as multisets of rows; as ordered lists when the gold query has an ORDER BY; column names
do not matter; floats compared to 6 decimals), else 0. Reaching the step cap without submitting
ends the episode with reward 0.

Databases: three schemas (`shop`, `school`, `flights`), three tables each, rows drawn from the
seed. Questions come from templates in three Spider-style tiers: easy (one table, a filter), medium
(aggregation, GROUP BY, ORDER BY/LIMIT), hard (joins with GROUP BY/HAVING, nested NOT IN).

Safety: the database is written to a private temporary file per episode and the agent's SQL runs
on a connection that (1) opens it with the URI `mode=ro`, (2) sets `PRAGMA query_only=ON`, (3)
refuses every statement whose kind is not SELECT, WITH, VALUES or EXPLAIN of one of those (the
authorizer is never consulted by a statement that names no table, e.g. a bare `REINDEX`), (4)
has an authorizer that allows only reads, SELECT, recursive CTEs and non-extension functions (so
every write, ATTACH/DETACH, PRAGMA, transaction or schema change is denied before it runs), (5)
aborts any statement after `time_limit_ms` through a progress handler, (6) caps string/blob sizes and
fetches at most `max_rows` rows. Python's sqlite3 executes one statement per call, so a
stacked `SELECT 1; DROP TABLE t` is an error, not two statements.

`info` per step: `action_valid` (the statement executed without error; a submission counts as
valid when it is non-empty), `submitted`, and the per-turn signals of Progress-SQL, named
as `rewards/progress.py` reads them from `extras`: `sql_exec_ok` (the statement ran),
`sql_correct` (its result matches the gold result) and, with `score_queries`, `sql_score`
(`sql_diagnostics.score` against the gold query, 0 for a turn without a statement). Last step:
`success` and `sub_outcomes = {"executable": submitted query ran, "result_match": it matched the
gold}`. The env also keeps `queries` (every statement with its exec status) and `gold_sql`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import re
import shutil
import sqlite3
import tempfile
import time
import weakref
from typing import Any, Callable

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

SUBMIT_PREFIX = "ANSWER:"
TIERS = ("easy", "medium", "hard")
_MAX_ERROR_CHARS = 120
_MAX_CELL_CHARS = 30
_SHOWN_ROWS = 5
_MAX_EMPTY_REDRAWS = 30

# ---------------------------------------------------------------------------------------------
# Safe execution.

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
# SQL functions that reach outside the database, and printf/format: one printf call with a 2e9
# padding width runs for seconds inside a single VM step, where the progress handler cannot stop
# it (the length limit only rejects the result at the end). Text-to-SQL answers never need them.
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer",
                               "printf", "format"})


# Statement kinds that only read. VALUES is part of SQLite's SELECT grammar; EXPLAIN must be
# followed by one of the others (`EXPLAIN REINDEX` also never reaches the authorizer).
_READ_KINDS = frozenset({"SELECT", "WITH", "VALUES"})
# Every other keyword SQLite's grammar lets a statement start with (sqlite.org/lang.html). A
# first word outside both sets is not SQL, and SQLite's own syntax error says more about a typo
# ("SELEC") than a refusal would.
_OTHER_KINDS = frozenset({
    "ALTER", "ANALYZE", "ATTACH", "BEGIN", "COMMIT", "CREATE", "DELETE", "DETACH", "DROP", "END",
    "INSERT", "PRAGMA", "REINDEX", "RELEASE", "REPLACE", "ROLLBACK", "SAVEPOINT", "UPDATE",
    "VACUUM"})
_EXPLAIN = re.compile(r"EXPLAIN(\s+QUERY\s+PLAN)?\b", re.IGNORECASE)
# Whitespace and comments SQLite skips before a statement's first keyword.
_LEADING_NOISE = re.compile(r"(\s+|--[^\n]*(\n|$)|/\*.*?(\*/|$))*", re.DOTALL)
_KEYWORD = re.compile(r"[A-Za-z_]+")


def statement_refusal(sql: str) -> str | None:
  """Why `sql` may not run (it is a statement of a kind that is not a read), else None.

  Args:
    sql: one statement, as the agent wrote it.

  Returns:
    An error message starting "not authorized" for every statement kind of SQLite's grammar but
    SELECT, WITH, VALUES and EXPLAIN of one of those; None otherwise (text that is not SQL is left
    to SQLite, which rejects it as a syntax error).
  """
  rest = sql[_LEADING_NOISE.match(sql).end():]
  explain = _EXPLAIN.match(rest)
  if explain:
    rest = rest[explain.end():]
    rest = rest[_LEADING_NOISE.match(rest).end():]
  keyword = _KEYWORD.match(rest)
  kind = keyword.group(0).upper() if keyword else ""
  if kind not in _OTHER_KINDS:
    return None
  shown = f"EXPLAIN {kind}" if explain else kind
  return f"not authorized: {shown} (only SELECT, WITH, VALUES, EXPLAIN run)"


def _authorize(action: int, arg1: Any, arg2: Any, db_name: Any, trigger: Any) -> int:
  """sqlite3 authorizer: reads and pure functions only; everything else is denied at prepare."""
  del arg1, db_name, trigger
  if action in _ALLOWED_ACTIONS:
    return sqlite3.SQLITE_OK
  if action == sqlite3.SQLITE_FUNCTION:
    name = str(arg2 or "").lower()
    return sqlite3.SQLITE_DENY if name in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
  return sqlite3.SQLITE_DENY


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecResult:
  """The outcome of one statement.

  Attributes:
    ok: it ran to completion without error.
    columns: result column names.
    rows: result rows (at most `max_rows`).
    truncated: there were more rows than `max_rows`.
    error: the error message when not `ok`.
  """

  ok: bool
  columns: tuple[str, ...] = ()
  rows: tuple[tuple[Any, ...], ...] = ()
  truncated: bool = False
  error: str = ""


class ReadOnlyDatabase:
  """A read-only, time-limited connection to an SQLite file; it can never change the file."""

  def __init__(self, path: str | os.PathLike[str], *, time_limit_ms: int = 200,
               max_rows: int = 1000):
    """Opens `path` read-only.

    Args:
      path: an existing SQLite file.
      time_limit_ms: a statement (including fetching) is aborted after this long.
      max_rows: rows fetched per statement at most.
    """
    if not base.is_int(time_limit_ms) or time_limit_ms < 1:
      raise ValueError(f"time_limit_ms must be a positive int, got {time_limit_ms!r}")
    if not base.is_int(max_rows) or max_rows < 1:
      raise ValueError(f"max_rows must be a positive int, got {max_rows!r}")
    path = pathlib.Path(path).resolve()
    if not path.is_file():
      raise ValueError(f"no database file at {str(path)!r}")
    self.time_limit_s = time_limit_ms / 1000.0
    self.max_rows = max_rows
    self._deadline = 0.0
    self._conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None,
                                 check_same_thread=False)
    self._conn.execute("PRAGMA query_only=ON")
    # Bounds the memory one statement can claim (zeroblob(1e9), huge printf padding).
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100_000)
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 100_000)
    # LIKE/GLOB matching is one function call too; short patterns keep it fast on long strings.
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 200)
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    self._conn.set_authorizer(_authorize)
    self._conn.set_progress_handler(self._over_time, 1000)

  def _over_time(self) -> int:
    return 1 if time.monotonic() > self._deadline else 0

  def execute(self, sql: str) -> ExecResult:
    """Runs one statement; any failure (syntax, denial, timeout, ...) comes back as an error."""
    refusal = statement_refusal(sql) if isinstance(sql, str) else None
    if refusal:
      return ExecResult(ok=False, error=refusal)
    self._deadline = time.monotonic() + self.time_limit_s
    try:
      cursor = self._conn.execute(sql)
      rows = cursor.fetchmany(self.max_rows + 1)
      columns = tuple(d[0] for d in cursor.description or ())
      cursor.close()
    except sqlite3.Error as e:
      message = "time limit exceeded" if str(e) == "interrupted" else str(e)
      return ExecResult(ok=False, error=message)
    except Exception as e:  # pylint: disable=broad-except
      # Warnings ("one statement at a time"), encoding and value errors: all are agent mistakes.
      return ExecResult(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
      self._deadline = 0.0
    truncated = len(rows) > self.max_rows
    return ExecResult(ok=True, columns=columns, rows=tuple(rows[:self.max_rows]),
                      truncated=truncated)

  def close(self) -> None:
    self._conn.close()


def results_match(predicted: ExecResult, gold: ExecResult, ordered: bool) -> bool:
  """Execution match: same rows (multiset, or list when `ordered`); column names ignored."""
  if not (predicted.ok and gold.ok):
    return False
  pred = [_canonical_row(r) for r in predicted.rows]
  want = [_canonical_row(r) for r in gold.rows]
  if ordered:
    return pred == want
  return collections.Counter(pred) == collections.Counter(want)


def _canonical_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
  # 2 and 2.0 compare equal in Python but hash apart in some containers; round floats so AVG over
  # the same rows in a different order still matches.
  return tuple(round(float(v), 6) if isinstance(v, (int, float)) and not isinstance(v, bool)
               else v for v in row)


def has_order_by(sql: str) -> bool:
  """Whether the outermost query orders its rows (an ORDER BY outside every parenthesis)."""
  depth = 0
  text = re.sub(r"'(?:[^']|'')*'", "''", sql.lower())
  for i, ch in enumerate(text):
    if ch == "(":
      depth += 1
    elif ch == ")":
      depth -= 1
    elif depth == 0 and text.startswith("order by", i):
      return True
  return False


# ---------------------------------------------------------------------------------------------
# Schemas, rows and question templates.

_FIRST = ("Ada", "Bruno", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena",
          "Milo", "Nia", "Omar", "Pia", "Quin", "Rosa", "Sven", "Tara", "Uma", "Vic", "Wes", "Yara")
_CITIES = ("Oslo", "Lima", "Pune", "Kyiv", "Nice", "Cork", "Bern", "Riga")
_COUNTRIES = {"Oslo": "Norway", "Lima": "Peru", "Pune": "India", "Kyiv": "Ukraine",
              "Nice": "France", "Cork": "Ireland", "Bern": "Switzerland", "Riga": "Latvia"}
_CATEGORIES = ("books", "games", "tools", "toys")
_PRODUCTS = ("lamp", "kettle", "puzzle", "drill", "novel", "atlas", "chess", "kite", "hammer",
             "robot", "saw", "comic")
_DEPARTMENTS = ("math", "art", "physics", "history")
_COURSES = ("algebra", "painting", "optics", "ancient rome", "geometry", "sculpture", "mechanics",
            "modern europe", "statistics", "drawing")
_AIRLINES = ("Northwind", "Skyline", "Aurora Air", "Bluejet", "Condor Wings")
_AIRPORTS = {"OSL": "Oslo", "LIM": "Lima", "PNQ": "Pune", "KBP": "Kyiv", "NCE": "Nice",
             "ORK": "Cork", "BRN": "Bern", "RIX": "Riga"}

Rows = dict[str, list[tuple[Any, ...]]]


@dataclasses.dataclass(frozen=True)
class Schema:
  """One database schema: DDL per table, a row generator and question templates."""

  name: str
  tables: dict[str, tuple[str, ...]]  # table -> column names (first is the primary key)
  make_rows: Callable[[np.random.Generator], Rows]
  templates: tuple["Template", ...]

  def describe(self) -> str:
    return "\n".join(f"{t}({', '.join(cols)})" for t, cols in self.tables.items())


def _pick(rng: np.random.Generator, values) -> Any:
  values = list(values)
  return values[int(rng.integers(len(values)))]


def _shop_rows(rng: np.random.Generator) -> Rows:
  names = rng.choice(len(_FIRST), size=12, replace=False)
  customers = [(i + 1, _FIRST[n], _pick(rng, _CITIES[:5]), int(rng.integers(2015, 2025)))
               for i, n in enumerate(names)]
  # Distinct prices, so "most expensive" has no ties.
  prices = rng.choice(np.arange(5, 200), size=len(_PRODUCTS), replace=False)
  products = [(i + 1, name, _pick(rng, _CATEGORIES), float(prices[i]) + 0.99)
              for i, name in enumerate(_PRODUCTS)]
  orders = [(i + 1, int(rng.integers(1, 13)), int(rng.integers(1, len(_PRODUCTS) - 1)),
             int(rng.integers(1, 6)), int(rng.integers(2019, 2025))) for i in range(30)]
  return {"customers": customers, "products": products, "orders": orders}


def _school_rows(rng: np.random.Generator) -> Rows:
  names = rng.choice(len(_FIRST), size=14, replace=False)
  students = [(i + 1, _FIRST[n], int(rng.integers(9, 13)), _pick(rng, _CITIES))
              for i, n in enumerate(names)]
  courses = [(i + 1, title, _DEPARTMENTS[i % 4], int(rng.integers(1, 6)))
             for i, title in enumerate(_COURSES)]
  pairs = set()
  while len(pairs) < 30:
    pairs.add((int(rng.integers(1, 13)), int(rng.integers(1, len(_COURSES) + 1))))
  enrollments = [(s, c, int(rng.integers(40, 101))) for s, c in sorted(pairs)]
  return {"students": students, "courses": courses, "enrollments": enrollments}


def _flights_rows(rng: np.random.Generator) -> Rows:
  airports = [(code, city, _COUNTRIES[city]) for code, city in _AIRPORTS.items()]
  airlines = [(i + 1, name, _pick(rng, _COUNTRIES.values())) for i, name in enumerate(_AIRLINES)]
  codes = list(_AIRPORTS)
  distances = rng.choice(np.arange(300, 9000), size=24, replace=False)
  flights = []
  for i in range(24):
    origin, dest = rng.choice(codes[:6], size=2, replace=False)
    flights.append((100 + i, int(rng.integers(1, len(_AIRLINES) + 1)), str(origin), str(dest),
                    int(distances[i])))
  return {"airports": airports, "airlines": airlines, "flights": flights}


def _col(rows: Rows, table: str, index: int) -> list[Any]:
  return sorted({r[index] for r in rows[table]})


@dataclasses.dataclass(frozen=True)
class Template:
  """A question template.

  Attributes:
    tier: "easy", "medium" or "hard".
    question: the question, with `{name}` slots.
    sql: the gold SQL, with the same slots.
    params: draws the slot values from the seeded Generator and the database rows.
  """

  tier: str
  question: str
  sql: str
  params: Callable[[np.random.Generator, Rows], dict[str, Any]] = lambda rng, rows: {}

  def draw(self, rng: np.random.Generator, rows: Rows) -> tuple[str, str]:
    values = self.params(rng, rows)
    return self.question.format(**values), self.sql.format(**values)


def _int(name: str, low: int, high: int, scale: int = 1):
  return lambda rng, rows: {name: int(rng.integers(low, high)) * scale}


def _value(name: str, table: str, column: int):
  return lambda rng, rows: {name: _pick(rng, _col(rows, table, column))}


def _choice(name: str, values):
  return lambda rng, rows: {name: _pick(rng, values)}


_SHOP_TEMPLATES = (
    Template("easy", "List the names of the customers who live in {city}.",
             "SELECT name FROM customers WHERE city = '{city}'", _value("city", "customers", 2)),
    Template("easy", "How many products cost more than {p}?",
             "SELECT COUNT(*) FROM products WHERE price > {p}", _int("p", 20, 180)),
    Template("medium", "How many products are in each category? Give the category and the count.",
             "SELECT category, COUNT(*) FROM products GROUP BY category"),
    Template("medium", "What are the names of the {k} most expensive products, most expensive "
             "first?", "SELECT name FROM products ORDER BY price DESC LIMIT {k}", _int("k", 2, 5)),
    Template("hard", "List the names of the customers who placed at least {n} orders.",
             "SELECT c.name FROM customers AS c JOIN orders AS o ON c.customer_id = o.customer_id "
             "GROUP BY c.customer_id HAVING COUNT(*) >= {n}", _int("n", 3, 5)),
    Template("hard", "Which products were never ordered? Give their names.",
             "SELECT name FROM products WHERE product_id NOT IN (SELECT product_id FROM orders)"),
    Template("hard", "What is the total quantity ordered by customers from {city}?",
             "SELECT SUM(o.quantity) FROM orders AS o JOIN customers AS c "
             "ON o.customer_id = c.customer_id WHERE c.city = '{city}'",
             _value("city", "customers", 2)),
)

_SCHOOL_TEMPLATES = (
    Template("easy", "List the titles of the courses in the {d} department.",
             "SELECT title FROM courses WHERE department = '{d}'", _choice("d", _DEPARTMENTS)),
    Template("easy", "How many students are in grade {g}?",
             "SELECT COUNT(*) FROM students WHERE grade_level = {g}", _int("g", 9, 13)),
    Template("medium", "What is the average score in each course? Give the course id and the "
             "average.", "SELECT course_id, AVG(score) FROM enrollments GROUP BY course_id"),
    Template("medium", "List the titles of the courses worth more than {c} credits, in "
             "alphabetical order.", "SELECT title FROM courses WHERE credits > {c} ORDER BY title",
             _int("c", 1, 4)),
    Template("hard", "List the names of the students enrolled in a {d} course.",
             "SELECT DISTINCT s.name FROM students AS s JOIN enrollments AS e "
             "ON s.student_id = e.student_id JOIN courses AS c ON e.course_id = c.course_id "
             "WHERE c.department = '{d}'", _choice("d", _DEPARTMENTS)),
    Template("hard", "Which students have an average score above {x}? Give their names.",
             "SELECT s.name FROM students AS s JOIN enrollments AS e "
             "ON s.student_id = e.student_id GROUP BY s.student_id HAVING AVG(e.score) > {x}",
             _int("x", 6, 9, scale=10)),
    Template("hard", "Which students are not enrolled in any course? Give their names.",
             "SELECT name FROM students WHERE student_id NOT IN "
             "(SELECT student_id FROM enrollments)"),
)

_FLIGHTS_TEMPLATES = (
    Template("easy", "List the codes of the airports in {c}.",
             "SELECT code FROM airports WHERE country = '{c}'",
             _choice("c", tuple(_COUNTRIES.values()))),
    Template("easy", "How many flights are longer than {d} km?",
             "SELECT COUNT(*) FROM flights WHERE distance > {d}", _int("d", 20, 80, scale=100)),
    Template("medium", "How many flights depart from each airport? Give the origin code and the "
             "count.", "SELECT origin, COUNT(*) FROM flights GROUP BY origin"),
    Template("medium", "What are the ids of the {k} longest flights, longest first?",
             "SELECT flight_id FROM flights ORDER BY distance DESC LIMIT {k}", _int("k", 2, 5)),
    Template("hard", "Which airlines operate more than {n} flights? Give their names.",
             "SELECT a.name FROM airlines AS a JOIN flights AS f ON a.airline_id = f.airline_id "
             "GROUP BY a.airline_id HAVING COUNT(*) > {n}", _int("n", 4, 6)),
    # Flights only use the first six airports (see _flights_rows), so every city gets arrivals.
    Template("hard", "List the ids of the flights that land in {c}.",
             "SELECT f.flight_id FROM flights AS f JOIN airports AS a ON f.destination = a.code "
             "WHERE a.city = '{c}'", _choice("c", tuple(_AIRPORTS.values())[:6])),
    Template("hard", "Which airports have no departing flights? Give their codes.",
             "SELECT code FROM airports WHERE code NOT IN (SELECT origin FROM flights)"),
)

SCHEMAS = {
    "shop": Schema("shop", {
        "customers": ("customer_id", "name", "city", "joined_year"),
        "products": ("product_id", "name", "category", "price"),
        "orders": ("order_id", "customer_id", "product_id", "quantity", "order_year"),
    }, _shop_rows, _SHOP_TEMPLATES),
    "school": Schema("school", {
        "students": ("student_id", "name", "grade_level", "city"),
        "courses": ("course_id", "title", "department", "credits"),
        "enrollments": ("student_id", "course_id", "score"),
    }, _school_rows, _SCHOOL_TEMPLATES),
    "flights": Schema("flights", {
        "airports": ("code", "city", "country"),
        "airlines": ("airline_id", "name", "country"),
        "flights": ("flight_id", "airline_id", "origin", "destination", "distance"),
    }, _flights_rows, _FLIGHTS_TEMPLATES),
}
SCHEMA_NAMES = tuple(SCHEMAS)


def write_database(schema: Schema, rows: Rows, path: str | os.PathLike[str]) -> None:
  """Writes the SQLite file `path` holding `rows` (overwrites an existing file)."""
  # Built in memory and written as one serialized image: creating it in place costs a journal and
  # an fsync per commit, which dominated reset time.
  conn = _memory_database(schema, rows)
  try:
    image = conn.serialize()
  finally:
    conn.close()
  pathlib.Path(path).write_bytes(image)


def _memory_database(schema: Schema, rows: Rows) -> sqlite3.Connection:
  conn = sqlite3.connect(":memory:")
  for table, columns in schema.tables.items():
    conn.execute(f"CREATE TABLE {table} ({', '.join(columns)})")
    conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})",
                     rows[table])
  conn.commit()
  return conn


def _question_ok(schema: Schema, rows: Rows, sql: str) -> bool:
  """A question is kept when its gold answer is non-empty and not a lone 0/NULL."""
  conn = _memory_database(schema, rows)
  try:
    result = conn.execute(sql).fetchall()
  finally:
    conn.close()
  return bool(result) and result != [(0,)] and result != [(None,)]


def make_task(seed: int, schemas: tuple[str, ...] = SCHEMA_NAMES,
              tiers: tuple[str, ...] = TIERS) -> dict[str, Any]:
  """The task of episode `seed`: a JSON-able dict (schema, db_seed, question, gold_sql, tier).

  The database rows are not stored: `SCHEMAS[schema].make_rows(default_rng([db_seed, 0]))`
  rebuilds them, so a task set holds only these few fields.
  """
  schema = SCHEMAS[schemas[seed % len(schemas)]]
  rows = schema.make_rows(np.random.default_rng([seed, 0]))
  rng = np.random.default_rng([seed, 1])
  # Tier first, then a template of that tier: the tiers are equally frequent whatever the
  # number of templates each has.
  for _ in range(_MAX_EMPTY_REDRAWS):
    tier = tiers[int(rng.integers(len(tiers)))]
    templates = [t for t in schema.templates if t.tier == tier]
    question, sql = templates[int(rng.integers(len(templates)))].draw(rng, rows)
    if _question_ok(schema, rows, sql):
      return {"schema": schema.name, "db_seed": seed, "question": question, "gold_sql": sql,
              "tier": tier}
  raise RuntimeError(f"sql: no question with a non-empty answer for seed {seed}")


# ---------------------------------------------------------------------------------------------
# The environment.


@registry.register("sql")
class TextToSQL(base.TextEnv):
  """Answer a question about a generated SQLite database by writing SQL, over several turns.

  Tasks come from `make_task(seed)` (default) or, with `data_dir`, from a built TFDS task set
  (`tasksets/sql_tasks.py`): `reset(seed)` takes record `seed % len`.
  """

  action_words = None

  def __init__(self, max_turns: int = 5, schemas: tuple[str, ...] = SCHEMA_NAMES,
               tiers: tuple[str, ...] = TIERS, time_limit_ms: int = 200,
               max_action_chars: int = 2000, explore_first: bool = True,
               score_queries: bool = True, data_dir: str | None = None,
               taskset: str = "agentrl_sql_tasks", split: str = "train"):
    """Builds the env.

    Args:
      max_turns: step cap (statements including the submission).
      schemas: schema names to draw from (see `SCHEMA_NAMES`).
      tiers: difficulty tiers to draw from (see `TIERS`).
      time_limit_ms: per-statement time limit.
      max_action_chars: longer actions are rejected unexecuted.
      explore_first: the expert runs one exploratory query before submitting.
      score_queries: add `info["sql_score"]`, the clause/lexical alignment with the gold query;
        needs `sqlglot` (the `envs` extra).
      data_dir: read tasks from a built TFDS task set here instead of generating them.
      taskset: the task set's TFDS name, with a config after a slash ("agentrl_sql_tasks/tiny").
      split: the TFDS split when `data_dir` is set.
    """
    super().__init__(max_turns)
    schemas, tiers = tuple(schemas), tuple(tiers)
    if not schemas or any(s not in SCHEMAS for s in schemas):
      raise ValueError(f"schemas must be a non-empty subset of {SCHEMA_NAMES}, got {schemas!r}")
    if not tiers or any(t not in TIERS for t in tiers):
      raise ValueError(f"tiers must be a non-empty subset of {TIERS}, got {tiers!r}")
    if not base.is_int(time_limit_ms) or not 1 <= time_limit_ms <= 10_000:
      raise ValueError(f"time_limit_ms must be an int in [1, 10000], got {time_limit_ms!r}")
    if not base.is_int(max_action_chars) or max_action_chars < 16:
      raise ValueError(f"max_action_chars must be an int >= 16, got {max_action_chars!r}")
    self.schemas, self.tiers = schemas, tiers
    self.time_limit_ms = time_limit_ms
    self.max_action_chars = max_action_chars
    self.explore_first = bool(explore_first)
    self._diagnostics = None
    if score_queries:
      try:
        # pylint: disable-next=g-import-not-at-top
        from agentrl_jax.envs import sql_diagnostics
      except ImportError as e:
        raise ValueError(f"score_queries=True needs sqlglot ({e}); install the `envs` extra or "
                         "pass score_queries=False") from e
      self._diagnostics = sql_diagnostics
    self._source = None
    if data_dir is not None:
      # Imported here: TFDS is an optional dependency the generator path never needs.
      # pylint: disable-next=g-import-not-at-top
      from agentrl_jax.envs.tasksets import common
      self._source = common.TaskSource(taskset, data_dir, split)
    self._tmpdir = tempfile.mkdtemp(prefix="agentrl_sql_")
    weakref.finalize(self, shutil.rmtree, self._tmpdir, True)
    self.database_path = os.path.join(self._tmpdir, "episode.sqlite")
    self._db: ReadOnlyDatabase | None = None
    self.task: dict[str, Any] = {}
    self.gold_sql = ""
    self.queries: list[tuple[str, bool]] = []
    self._gold: ExecResult | None = None

  def _reset(self, seed: int) -> str:
    task = self._source.task(seed) if self._source else make_task(seed, self.schemas, self.tiers)
    self.task = task
    schema = SCHEMAS[task["schema"]]
    if self._db is not None:
      self._db.close()
    write_database(schema, schema.make_rows(np.random.default_rng([task["db_seed"], 0])),
                   self.database_path)
    self._db = ReadOnlyDatabase(self.database_path, time_limit_ms=self.time_limit_ms)
    self.gold_sql = task["gold_sql"]
    self._gold = self._db.execute(self.gold_sql)
    if not self._gold.ok:
      raise RuntimeError(f"sql: gold query failed ({self._gold.error}): {self.gold_sql}")
    self.queries = []
    return (f"database {schema.name}. tables:\n{schema.describe()}\n"
            f"question: {task['question']}\n"
            f"write one SQLite SELECT per turn to see its result; submit with "
            f"'{SUBMIT_PREFIX} <query>' within {self.max_turns} turns")

  def execute(self, sql: str) -> ExecResult:
    """Runs `sql` on the current episode's database under the read-only guards."""
    if self._db is None:
      raise RuntimeError("sql: execute() called before reset()")
    return self._db.execute(sql)

  def result_match(self, sql: str) -> bool:
    """Execution match of `sql` against the gold query on the current database."""
    return results_match(self.execute(sql), self._gold, has_order_by(self.gold_sql))

  def expert_action(self) -> str:
    """One look at the first table the gold query reads, then the gold query."""
    if self.explore_first and self.turn == 0 and self.max_turns >= 2:
      table = next(t for t in SCHEMAS[self.task["schema"]].tables if t in self.gold_sql)
      return f"SELECT * FROM {table} LIMIT 3"
    return f"{SUBMIT_PREFIX} {self.gold_sql}"

  def _step(self, action: Any) -> base.StepResult:
    problem = self._malformed(action)
    if problem:
      return self._observe(problem, self._turn_info(False, False, None, False))
    text = action.strip()
    submitted = text.upper().startswith(SUBMIT_PREFIX)
    sql = text[len(SUBMIT_PREFIX):].strip() if submitted else text
    if not sql:
      return self._observe(f"empty query after '{SUBMIT_PREFIX}': write '{SUBMIT_PREFIX} "
                           "SELECT ...'", self._turn_info(False, False, None, False))
    result = self._db.execute(sql)
    self.queries.append((sql, result.ok))
    match = results_match(result, self._gold, has_order_by(self.gold_sql))
    if submitted:
      feedback = ("submitted: correct" if match else
                  "submitted: wrong result" if result.ok else
                  f"submitted: error: {_cut(result.error, _MAX_ERROR_CHARS)}")
      info = dict(self._turn_info(True, result.ok, sql, match), submitted=True, success=match,
                  sub_outcomes={"executable": float(result.ok), "result_match": float(match)})
      return base.StepResult(feedback, float(match), True, info)
    return self._observe(_render(result), self._turn_info(result.ok, result.ok, sql, match))

  def _turn_info(self, valid: bool, exec_ok: bool, sql: str | None,
                 correct: bool) -> dict[str, Any]:
    info = {"action_valid": valid, "submitted": False, "sql_exec_ok": exec_ok,
            "sql_correct": correct}
    if self._diagnostics is not None:
      info["sql_score"] = self._diagnostics.score(sql, self.gold_sql) if sql else 0.0
    return info

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False,
                sub_outcomes={"executable": 0.0, "result_match": 0.0})
    return result._replace(observation=f"{result.observation}\nout of turns, nothing submitted",
                           done=True, info=info)

  def _observe(self, text: str, info: dict[str, Any]) -> base.StepResult:
    # No turn counter in the text: equal results at different turns are the same state for
    # observation-hash grouping (GiGPO anchors); the cap is stated in the first observation.
    return base.StepResult(text, 0.0, False, info)

  def _malformed(self, action: Any) -> str:
    if not isinstance(action, str):
      return f"invalid action of type {type(action).__name__}: write an SQL query"
    if not action.strip():
      return f"empty action: write an SQL query, or '{SUBMIT_PREFIX} <query>' to submit"
    if len(action) > self.max_action_chars:
      return (f"action too long ({len(action)} characters, limit {self.max_action_chars}): "
              "write one short SQL query")
    return ""


def _render(result: ExecResult) -> str:
  if not result.ok:
    return f"error: {_cut(result.error, _MAX_ERROR_CHARS)}"
  n = len(result.rows)
  count = f"{n}+ rows" if result.truncated else f"{n} row{'s' if n != 1 else ''}"
  lines = [f"ok: {count}; columns: {', '.join(result.columns)}"]
  for row in result.rows[:_SHOWN_ROWS]:
    lines.append(" | ".join(_cut(_format_cell(v), _MAX_CELL_CHARS) for v in row))
  if n > _SHOWN_ROWS:
    lines.append(f"... {n - _SHOWN_ROWS} more")
  return "\n".join(lines)


def _format_cell(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:.6g}"
  if isinstance(value, bytes):
    return f"<{len(value)} bytes>"
  return "NULL" if value is None else str(value)


def _cut(text: str, limit: int) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + "..."
