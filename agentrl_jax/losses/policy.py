"""PPO clipped surrogate, loss aggregation and masked entropy (docs/methods.md#ppo-loss).

Token-level inputs are `[B, L]`; `mask` is the action mask (1 on policy tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

AGGREGATION_MODES = (
    "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# Log-ratios are clamped before exp so a stale or corrupted log-prob cannot overflow (verl).
_LOG_RATIO_BOUND = 20.0


class PolicyLossOutput(NamedTuple):
  """Scalar loss and diagnostics.

  Attributes:
    loss: the aggregated clipped surrogate (to minimise).
    clip_fraction: token-mean fraction of tokens where the ratio clip is active.
    approx_kl: token-mean of `old_logp − logp` (k1 estimate of KL(old ‖ new)).
  """

  loss: Array
  clip_fraction: Array
  approx_kl: Array


def aggregate(values: Array, mask: Array, mode: str = "token-mean",
              max_len: int | None = None) -> Array:
  """Reduces `[B, L]` per-token values to a scalar over the masked tokens (verl `agg_loss`).

  * `token-mean`: `Σ_b Σ_t v·m / Σ_b Σ_t m` over the whole batch (0 if no token is masked).
  * `seq-mean-token-sum`: `(1/B) Σ_b Σ_t v·m`, mean over all B sequences of the per-sequence sum.
  * `seq-mean-token-mean`: mean over non-empty sequences of `Σ_t v·m / Σ_t m`.
  * `seq-mean-token-sum-norm`: `Σ_b Σ_t v·m / L_max` with a constant `L_max` (Dr.GRPO). Pass the
    configured maximum length as `max_len`; without it `L` (the padded length) is used, which is
    constant only within one bucket.

  Args:
    values: `[B, L]` per-token values (e.g. losses).
    mask: `[B, L]` bool or 0/1 mask.
    mode: one of `AGGREGATION_MODES`.
    max_len: `L_max` for `seq-mean-token-sum-norm`; ignored by the other modes.

  Returns:
    A float32 scalar.
  """
  chex.assert_rank([values, mask], 2)
  chex.assert_equal_shape([values, mask])
  values = values.astype(jnp.promote_types(values.dtype, jnp.float32))
  mask = jnp.asarray(mask).astype(values.dtype)
  masked = jnp.where(mask > 0, values * mask, 0.0)
  if mode == "token-mean":
    return jnp.sum(masked) / jnp.maximum(jnp.sum(mask), 1.0)
  if mode == "seq-mean-token-sum":
    return jnp.mean(jnp.sum(masked, axis=-1))
  if mode == "seq-mean-token-mean":
    tokens = jnp.sum(mask, axis=-1)
    nonempty = tokens > 0
    per_sequence = jnp.sum(masked, axis=-1) / jnp.maximum(tokens, 1.0)
    return jnp.sum(jnp.where(nonempty, per_sequence, 0.0)) / jnp.maximum(jnp.sum(nonempty), 1)
  if mode == "seq-mean-token-sum-norm":
    norm = values.shape[-1] if max_len is None else max_len
    return jnp.sum(masked) / norm
  raise ValueError(f"unknown aggregation mode {mode!r}; known: {', '.join(AGGREGATION_MODES)}")


def clipped_surrogate_loss(
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg_mode: str = "token-mean",
    max_len: int | None = None,
    is_weights: Array | None = None,
    ratio_level: str = "token",
) -> PolicyLossOutput:
  """PPO clipped surrogate with asymmetric clipping and dual clip (Schulman et al. 2017; Ye et al. 2020).

      Δ_t = clip(logp_t − old_logp_t, −20, 20),   ρ_t = exp(Δ_t)
      ℓ_t = max(−A_t ρ_t, −A_t clip(ρ_t, 1 − ε_low, 1 + ε_high))
      ℓ_t ← min(ℓ_t, −A_t c)   where A_t < 0                        (dual clip, c > 1)
      ℓ_t ← ℓ_t · w_t                                               (truncated IS weights, optional)
      loss = aggregate(ℓ, mask, agg_mode)

  Args:
    logp: `[B, L]` log-probs of the sampled tokens under the current policy (differentiated).
    old_logp: `[B, L]` log-probs under the behaviour policy (treated as constants).
    advantages: `[B, L]` token advantages (treated as constants).
    mask: `[B, L]` action mask.
    clip_low: ε_low.
    clip_high: ε_high (StarPO-S/DAPO use 0.28).
    dual_clip: c > 1, or None to disable the dual clip.
    agg_mode: see `aggregate`.
    max_len: `L_max` for `seq-mean-token-sum-norm`.
    is_weights: optional `[B, L]` per-token weights, e.g. `min(exp(old_logp − rollout_logp), cap)`
      for rollout/train mismatch; no gradient flows through them.
    ratio_level: 'token' (PPO), or 'sequence' (GSPO, and RTPO's turn-level ratio): every token of
      a row shares `Δ_b = mean_t Δ_t` over the row's masked tokens, so the row is clipped as one.

  Returns:
    `PolicyLossOutput(loss, clip_fraction, approx_kl)`.
  """
  chex.assert_rank([logp, old_logp, advantages, mask], 2)
  chex.assert_equal_shape([logp, old_logp, advantages, mask])
  chex.assert_type([logp, old_logp, advantages], float)
  if isinstance(dual_clip, (int, float)) and dual_clip <= 1.0:
    raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip!r}")
  dtype = jnp.promote_types(logp.dtype, jnp.float32)
  logp = logp.astype(dtype)
  old_logp = jax.lax.stop_gradient(old_logp.astype(dtype))
  advantages = jax.lax.stop_gradient(advantages.astype(dtype))
  if ratio_level not in ("token", "sequence"):
    raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
  if ratio_level == "sequence":
    weights = mask.astype(dtype)
    row = jnp.sum(log_ratio * weights, axis=1, keepdims=True) / jnp.maximum(
        jnp.sum(weights, axis=1, keepdims=True), 1.0)
    log_ratio = jnp.broadcast_to(row, log_ratio.shape)
  ratio = jnp.exp(log_ratio)
  unclipped = -advantages * ratio
  clipped = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  losses = jnp.maximum(unclipped, clipped)
  if dual_clip is not None:
    losses = jnp.where(advantages < 0, jnp.minimum(losses, -advantages * dual_clip), losses)
  if is_weights is not None:
    chex.assert_equal_shape([logp, is_weights])
    losses = losses * jax.lax.stop_gradient(is_weights.astype(dtype))
  loss = aggregate(losses, mask, agg_mode, max_len)
  clip_fraction = aggregate((clipped > unclipped).astype(dtype), mask, "token-mean")
  approx_kl = aggregate(-log_ratio, mask, "token-mean")
  return PolicyLossOutput(
      loss=loss,
      clip_fraction=jax.lax.stop_gradient(clip_fraction),
      approx_kl=jax.lax.stop_gradient(approx_kl))


def masked_entropy(logits: Array, mask: Array) -> Array:
  """Per-token entropy of the softmax over the vocabulary, zero where `mask` is 0.

      H_t = logsumexp(z_t) − Σ_v softmax(z_t)_v · z_{t,v}

  Args:
    logits: `[B, L, V]` float logits (computed in float32).
    mask: `[B, L]` mask.

  Returns:
    `[B, L]` float32 entropies.
  """
  chex.assert_rank([logits, mask], [3, 2])
  chex.assert_equal_shape_prefix([logits, mask], 2)
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)
  probs = jax.nn.softmax(logits, axis=-1)
  # Banned tokens (logit −inf) have probability 0 and contribute 0, not 0·(−inf) = NaN.
  finite_logits = jnp.where(jnp.isfinite(logits), logits, 0.0)
  entropy = log_normalizer - jnp.sum(probs * finite_logits, axis=-1)
  return jnp.where(jnp.asarray(mask).astype(bool), entropy, 0.0)


def turn_mean_log_ratio(logp: Array, old_logp: Array, turn_of_token: Array, mask: Array,
                        num_turns: int) -> Array:
  """Action-level (GSPO-style) log-ratio: every token gets the mean log-ratio of its turn.

      log r_{b,k} = (1/|a_{b,k}|) Σ_{t ∈ a_{b,k}} (logp_t − old_logp_t)

  Gradients flow to every token of the turn through the mean. To train with one ratio per turn
  (GAGPO), pass `old_logp + turn_mean_log_ratio(...)` as `logp` to `clipped_surrogate_loss`.

  Args:
    logp: `[B, L]` current log-probs.
    old_logp: `[B, L]` behaviour log-probs (constants).
    turn_of_token: `[B, L]` int turn index, −1 on padding.
    mask: `[B, L]` action mask.
    num_turns: static N.

  Returns:
    `[B, L]` per-token log-ratio, zero outside `mask`.
  """
  chex.assert_rank([logp, old_logp, turn_of_token, mask], 2)
  chex.assert_equal_shape([logp, old_logp, turn_of_token, mask])
  dtype = jnp.promote_types(logp.dtype, jnp.float32)
  mask = jnp.asarray(mask).astype(bool) & (turn_of_token >= 0)
  log_ratio = jnp.where(mask, logp.astype(dtype) - jax.lax.stop_gradient(old_logp.astype(dtype)),
                        0.0)
  ids = jnp.where(mask, turn_of_token, num_turns)  # num_turns: dropped by segment_sum

  def per_row(x, row_ids, row_mask):
    total = jax.ops.segment_sum(x, row_ids, num_segments=num_turns)
    count = jax.ops.segment_sum(row_mask.astype(dtype), row_ids, num_segments=num_turns)
    mean = total / jnp.maximum(count, 1.0)
    return mean[jnp.clip(row_ids, 0, num_turns - 1)]

  return jnp.where(mask, jax.vmap(per_row)(log_ratio, ids, mask), 0.0)
