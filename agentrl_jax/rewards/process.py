"""Process rewards: SocialRL's stage-aware dimension weights and T1's verifier count.

Both turn scores the environment (or a reward model) recorded into dense turn rewards, before
any estimator runs. Neither touches advantages.
"""

from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array


# SocialRL: three dimensions named in the SocialRL abstract (goal, relationship, coherence) and three
# completed in docs/methods.md#socialrl. The order is the last axis of `extras["process_scores"]`.
DIMENSIONS = ("goal_advancement", "relational_attunement", "contextual_coherence",
              "information_seeking", "persona_consistency", "closure_quality")
STAGES = ("early", "mid", "late")
# Rows: early / mid / late; relationship first, goal mid-way, balanced closure late (SocialRL table).
DEFAULT_STAGE_WEIGHTS = (
    (0.15, 0.35, 0.15, 0.20, 0.10, 0.05),
    (0.35, 0.15, 0.15, 0.20, 0.10, 0.05),
    (0.25, 0.20, 0.10, 0.05, 0.10, 0.30),
)


def check_stage_weights(weights) -> np.ndarray:
  """Validates a `[3, D]` stage weight table (non-negative rows summing to 1) and returns it."""
  table = np.asarray(weights, np.float64)
  if table.ndim != 2 or table.shape[0] != len(STAGES):
    raise ValueError(f"stage weights must be a [{len(STAGES)}, D] table (rows {STAGES}), got "
                     f"shape {list(table.shape)}")
  if np.any(table < 0):
    raise ValueError(f"stage weights must be non-negative, got {weights!r}")
  sums = table.sum(axis=1)
  if not np.allclose(sums, 1.0, atol=1e-6):
    raise ValueError(f"every stage row must sum to 1, got row sums {sums.tolist()}")
  return table.astype(np.float32)


def turn_stage_weights(turn_mask: Array, weights: Array, *, smooth: bool = False) -> Array:
  """`[B, N, D]` weight vector of each turn's stage.

  Stage position `u = k/(K_b − 1)` (0 for a single turn): early `u < 1/3`, mid `1/3 ≤ u < 2/3`,
  late `u ≥ 2/3`. With `smooth`, the weights interpolate linearly between stage rows placed at
  u = 0, 1/2 and 1.

  Args:
    turn_mask: `[B, N]` bool; the turns that exist form a prefix.
    weights: `[3, D]` stage table (validated by `check_stage_weights`).
    smooth: piecewise-linear interpolation instead of hard stages.
  """
  chex.assert_rank([turn_mask, weights], [2, 2])
  n = turn_mask.shape[1]
  num_turns = jnp.sum(turn_mask, axis=1, keepdims=True).astype(jnp.float32)
  k = jnp.arange(n, dtype=jnp.float32)[None, :]
  u = jnp.where(num_turns > 1, k / jnp.maximum(num_turns - 1, 1.0), 0.0)
  if smooth:
    left = jnp.where(u < 0.5, 0, 1)
    frac = jnp.clip(jnp.where(u < 0.5, u / 0.5, (u - 0.5) / 0.5), 0.0, 1.0)[..., None]
    return (1 - frac) * weights[left] + frac * weights[left + 1]
  # Compare against thirds with exact integer arithmetic: 3k < K_b − 1 ⇔ u < 1/3.
  span = jnp.maximum(num_turns - 1, 1.0)
  stage = jnp.where(3 * k < span, 0, jnp.where(3 * k < 2 * span, 1, 2))
  stage = jnp.where(num_turns > 1, stage, 0)
  return weights[stage]


