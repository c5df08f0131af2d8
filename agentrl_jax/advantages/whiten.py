"""Masked moments and whitening (docs/methods.md#ppo-gae, verl `masked_whiten`).

The `gae` estimator whitens its advantages with `masked_whiten` (verl's convention, switched by
its `whiten` argument); the group-normalised estimators need no whitening.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

Array = jax.Array


def _float(x: Array) -> Array:
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def masked_mean(x: Array, mask: Array, axis: int | tuple[int, ...] | None = None) -> Array:
  """Mean of `x` over the entries where `mask` is 1: `Σ x·m / Σ m` (0 when `Σ m = 0`).

  Args:
    x: float array.
    mask: bool or 0/1 array of the same shape.
    axis: axes to reduce; all by default.

  Returns:
    The masked mean, float32 or wider, reduced over `axis`.
  """
  chex.assert_equal_shape([x, mask])
  x = _float(x)
  mask = jnp.asarray(mask).astype(x.dtype)
  count = jnp.sum(mask, axis=axis)
  total = jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)
  return total / jnp.maximum(count, 1e-30)


def masked_variance(x: Array, mask: Array, unbiased: bool = True) -> Array:
  """Variance of `x` over the entries where `mask` is 1, over all axes.

  `Σ m·(x − μ)² / (n − 1)` with `n = Σ m` when `unbiased` (else `/ n`). With `n ≤ 1` the unbiased
  variance is undefined; we return `Σ m·(x − μ)² / max(n − 1, 1)` (i.e. 0) instead of NaN.
  """
  chex.assert_equal_shape([x, mask])
  x = _float(x)
  mask = jnp.asarray(mask).astype(x.dtype)
  mean = masked_mean(x, mask)
  count = jnp.sum(mask)
  squares = jnp.sum(jnp.where(mask > 0, mask * (x - mean) ** 2, 0.0))
  denominator = jnp.maximum(count - 1.0, 1.0) if unbiased else jnp.maximum(count, 1e-30)
  return squares / denominator


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
  """Whitens `x` with its masked mean and unbiased masked variance.

      μ = masked_mean(x),  σ² = masked_variance(x, unbiased=True)
      out = (x − μ) / sqrt(σ² + eps)          (shift_mean=True)
      out = (x − μ) / sqrt(σ² + eps) + μ      (shift_mean=False: scale only)

  Entries with `mask = 0` come back as 0 (verl leaves them as computed).

  Args:
    x: float array, e.g. advantages `[B, L]`.
    mask: bool or 0/1 array of the same shape.
    shift_mean: whether the output keeps mean 0 (True) or `x`'s mean (False).
    eps: added to the variance (1e-8 as in verl).

  Returns:
    The whitened array, float32 or wider.
  """
  chex.assert_equal_shape([x, mask])
  x = _float(x)
  mean = masked_mean(x, mask)
  variance = masked_variance(x, mask, unbiased=True)
  out = (x - mean) * jax.lax.rsqrt(variance + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(jnp.asarray(mask).astype(bool), out, 0.0)
