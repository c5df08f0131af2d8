"""Clause-level comparison of a predicted SQL query with the gold query (Progress-SQL).

Progress-SQL (docs/methods.md#progress-sql) scores a query by its alignment with the gold query:

    S_str(q) = mean over clause types present in q or q* of F1(P_c(q), P_c(q*))
    S_lex(q) = F1 of the normalised SQL token multisets
    score(q) = alpha * S_str(q) + (1 - alpha) * S_lex(q)

where P_c(q) is the multiset of normalised items of clause type c (the clause profile). This module
computes the profile with sqlglot and exposes the pieces for a reward module (`score`,
`structural_alignment`, `lexical_alignment`, `clause_f1`) and for the environment's diagnostic
feedback (`first_mismatch`, the Oracle-guided Diagnostic Tree's message).

Normalisation (so that equivalent spellings score alike): keywords and identifiers lowercase;
column qualifiers dropped (`c.name`, `customers.name` and `name` are one item); table aliases
resolved to table names; SELECT aliases dropped, and ORDER BY items that name a SELECT alias
replaced by the aliased expression; the two sides of `=` in JOIN conditions sorted. WHERE/HAVING
predicates are profiled as (left side, operator, literal type) as Progress-SQL prescribes, so the literal
value counts in the lexical score only. A nested query contributes its own profile under
`subquery`, each item prefixed with its clause ("where:product_id in subquery").

A string sqlglot cannot parse, or that parses to something other than a query (sqlglot reads
`SELEC * FRM t` as an aliased column), has an empty profile: its structural alignment is 0.
"""

from __future__ import annotations

import collections
import re
from typing import Any

import sqlglot
from sqlglot import exp

CLAUSES = ("select", "from", "join", "where", "group_by", "having", "order_by", "limit", "set_op",
           "subquery")
CLAUSE_NAMES = {"select": "SELECT", "from": "FROM", "join": "JOIN", "where": "WHERE",
                "group_by": "GROUP BY", "having": "HAVING", "order_by": "ORDER BY",
                "limit": "LIMIT", "set_op": "set operation", "subquery": "nested query"}

Profile = dict[str, collections.Counter]


def parse(sql: str) -> exp.Expression | None:
  """The sqlglot tree of `sql` when it is a query (SELECT or a set operation), else None."""
  if not isinstance(sql, str) or not sql.strip():
    return None
  try:
    tree = sqlglot.parse_one(sql, read="sqlite")
  except Exception:  # pylint: disable=broad-except
    # sqlglot raises ParseError and, on some inputs, TokenError or ValueError: all mean "no query".
    return None
  return tree if isinstance(tree, (exp.Select, exp.SetOperation)) else None


def clause_profile(sql: str) -> Profile:
  """The multiset of normalised items per clause type; empty for a non-query."""
  tree = parse(sql)
  profile: Profile = {c: collections.Counter() for c in CLAUSES}
  if tree is not None:
    _profile_query(tree, profile)
  return {c: items for c, items in profile.items() if items}


def clause_f1(predicted: str, gold: str) -> dict[str, float]:
  """F1 of the predicted vs gold items, per clause type present in either query."""
  pred, want = clause_profile(predicted), clause_profile(gold)
  return {c: _f1(pred.get(c, collections.Counter()), want.get(c, collections.Counter()))
          for c in CLAUSES if c in pred or c in want}


def structural_alignment(predicted: str, gold: str) -> float:
  """S_str: the mean per-clause F1 (0 when the prediction is not a query)."""
  scores = clause_f1(predicted, gold)
  return sum(scores.values()) / len(scores) if scores else 0.0


def lexical_alignment(predicted: str, gold: str) -> float:
  """S_lex: F1 between the normalised SQL token multisets."""
  return _f1(collections.Counter(sql_tokens(predicted)), collections.Counter(sql_tokens(gold)))