def stage_weighted_process_reward(traj: types.Trajectories, *, process_weight: float = 0.5,
                                  stage_weights=DEFAULT_STAGE_WEIGHTS, smooth: bool = False,
                                  score_keys: Sequence[str] = ()) -> types.Trajectories:
  """Reward shaper (SocialRL): `r[b, k] = r_env[b, k] + λ_p·Σ_d w_d(stage_k)·s[b, k, d]`.

  The environment delivers the episode's goal score `R_goal` as the last turn's reward, so the
  shaped reward is SocialRL's `λ_p·r^p + 1[k = K_b − 1]·R_goal`; credit it with GAE and a critic.

  Needs `traj.extras["process_scores"]`: `[B, N, D]` float scores in [0, 1] per turn and
  dimension, in the order of `DIMENSIONS` (D = 6 with the default table); or, with `score_keys`,
  one `[B, N]` extra per dimension, stacked in that order.

  Args:
    traj: the batch.
    process_weight: λ_p ≥ 0 (default 0.5); 0 gives back the outcome-only reward.
    stage_weights: `[3, D]` table, rows early / mid / late, each non-negative and summing to 1.
    smooth: interpolate between stage rows instead of switching at thirds.
    score_keys: names of `[B, N]` extras holding one dimension each (default: read
      `process_scores`).
  """
  if not process_weight >= 0:
    raise ValueError(f"stage_weighted_process_reward: process_weight must be >= 0, got "
                     f"{process_weight!r}")
  table = check_stage_weights(stage_weights)
  method = "stage_weighted_process_reward (SocialRL)"
  if score_keys:
    if len(score_keys) != table.shape[1]:
      raise ValueError(f"stage_weighted_process_reward: {len(score_keys)} score_keys for a "
                       f"{table.shape[1]}-column stage table")
    columns = [trajectory.require(traj.extras, key, where="extras", method=method,
                             meaning="[B, N] per-turn score of one dimension") for key in score_keys]
    scores = jnp.stack(columns, axis=-1)
  else:
    named = f": {DIMENSIONS}" if table.shape[1] == len(DIMENSIONS) else ""
    scores = trajectory.require(traj.extras, extra_keys.PROCESS_SCORES_KEY, where="extras", method=method,
                           meaning=f"[B, N, {table.shape[1]}] per-turn scores, one per column of "
                                   f"stage_weights{named}")
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  chex.assert_shape(scores, (*turn_mask.shape, table.shape[1]))
  weights = turn_stage_weights(turn_mask, jnp.asarray(table), smooth=smooth)
  process = jnp.sum(weights * scores.astype(jnp.float32), axis=-1)
  reward = jnp.asarray(traj.reward, jnp.float32) + process_weight * process
  return trajectory.with_turn_rewards(traj, reward)


