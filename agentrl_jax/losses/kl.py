"""Per-token KL estimators between the policy and a reference (verl `kl_penalty`).

Aggregate the result with `losses.policy.aggregate` for a KL loss, or subtract `β·kl` from the
token rewards for KL in the reward. See J. Schulman, "Approximating KL Divergence" (2020).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

Array = jax.Array

KL_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k3+", "low_var_kl+")

_LOG_RATIO_BOUND = 20.0
_K3_BOUND = 10.0


def _k3(log_ratio: Array) -> Array:
  # log_ratio = logp − ref_logp; k3 uses −log_ratio = log(π_ref/π), clamped before exp.
  neg = jnp.clip(-log_ratio, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
  return jnp.clip(jnp.exp(neg) - neg - 1.0, -_K3_BOUND, _K3_BOUND)


def kl_penalty(logp: Array, ref_logp: Array, kind: str = "low_var_kl") -> Array:
  """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens' log-probs.

  With `x = logp − ref_logp` (samples from π):

      k1 (kl)            = x
      abs                = |x|
      k2 (mse)           = ½ x²
      k3 (low_var_kl)    = clip(exp(−x') + x' − 1, −10, 10),   −x' = clip(−x, −20, 20)
      k3+ (low_var_kl+)  = value of k3, gradient of k2 (straight-through)

  k3 is non-negative and zero iff `logp = ref_logp`.

  Args:
    logp: `[..., L]` log-probs under the policy (differentiated).
    ref_logp: same shape, under the reference policy (a constant).
    kind: one of `KL_KINDS`.

  Returns:
    Per-token KL estimates, same shape, float32 or wider. Not masked; aggregate with a mask.
  """
  chex.assert_equal_shape([logp, ref_logp])
  chex.assert_type([logp, ref_logp], float)
  dtype = jnp.promote_types(logp.dtype, jnp.float32)
  x = logp.astype(dtype) - jax.lax.stop_gradient(ref_logp.astype(dtype))
  if kind in ("k1", "kl"):
    return x
  if kind == "abs":
    return jnp.abs(x)
  if kind in ("k2", "mse"):
    return 0.5 * jnp.square(x)
  if kind in ("k3", "low_var_kl"):
    return _k3(x)
  if kind in ("k3+", "low_var_kl+"):
    k2 = 0.5 * jnp.square(x)
    return k2 + jax.lax.stop_gradient(_k3(x) - k2)
  raise ValueError(f"unknown KL estimator {kind!r}; known: {', '.join(KL_KINDS)}")


def kl_penalized_rewards(token_rewards: Array, logp: Array, ref_logp: Array, mask: Array,
                         beta: float, kind: str = "k1") -> Array:
  """KL in the reward: `r_t ← r_t − β·kl_t` on the action tokens, for token-level GAE.

  In verl the log-probs are the rollout policy's (`old_logp`), so no gradient flows here.

  Args:
    token_rewards: `[B, L]` float rewards, e.g. from `advantages.gae.token_rewards`.
    logp: `[B, L]` behaviour-policy log-probs of the sampled tokens.
    ref_logp: `[B, L]` reference-policy log-probs.
    mask: `[B, L]` action mask; other tokens keep their reward.
    beta: β ≥ 0.
    kind: KL estimator, see `kl_penalty` (verl's default for the reward is k1).

  Returns:
    `[B, L]` float32 (or wider) rewards.
  """
  chex.assert_equal_shape([token_rewards, logp, ref_logp, mask])
  penalty = jax.lax.stop_gradient(kl_penalty(logp, ref_logp, kind))
  rewards = token_rewards.astype(jnp.promote_types(token_rewards.dtype, jnp.float32))
  return jnp.where(jnp.asarray(mask).astype(bool), rewards - beta * penalty, rewards)