def score(predicted: str, gold: str, alpha: float = 0.5) -> float:
  """alpha * S_str + (1 - alpha) * S_lex, in [0, 1]."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
  return (alpha * structural_alignment(predicted, gold) +
          (1.0 - alpha) * lexical_alignment(predicted, gold))


def first_mismatch(predicted: str, gold: str) -> str | None:
  """A one-line diagnostic naming the first clause (in SQL order) whose items differ; None if none.

  Examples: "the query does not parse as a SELECT", "WHERE differs: missing city = str".
  """
  if parse(predicted) is None:
    return "the query does not parse as a SELECT"
  pred, want = clause_profile(predicted), clause_profile(gold)
  for clause in CLAUSES:
    p, g = pred.get(clause, collections.Counter()), want.get(clause, collections.Counter())
    if p == g:
      continue
    missing, extra = sorted((g - p).elements()), sorted((p - g).elements())
    parts = []
    if missing:
      parts.append("missing " + ", ".join(missing[:2]))
    if extra:
      parts.append("unexpected " + ", ".join(extra[:2]))
    return f"{CLAUSE_NAMES[clause]} differs: {'; '.join(parts)}"
  return None


_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d+)?|<=|>=|<>|!=|"
                    r"\S")


def sql_tokens(sql: str) -> list[str]:
  """Lowercased SQL tokens; table aliases, column qualifiers and alias-defining `AS` dropped."""
  if not isinstance(sql, str):
    return []
  tokens = [t if t.startswith("'") else t.lower() for t in _TOKEN.findall(sql)]
  aliases = _token_aliases(tokens)
  out = []
  skip_next = False
  for i, tok in enumerate(tokens):
    if skip_next:
      skip_next = False
      continue
    if tok == "as" and i + 1 < len(tokens) and tokens[i + 1] in aliases:
      skip_next = True  # "customers AS c": the alias definition itself carries nothing.
      continue
    if i + 1 < len(tokens) and tokens[i + 1] == "." and re.fullmatch(r"[a-z_]\w*", tok):
      skip_next = True  # "c." / "customers." qualifier: dropped, as in the structural profile.
      continue
    if tok in aliases and i > 0 and tokens[i - 1] in aliases.values():
      continue  # "customers c" (alias without AS).
    out.append(tok)
  return out


def _token_aliases(tokens: list[str]) -> dict[str, str]:
  aliases = {}
  for i, tok in enumerate(tokens[:-1]):
    if tok in ("from", "join") and i + 1 < len(tokens):
      table = tokens[i + 1]
      j = i + 2
      if j < len(tokens) and tokens[j] == "as":
        j += 1
      if j < len(tokens) and re.fullmatch(r"[a-z_][a-z_0-9]*", tokens[j]) and tokens[j] not in (
          "where", "join", "on", "group", "order", "limit", "inner", "left", "right", "cross",
          "natural", "having", "union", "intersect", "except", "outer", "full"):
        aliases[tokens[j]] = table
  return aliases


def _f1(pred: collections.Counter, gold: collections.Counter) -> float:
  if not pred and not gold:
    return 1.0
  common = sum((pred & gold).values())
  if common == 0:
    return 0.0
  precision, recall = common / sum(pred.values()), common / sum(gold.values())
  return 2 * precision * recall / (precision + recall)


def _profile_query(tree: exp.Expression, profile: Profile) -> None:
  if isinstance(tree, exp.SetOperation):
    kind = type(tree).__name__.lower() + ("" if tree.args.get("distinct", True) else " all")
    profile["set_op"][kind] += 1
    _profile_query(tree.this, profile)
    _profile_query(tree.expression, profile)
    return
  if not isinstance(tree, exp.Select):
    return
  select_aliases = {}
  for projection in tree.expressions:
    if isinstance(projection, exp.Alias):
      select_aliases[projection.alias.lower()] = projection.this
    profile["select"][_norm(_unalias(projection), profile)] += 1
  if tree.args.get("distinct"):
    profile["select"]["distinct"] += 1
  source = tree.args.get("from_") or tree.args.get("from")
  if source is not None:
    for table in _tables(source.this):
      profile["from"][table] += 1
  for join in tree.args.get("joins") or ():
    for table in _tables(join.this):
      profile["from"][table] += 1
    on = join.args.get("on")
    condition = _sorted_equality(on, profile) if on is not None else "cross"
    profile["join"][condition] += 1
  where = tree.args.get("where")
  if where is not None:
    for predicate in _conjuncts(where.this):
      profile["where"][_predicate(predicate, profile)] += 1
  group = tree.args.get("group")
  if group is not None:
    for item in group.expressions:
      profile["group_by"][_norm(item, profile)] += 1
  having = tree.args.get("having")
  if having is not None:
    for predicate in _conjuncts(having.this):
      profile["having"][_predicate(predicate, profile)] += 1
  order = tree.args.get("order")
  if order is not None:
    for item in order.expressions:
      target = item.this
      if isinstance(target, exp.Column) and not target.table and (
          target.name.lower() in select_aliases):
        target = select_aliases[target.name.lower()]
      direction = "desc" if item.args.get("desc") else "asc"
      profile["order_by"][f"{_norm(target, profile)} {direction}"] += 1
  limit = tree.args.get("limit")
  if limit is not None:
    profile["limit"][_norm(limit.args.get("expression") or limit.this, profile)] += 1


def _tables(node: exp.Expression) -> list[str]:
  if isinstance(node, exp.Table):
    return [node.name.lower()]
  if isinstance(node, exp.Subquery):
    return ["subquery"]
  return [t.name.lower() for t in node.find_all(exp.Table)]


def _unalias(node: exp.Expression) -> exp.Expression:
  return node.this if isinstance(node, exp.Alias) else node


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
  if isinstance(node, exp.And):
    return _conjuncts(node.this) + _conjuncts(node.expression)
  if isinstance(node, exp.Paren):
    return _conjuncts(node.this)
  return [node]


def _predicate(node: exp.Expression, profile: Profile) -> str:
  """(left side, operator, literal type): "city = str", "count(*) >= num", "id in subquery"."""
  negated = isinstance(node, exp.Not)
  if negated:
    node = node.this
  op = type(node).__name__.lower()
  left = node.args.get("this")
  right = node.args.get("expression")
  if isinstance(node, exp.In):
    query = node.args.get("query")
    right = query if query is not None else exp.Tuple(expressions=node.expressions)
  kind = _literal_type(right, profile)
  left_text = _norm(left, profile) if isinstance(left, exp.Expression) else ""
  return f"{'not ' if negated else ''}{left_text} {op} {kind}".strip()


def _literal_type(node: Any, profile: Profile) -> str:
  if node is None:
    return ""
  if isinstance(node, exp.Literal):
    return "str" if node.is_string else "num"
  if isinstance(node, (exp.Subquery, exp.Select, exp.SetOperation)):
    query = node.this if isinstance(node, exp.Subquery) else node
    nested: Profile = {c: collections.Counter() for c in CLAUSES}
    _profile_query(query, nested)
    for clause, items in nested.items():
      for item, count in items.items():
        profile["subquery"][f"{clause}:{item}"] += count
    return "subquery"
  if isinstance(node, exp.Tuple):
    return "list"
  if isinstance(node, exp.Column):
    return "column"
  if isinstance(node, exp.Null):
    return "null"
  return "expr"


def _sorted_equality(node: exp.Expression, profile: Profile) -> str:
  if isinstance(node, exp.EQ):
    sides = sorted([_norm(node.this, profile), _norm(node.expression, profile)])
    return f"{sides[0]} = {sides[1]}"
  return _norm(node, profile)


def _norm(node: Any, profile: Profile) -> str:
  """Lowercase SQL of `node` with column qualifiers removed; nested queries profiled."""
  if node is None:
    return ""
  if not isinstance(node, exp.Expression):
    return str(node).lower()
  node = node.copy()
  for column in list(node.find_all(exp.Column)):
    if column.table:
      column.set("table", None)
  for sub in list(node.find_all(exp.Subquery)):
    _literal_type(sub, profile)
    sub.replace(exp.column("subquery"))
  return node.sql(dialect="sqlite").lower()
