"""Progress-SQL's progressive rewards for multi-turn Text-to-SQL refinement
(docs/methods.md#progress-sql).

The agent writes SQL `q_0`, receives diagnostic feedback and refines it over turns `q_1 … q_K`.
The rewards measure improvement rather than one state:

  score(q)  = α·S_str(q) + (1 − α)·S_lex(q)             structural + lexical alignment with gold
  R_prog    = score(q_K) − score(q_0)                   ∈ [−1, 1]
  R_lat     = 1 − k*/(K + 1),  k* = min{k : EX(q_k)}    (0 if never correct)
  R_exec    = +1 if ¬exec_ok(q_0) ∧ exec_ok(q_K);  −1 if ¬exec_ok(q_K);  else 0
  R         = EX(q_K) + w_p·R_prog + w_l·R_lat + w_e·R_exec

Two halves: a host-side, regex-based scorer of SQL strings (`clause_profile`,
`structural_alignment`, `lexical_alignment`, `alignment_score`), a dependency-free reference that
the tests exercise; and the jitted reward shaper `progressive_sql_reward`, which turns per-turn
arrays in `traj.extras` into the three bonuses. The SQL environment does not call the scorer
here: it fills those arrays (`sql_score`, `sql_exec_ok`, `sql_correct`) once per turn with the
sqlglot-based clause comparison of `envs/sql_diagnostics.py`. The environment's own reward is
taken to be `EX(q_K)` on the last turn; the shaper adds `w_p·R_prog + w_l·R_lat + w_e·R_exec` to
that turn.
"""

from __future__ import annotations

import collections
import re
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array


_CLAUSES = ("select", "from", "where", "group by", "having", "order by", "limit")
_CLAUSE_RE = re.compile(r"\b(select|from|where|group\s+by|having|order\s+by|limit|union|intersect|except)\b")
_TOKEN_RE = re.compile(r"'[^']*'|\"[^\"]*\"|[a-z_][a-z0-9_\.]*|\d+(?:\.\d+)?|<=|>=|<>|!=|[(),*=<>+\-/]")
_SPLIT_AND_RE = re.compile(r"\s+(?:and|or)\s+")


def sql_tokens(sql: str) -> list[str]:
  """Normalised SQL tokens: lowercase, string literals kept whole, `;` and whitespace dropped."""
  return _TOKEN_RE.findall(sql.lower().replace(";", " "))


def _split_top_level(text: str, separator_re: re.Pattern[str] | None = None) -> list[str]:
  """Splits on top-level commas, or on `separator_re`, and normalises each part."""
  if separator_re is not None:
    parts = separator_re.split(text)
  else:
    parts, depth, current = [], 0, []
    for ch in text:
      depth += (ch == "(") - (ch == ")")
      if depth == 0 and ch == ",":
        parts.append("".join(current))
        current = []
      else:
        current.append(ch)
    parts.append("".join(current))
  return [" ".join(sql_tokens(p)) for p in parts if p.strip()]


def clause_profile(sql: str) -> dict[str, collections.Counter]:
  """The clause profile `P(q)`: a multiset of normalised items per clause type.

  SELECT/GROUP BY/ORDER BY items split on top-level commas; FROM items are the joined tables and
  join conditions; WHERE/HAVING items are the predicates split on AND/OR; LIMIT is its value.
  A nested subquery contributes its own profile under `sub:<clause>` (the diagnostic tree's
  children). Set operators (`union`, …) are recorded as items of the `setop` clause.
  """
  text = " ".join(sql_tokens(sql))
  profile: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  # Subqueries first: profile them recursively, then replace each with a placeholder.
  while True:
    match = re.search(r"\(\s*select\b", text)
    if not match:
      break
    depth, end = 0, match.start()
    for end in range(match.start(), len(text)):
      depth += (text[end] == "(") - (text[end] == ")")
      if depth == 0:
        break
    for clause, items in clause_profile(text[match.start() + 1:end]).items():
      profile[f"sub:{clause}"].update(items)
    text = text[:match.start()] + " subquery " + text[end + 1:]
  pieces = _CLAUSE_RE.split(text)
  clause = None
  for piece in pieces:
    word = " ".join(piece.split())
    if word in _CLAUSES or word in ("union", "intersect", "except"):
      if word in ("union", "intersect", "except"):
        profile["setop"][word] += 1
        clause = None
      else:
        clause = word
      continue
    if clause is None or not word:
      continue
    if clause in ("where", "having"):
      items = _split_top_level(word, _SPLIT_AND_RE)
    elif clause == "from":
      items = [" ".join(sql_tokens(p)) for p in re.split(r"\bjoin\b|,", word) if p.strip()]
      items = [p.replace("inner ", "").replace("left ", "").strip() for p in items]
    else:
      items = _split_top_level(word)
    profile[clause].update(item for item in items if item)
  return dict(profile)


def _multiset_f1(a: collections.Counter, b: collections.Counter) -> float:
  overlap = sum((a & b).values())
  if overlap == 0:
    return 0.0
  precision, recall = overlap / sum(a.values()), overlap / sum(b.values())
  return 2 * precision * recall / (precision + recall)


def structural_alignment(sql: str, gold: str) -> float:
  """`S_str`: F1 of clause items, averaged over the clause types present in either query."""
  p, g = clause_profile(sql), clause_profile(gold)
  clauses = sorted(set(p) | set(g))
  if not clauses:
    return 1.0
  empty = collections.Counter()
  return sum(_multiset_f1(p.get(c, empty), g.get(c, empty)) for c in clauses) / len(clauses)