def verifier_count_reward(traj: types.Trajectories, *, normalize: bool = False,
                          success_bonus: float = 0.0,
                          missing_counts_are_zero: bool = False) -> types.Trajectories:
  """Reward shaper (T1): the trajectory's reward is the number of verifier checks passing.

  Needs `traj.extras["verifier_checks"]`, either
    `[B, J]` bool/float: check j passes at the end; the count goes on the last turn; or
    `[B, N, J]`: checks passing after each turn; turn k earns the change in the count since
      turn k − 1 (a dense reward whose sum is the final count).
  or, when that is absent, the number of checks passing after each turn,
  `traj.extras["verifiers_passed"]` (`[B, N]`; dense as above), or only the final count
  `traj.sub_outcomes["verifiers_passed"]` (`[B]`) — the `terminal` env reports both; `normalize`
  and `success_bonus` then read `traj.sub_outcomes["verifiers_total"]`.
  The shaped rewards replace the environment's, so `outcome = Σ_j pass_j (+ success_bonus)`.

  The rollout fills 0 for an episode that ended without reporting its sub-outcomes (cut by the
  token budget); with `missing_counts_are_zero`, a batch in which *no* episode reported them gets
  the same treatment (all rewards 0) instead of an error.

  Args:
    traj: the batch.
    normalize: divide the count by J (default False: the absolute count, as in T1).
    success_bonus: added on the last turn when every check passes (default 0).
    missing_counts_are_zero: see above (default False: a batch without counts is an error).
  """
  method = "verifier_count_reward (T1)"
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  last = trajectory.last_turn(turn_mask)
  if extra_keys.VERIFIER_CHECKS_KEY not in traj.extras and (extra_keys.VERIFIERS_PASSED_KEY in traj.extras
                                                  or extra_keys.VERIFIERS_PASSED_KEY in traj.sub_outcomes):
    return _verifier_count_from_totals(traj, last, normalize=normalize, success_bonus=success_bonus)
  if extra_keys.VERIFIER_CHECKS_KEY not in traj.extras and missing_counts_are_zero:
    return trajectory.with_turn_rewards(traj, jnp.zeros_like(jnp.asarray(traj.reward, jnp.float32)))
  checks = trajectory.require(traj.extras, extra_keys.VERIFIER_CHECKS_KEY, where="extras", method=method,
                         meaning="[B, J] final or [B, N, J] per-turn pass flags of the verifiers, "
                                 f"or give sub_outcomes[{extra_keys.VERIFIERS_PASSED_KEY!r}]")
  checks = checks.astype(jnp.float32)
  scale = 1.0 / checks.shape[-1] if normalize else 1.0
  if checks.ndim == 2:
    chex.assert_shape(checks, (turn_mask.shape[0], None))
    final = jnp.sum(checks, axis=-1)
    reward = jnp.where(last, (final * scale)[:, None], 0.0)
  elif checks.ndim == 3:
    chex.assert_shape(checks, (*turn_mask.shape, None))
    count = jnp.where(turn_mask, jnp.sum(checks, axis=-1), 0.0)
    # Carry the running count through the turns that exist; a missing turn adds nothing.
    previous = jnp.concatenate([jnp.zeros_like(count[:, :1]), count[:, :-1]], axis=1)
    reward = jnp.where(turn_mask, (count - previous) * scale, 0.0)
    final = jnp.sum(jnp.where(last, count, 0.0), axis=1)
  else:
    raise ValueError(f"verifier_count_reward: traj.extras[{extra_keys.VERIFIER_CHECKS_KEY!r}] must be "
                     f"[B, J] or [B, N, J], got shape {list(checks.shape)}")
  all_pass = final >= checks.shape[-1]
  reward = reward + jnp.where(last & all_pass[:, None], success_bonus, 0.0)
  return trajectory.with_turn_rewards(traj, reward)


def _verifier_count_from_totals(traj: types.Trajectories, last: Array, *, normalize: bool,
                                success_bonus: float) -> types.Trajectories:
  """`verifier_count_reward` from pass counts (per turn in extras, or final in sub_outcomes)."""
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  if extra_keys.VERIFIERS_PASSED_KEY in traj.extras:
    count = jnp.where(turn_mask, jnp.asarray(traj.extras[extra_keys.VERIFIERS_PASSED_KEY], jnp.float32), 0.0)
    previous = jnp.concatenate([jnp.zeros_like(count[:, :1]), count[:, :-1]], axis=1)
    gained = jnp.where(turn_mask, count - previous, 0.0)
    passed = jnp.sum(jnp.where(last, count, 0.0), axis=1)
  else:
    passed = jnp.asarray(traj.sub_outcomes[extra_keys.VERIFIERS_PASSED_KEY], jnp.float32)
    gained = jnp.where(last, passed[:, None], 0.0)
  total = None
  if normalize or success_bonus:
    total = trajectory.require(traj.sub_outcomes, extra_keys.VERIFIERS_TOTAL_KEY, where="sub_outcomes",
                          method="verifier_count_reward (T1)",
                          meaning="[B] number of verifiers, to normalize or detect all passing")
    total = total.astype(jnp.float32)
  reward = gained / jnp.maximum(total, 1.0)[:, None] if normalize else gained
  if success_bonus:
    reward = reward + jnp.where(last & (passed >= total)[:, None], success_bonus, 0.0)
  return trajectory.with_turn_rewards(traj, reward)
