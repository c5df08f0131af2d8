"""Supervised and distillation terms: DRIFT's importance-weighted SFT (docs/methods.md#drift) and
AHEAD's step-aware distillation advantage (docs/methods.md#ahead).

Token-level arguments may span the whole conversation `[B, L]` or only the action tokens
`[B, K]` (the learner's `ActionView`); masks say which entries are policy tokens.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from agentrl_jax.advantages import step as step_advantages

Array = Any


def discounted_turn_return(reward: Array, turn_mask: Array, gamma: float) -> Array:
  """`G_b = Σ_k γ^k · r_{b,k}` over existing turns (k from 0; DRIFT counts from 1, same value).

  The return-to-go of the first turn (`advantages.step.step_returns`).

  Args:
    reward: [B, N] turn rewards, turns [0, N).
    turn_mask: [B, N] which turns exist (a prefix of each row).
    gamma: turn discount in [0, 1].
  """
  chex.assert_rank([reward, turn_mask], 2)
  chex.assert_equal_shape([reward, turn_mask])
  returns = step_advantages.step_returns(jnp.asarray(reward, jnp.float32), turn_mask, gamma)
  return jnp.where(jnp.any(turn_mask, axis=1), returns[:, 0], 0.0)


def repetition_penalty(keys: Array, turn_mask: Array, coef: float) -> Array:
  """`P_b = λ·(1 − n_unique/n_turns)`, floored at 0, over the turns that exist.

  DRIFT counts distinct normalised answers; an agent's analogue is distinct observations
  (`obs_hash`): a policy that keeps bumping into the same state repeats itself.

  Args:
    keys: [B, N] int fingerprints of what each turn produced.
    turn_mask: [B, N] which turns exist.
    coef: λ_rep >= 0.
  """
  chex.assert_rank([keys, turn_mask], 2)
  n = keys.shape[1]
  same = (keys[:, :, None] == keys[:, None, :]) & turn_mask[:, None, :]
  earlier = jnp.tril(jnp.ones((n, n), bool), k=-1)[None]
  first = turn_mask & ~jnp.any(same & earlier, axis=2)
  n_turns = jnp.sum(turn_mask, axis=1)
  n_unique = jnp.sum(first, axis=1)
  ratio = jnp.where(n_turns > 0, n_unique / jnp.maximum(n_turns, 1), 1.0)
  return jnp.maximum(coef * (1.0 - ratio), 0.0)


class ImportanceWeights(NamedTuple):
  """Self-normalised weights `[B]`: `weights` average 1 within a group, `probs` sum to 1."""

  weights: Array
  probs: Array


def importance_weights(returns: Array, group_id: Array, num_groups: int, beta: float,
                       eps: float = 1e-12) -> ImportanceWeights:
  """DRIFT's self-normalised importance weights within each prompt group (docs/methods.md#drift).

    z_b = R_b/β,  w_b = exp(z_b − max_g z) / ((1/|g|) Σ_{j∈g} exp(z_j − max_g z) + ε),
    p_b = w_b/|g|  (so Σ_{b∈g} p_b = 1 up to ε).

  The optimum of KL-regularised RL is π_ref(τ)·exp(R(τ)/β)/Z, so `p` is the target distribution
  over a group's reference samples. Equal returns give uniform weights (w = 1, p = 1/|g|);
  β → ∞ gives plain SFT; β → 0 puts all mass on the best sample (shared among ties).

  Args:
    returns: [B] float returns R_b.
    group_id: [B] int in [0, num_groups).
    num_groups: static number of segments.
    beta: temperature β > 0.
    eps: the source's 1e-12 guard.
  """
  chex.assert_rank([returns, group_id], 1)
  chex.assert_equal_shape([returns, group_id])
  if not beta > 0:
    raise ValueError(f"importance_weights: beta must be > 0, got {beta}")
  z = returns.astype(jnp.float32) / beta
  z_max = jax.ops.segment_max(z, group_id, num_segments=num_groups)[group_id]
  e = jnp.exp(z - z_max)
  count = jax.ops.segment_sum(jnp.ones_like(e), group_id, num_segments=num_groups)[group_id]
  total = jax.ops.segment_sum(e, group_id, num_segments=num_groups)[group_id]
  weights = e / (total / count + eps)
  return ImportanceWeights(weights=weights, probs=weights / count)


def sequence_nll(logp: Array, mask: Array) -> Array:
  """Token-mean negative log-likelihood per row, `[B]` (0 for a row without tokens)."""
  chex.assert_equal_shape([logp, mask])
  mask = mask.astype(jnp.float32)
  return -jnp.sum(logp * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)


def weighted_sft_loss(logp: Array, mask: Array, weights: Array, *,
                      normalize_by_weight_sum: bool = False) -> Array:
  """DRIFT's loss: `mean_b(w_b·ℓ_b)`, or `Σ_b w_b ℓ_b / Σ_b w_b` (`BATCH_WEIGHT_NORMAL`).

  Args:
    logp: [B, T] log-probs of the demonstrated tokens (gradients flow through them).
    mask: [B, T] which tokens carry loss.
    weights: [B] importance weights (treated as constants).
    normalize_by_weight_sum: divide by the weight sum instead of B.
  """
  chex.assert_rank(weights, 1)
  weights = jax.lax.stop_gradient(weights.astype(jnp.float32))
  per_row = weights * sequence_nll(logp, mask)
  if normalize_by_weight_sum:
    return jnp.sum(per_row) / jnp.maximum(jnp.sum(weights), 1e-12)
  return jnp.mean(per_row)


def distillation_advantages(advantages: Array, teacher_logp: Array, student_logp: Array,
                            mask: Array, error_step: Array, *, coef: float = 0.1,
                            delta_max: float = 1.0, nu_err: float = 1.0, nu_rout: float = 0.5,
                            mode: str = "additive") -> Array:
  """AHEAD's step-aware distillation advantage (docs/methods.md#ahead), on policy tokens only.

    δ_t = logp_T(y_t | c^T) − sg(logp(y_t | c)),  δ̄_t = clip(δ_t, −δ_max, δ_max),
    ν_t = ν_err on error steps, ν_rout elsewhere,
    additive:         A'_t = A_t + λ·ν_t·δ̄_t
    sign_preserving:  A'_t = A_t·(1 + λ·ν_t·δ̄_t·sign(A_t))   (needs λ·max ν·δ_max < 1)

  The teacher is the same model reading privileged context (the next observation, and a hint on
  error steps); where it puts more mass on the sampled token than the student did, the token's
  advantage goes up. Outside `mask` the advantage is returned unchanged.

  Args:
    advantages: [B, T] advantages of the estimator (and earlier corrections).
    teacher_logp: [B, T] teacher log-probs of the sampled tokens.
    student_logp: [B, T] student log-probs of the same tokens (stop-gradient is applied).
    mask: [B, T] policy tokens.
    error_step: [B, T] bool, the token's step is an error step.
    coef, delta_max, nu_err, nu_rout: λ, δ_max, ν_err, ν_rout.
    mode: "additive" or "sign_preserving".
  """
  chex.assert_equal_shape([advantages, teacher_logp, student_logp, mask, error_step])
  if mode not in ("additive", "sign_preserving"):
    raise ValueError(f"distillation_advantages: mode must be 'additive' or 'sign_preserving', "
                     f"got {mode!r}")
  if delta_max <= 0 or coef < 0 or nu_err < 0 or nu_rout < 0:
    raise ValueError(f"distillation_advantages: need delta_max > 0 and coef, nu_err, nu_rout >= 0; "
                     f"got {delta_max}, {coef}, {nu_err}, {nu_rout}")
  if mode == "sign_preserving" and coef * max(nu_err, nu_rout) * delta_max >= 1:
    raise ValueError(f"distillation_advantages: sign_preserving needs coef*max(nu)*delta_max < 1, "
                     f"got {coef}*{max(nu_err, nu_rout)}*{delta_max}")
  delta = teacher_logp.astype(jnp.float32) - jax.lax.stop_gradient(student_logp.astype(jnp.float32))
  delta = jnp.clip(delta, -delta_max, delta_max)
  nu = jnp.where(error_step, nu_err, nu_rout)
  advantages = advantages.astype(jnp.float32)
  if mode == "additive":
    new = advantages + coef * nu * delta
  else:
    new = advantages * (1.0 + coef * nu * delta * jnp.sign(advantages))
  return jnp.where(mask, new, advantages)