def lexical_alignment(sql: str, gold: str) -> float:
  """`S_lex`: F1 between the normalised SQL token multisets."""
  a, b = collections.Counter(sql_tokens(sql)), collections.Counter(sql_tokens(gold))
  if not a and not b:
    return 1.0
  return _multiset_f1(a, b)


def alignment_score(sql: str, gold: str, *, alpha: float = 0.5) -> float:
  """`score(q) = α·S_str(q) + (1 − α)·S_lex(q)` in [0, 1]; `score(gold) = 1`."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
  return alpha * structural_alignment(sql, gold) + (1 - alpha) * lexical_alignment(sql, gold)


class ProgressBonuses(NamedTuple):
  """The three Progress-SQL bonuses of each trajectory, `[B]` float32."""

  progress: Array
  latency: Array
  execution: Array


def progress_bonuses(score: Array, exec_ok: Array, correct: Array,
                     turn_mask: Array) -> ProgressBonuses:
  """Per-trajectory `R_prog`, `R_lat` and `R_exec`.

  Args:
    score: `[B, N]` alignment score of the SQL written in each turn, turns [0, N).
    exec_ok: `[B, N]` bool, that SQL ran without error.
    correct: `[B, N]` bool, its result set equals the gold one (EX).
    turn_mask: `[B, N]` bool; the turns that exist form a prefix, `q_K` is the last one.
  """
  chex.assert_rank([score, exec_ok, correct, turn_mask], 2)
  chex.assert_equal_shape([score, exec_ok, correct, turn_mask])
  turn_mask = turn_mask.astype(bool)
  last = trajectory.last_turn(turn_mask)
  has_turns = jnp.any(turn_mask, axis=1)
  first_score, last_score = score[:, 0], jnp.sum(jnp.where(last, score, 0.0), axis=1)
  r_prog = jnp.where(has_turns, last_score - first_score, 0.0)
  n = turn_mask.shape[1]
  hits = correct.astype(bool) & turn_mask
  first_hit = jnp.min(jnp.where(hits, jnp.arange(n)[None, :], n), axis=1)
  num_turns = jnp.sum(turn_mask, axis=1)  # K + 1
  r_lat = jnp.where(jnp.any(hits, axis=1),
                    1.0 - first_hit / jnp.maximum(num_turns, 1).astype(jnp.float32), 0.0)
  ok_first = exec_ok[:, 0].astype(bool)
  ok_last = jnp.any(exec_ok.astype(bool) & last, axis=1)
  r_exec = jnp.where(~ok_last, -1.0, jnp.where(~ok_first, 1.0, 0.0))
  r_exec = jnp.where(has_turns, r_exec, 0.0)
  return ProgressBonuses(progress=r_prog.astype(jnp.float32), latency=r_lat.astype(jnp.float32),
                         execution=r_exec.astype(jnp.float32))


def progressive_sql_reward(traj: types.Trajectories, *, progress_weight: float = 0.5,
                           latency_weight: float = 0.25,
                           execution_weight: float = 0.25) -> types.Trajectories:
  """Reward shaper: adds `w_p·R_prog + w_l·R_lat + w_e·R_exec` to each trajectory's last turn.

  Needs, filled by the SQL environment per turn (the SQL written in that turn):
    `traj.extras["sql_score"]`: `[B, N]` float32 `alignment_score(q_k, gold)`;
    `traj.extras["sql_exec_ok"]`: `[B, N]` bool, `q_k` executes without error;
    `traj.extras["sql_correct"]`: `[B, N]` bool, `EX(q_k)`.
  The environment's reward is `EX(q_K)`, so the shaped return is Progress-SQL's total `R`, bounded in
  `[−w_p − w_e, 1 + w_p + w_l + w_e]`.

  Args:
    traj: the batch.
    progress_weight: w_p (default 0.5).
    latency_weight: w_l (default 0.25).
    execution_weight: w_e (default 0.25).
  """
  for name, value in (("progress_weight", progress_weight), ("latency_weight", latency_weight),
                      ("execution_weight", execution_weight)):
    if not value >= 0:
      raise ValueError(f"progressive_sql_reward: {name} must be >= 0, got {value!r}")
  method, meaning = "progressive_sql_reward (Progress-SQL)", "[B, N] per turn"
  score = trajectory.require(traj.extras, extra_keys.SCORE_KEY, where="extras", method=method,
                        meaning=f"{meaning} float alignment score of that turn's SQL")
  exec_ok = trajectory.require(traj.extras, extra_keys.EXEC_OK_KEY, where="extras", method=method,
                          meaning=f"{meaning} bool, that turn's SQL executes")
  correct = trajectory.require(traj.extras, extra_keys.CORRECT_KEY, where="extras", method=method,
                          meaning=f"{meaning} bool, that turn's SQL result equals the gold one")
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  r_prog, r_lat, r_exec = progress_bonuses(score.astype(jnp.float32), exec_ok, correct, turn_mask)
  bonus = progress_weight * r_prog + latency_weight * r_lat + execution_weight * r_exec
  reward = jnp.asarray(traj.reward, jnp.float32)
  reward = reward + jnp.where(trajectory.last_turn(turn_mask), bonus[:, None], 0.0)
  return trajectory.with_turn_rewards(traj, reward)
