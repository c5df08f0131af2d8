"""Clipped value loss for the critic (docs/methods.md#ppo-gae, verl `compute_value_loss`)."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from agentrl_jax.losses import policy

Array = jax.Array


class ValueLossOutput(NamedTuple):
  """Attributes: loss (scalar), clip_fraction (token-mean share where the clipped term wins)."""

  loss: Array
  clip_fraction: Array


def clipped_value_loss(
    values: Array,
    old_values: Array,
    returns: Array,
    mask: Array,
    clip_eps: float = 0.5,
    agg_mode: str = "token-mean",
    max_len: int | None = None,
) -> ValueLossOutput:
  """PPO value loss with the value-clipping trick.

      V_clip = clip(V_new, V_old − ε_v, V_old + ε_v)
      L_V = ½ · agg( max((V_new − ret)², (V_clip − ret)²) )

  Args:
    values: `[B, L]` current critic outputs `V_new` (differentiated).
    old_values: `[B, L]` critic outputs at rollout time `V_old` (constants).
    returns: `[B, L]` value targets (e.g. `GAEOutput.returns`; constants).
    mask: `[B, L]` mask of the tokens that carry value loss (the action mask).
    clip_eps: ε_v (0.5 in verl).
    agg_mode: see `policy.aggregate`.
    max_len: `L_max` for `seq-mean-token-sum-norm`.

  Returns:
    `ValueLossOutput(loss, clip_fraction)`.
  """
  chex.assert_rank([values, old_values, returns, mask], 2)
  chex.assert_equal_shape([values, old_values, returns, mask])
  chex.assert_type([values, old_values, returns], float)
  dtype = jnp.promote_types(values.dtype, jnp.float32)
  values = values.astype(dtype)
  old_values = jax.lax.stop_gradient(old_values.astype(dtype))
  returns = jax.lax.stop_gradient(returns.astype(dtype))
  clipped_values = jnp.clip(values, old_values - clip_eps, old_values + clip_eps)
  unclipped_error = jnp.square(values - returns)
  clipped_error = jnp.square(clipped_values - returns)
  worst = jnp.maximum(unclipped_error, clipped_error)
  loss = 0.5 * policy.aggregate(worst, mask, agg_mode, max_len)
  clip_fraction = policy.aggregate(
      (clipped_error > unclipped_error).astype(dtype), mask, "token-mean")
  return ValueLossOutput(loss=loss, clip_fraction=jax.lax.stop_gradient(clip_fraction))
