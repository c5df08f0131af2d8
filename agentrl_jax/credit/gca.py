"""GCA — Grounded Credit Assignment for search agents (docs/methods.md#gca).

An outcome advantage gives every token of a search-agent rollout the same credit, but a rollout
exercises two capabilities: finding evidence (search turns) and using it (the answer turn). GCA
corrects the two separately from two verifiable sub-outcomes, after any estimator:

  evidence-finding search tokens:           C_t = +ε·|A_t|
  answer tokens, evidence found but wrong:  C_t = −ε·|A_t|        (evidence misused)
  answer tokens, correct without evidence
    that the group shows was retrievable:   C_t = −ε·|A_t|        (answered from memory)
  everything else:                          C_t = 0
  A'_t = A_t + C_t

so `|A'_t − A_t| ≤ ε·|A_t|` with `ε ≤ 0.1`: the correction never flips a sign, never exceeds
10% of a token's advantage, and is never negative on evidence-finding search.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array

MAX_EPSILON = 0.1
BYPASS_SCOPES = ("answer", "all")
RETRIEVABLE = ("group", "oracle")


def grounded_correction(advantages: Array, *, evidence_tokens: Array, answer_tokens: Array,
                        policy_tokens: Array, found: Array, correct: Array, retrievable: Array,
                        epsilon: float = 0.1, bypass_scope: str = "answer") -> Array:
  """The GCA kernel: `A' = A + C` with `C` from the case table above.

  Args:
    advantages: `[B, L]` token advantages from any estimator.
    evidence_tokens: `[B, L]` bool, policy tokens of search turns that retrieved evidence.
    answer_tokens: `[B, L]` bool, policy tokens of the answer turn (wins on overlap).
    policy_tokens: `[B, L]` bool, all policy tokens (the bypass scope "all").
    found: `[B]` bool, some turn of the trajectory retrieved evidence.
    correct: `[B]` bool, the answer is correct.
    retrievable: `[B]` bool, the evidence could have been retrieved.
    epsilon: ε in (0, 0.1].
    bypass_scope: "answer" (default) or "all" tokens of a bypassing trajectory.
  """
  _check(epsilon, bypass_scope)
  chex.assert_rank([advantages, evidence_tokens, answer_tokens, policy_tokens], 2)
  chex.assert_rank([found, correct, retrievable], 1)
  base = advantages.astype(jnp.float32)
  magnitude = epsilon * jnp.abs(base)
  found, correct, retrievable = (x.astype(bool)[:, None] for x in (found, correct, retrievable))
  misused = found & ~correct
  bypassed = ~found & correct & retrievable
  bypass_tokens = policy_tokens if bypass_scope == "all" else answer_tokens
  penalized = (answer_tokens & misused) | (bypass_tokens & bypassed)
  credited = evidence_tokens & ~answer_tokens & ~penalized
  correction = jnp.where(credited, magnitude, 0.0) - jnp.where(penalized, magnitude, 0.0)
  return (base + correction).astype(advantages.dtype)


def group_any(flag: Array, group_id: Array) -> Array:
  """`[B]` bool: some trajectory of the same group has `flag` set (GCA's default retrievable)."""
  b = flag.shape[0]
  hit = jax.ops.segment_max(flag.astype(jnp.int32), group_id, num_segments=b)
  return hit[group_id] > 0


def grounded_credit(traj: types.Trajectories, advantages: Array, *, epsilon: float = 0.1,
                    bypass_scope: str = "answer", retrievable: str = "group",
                    infer_search_turns: bool = False) -> Array:
  """Correction: Grounded Credit Assignment (docs/methods.md#gca) after any estimator.

  Needs:
    `traj.sub_outcomes["answer_correct"]`: `[B]` answer correctness (EM).
    `traj.extras["search_turn"]`: `[B, N]` bool, the turn issued a search.
    `traj.extras["evidence_turn"]`: `[B, N]` bool, the search turn's documents contain the gold
      answer; when absent, every search turn of a trajectory with
      `traj.sub_outcomes["evidence_found"]` (`[B]`) counts as evidence-finding.
  Optional: `traj.extras["answer_turn"]` (`[B, N]` bool; default the last turn) and, for
  `retrievable="oracle"`, `traj.sub_outcomes["evidence_retrievable"]` (`[B]`).
  With `infer_search_turns`, a batch without `extras["search_turn"]` counts every valid action
  before the answer turn as a search (true of envs whose only actions are search and answer,
  such as `search_qa`).

  Args:
    traj: the batch.
    advantages: `[B, L]` token advantages.
    epsilon: ε in (0, 0.1] (default 0.1; above 0.1 is rejected).
    bypass_scope: "answer" (default) or "all".
    retrievable: "group" (default: some rollout of the group found evidence) or "oracle".
    infer_search_turns: see above (default False: `search_turn` is required).
  """
  _check(epsilon, bypass_scope)
  if retrievable not in RETRIEVABLE:
    raise ValueError(f"gca retrievable must be one of {RETRIEVABLE}, got {retrievable!r}")
  method = "grounded_credit (GCA)"
  correct = trajectory.require(traj.sub_outcomes, extra_keys.ANSWER_CORRECT_KEY, where="sub_outcomes",
                          method=method, meaning="[B] answer correctness") > 0.5
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  answer_turn = (jnp.asarray(traj.extras[extra_keys.ANSWER_TURN_KEY]).astype(bool)
                 if extra_keys.ANSWER_TURN_KEY in traj.extras else trajectory.last_turn(turn_mask))
  if infer_search_turns and extra_keys.SEARCH_TURN_KEY not in traj.extras:
    search_turn = jnp.asarray(traj.action_valid, bool) & turn_mask & ~answer_turn
  else:
    search_turn = trajectory.require(
        traj.extras, extra_keys.SEARCH_TURN_KEY, where="extras", method=method,
        meaning="[B, N] bool, the turn issued a search; or set infer_search_turns").astype(bool)
  if extra_keys.EVIDENCE_TURN_KEY in traj.extras:
    evidence_turn = jnp.asarray(traj.extras[extra_keys.EVIDENCE_TURN_KEY]).astype(bool) & search_turn
    found = jnp.any(evidence_turn & turn_mask, axis=1)
  else:
    found = trajectory.require(
        traj.sub_outcomes, extra_keys.EVIDENCE_FOUND_KEY, where="sub_outcomes", method=method,
        meaning=f"[B] a retrieved document held the answer (or give extras[{extra_keys.EVIDENCE_TURN_KEY!r}])"
    ) > 0.5
    evidence_turn = search_turn & found[:, None]
  if retrievable == "group":
    can_retrieve = group_any(found, jnp.asarray(traj.group_id))
  else:
    can_retrieve = trajectory.require(traj.sub_outcomes, extra_keys.EVIDENCE_RETRIEVABLE_KEY, where="sub_outcomes",
                                 method=method, meaning="[B] an oracle retriever hit") > 0.5
  as_tokens = lambda turns: trajectory.to_tokens((turns & turn_mask).astype(jnp.float32), traj) > 0
  return grounded_correction(
      advantages, evidence_tokens=as_tokens(evidence_turn), answer_tokens=as_tokens(answer_turn),
      policy_tokens=jnp.asarray(traj.action_mask, bool), found=found, correct=correct,
      retrievable=can_retrieve, epsilon=epsilon, bypass_scope=bypass_scope)


def _check(epsilon: float, bypass_scope: str) -> None:
  if not 0.0 < epsilon <= MAX_EPSILON:
    raise ValueError(f"gca epsilon must be in (0, {MAX_EPSILON}] so that the correction never "
                     f"overrides the outcome signal, got {epsilon!r}")
  if bypass_scope not in BYPASS_SCOPES:
    raise ValueError(f"gca bypass_scope must be one of {BYPASS_SCOPES}, got {bypass_scope!r}")
