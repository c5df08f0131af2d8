"""A low-precision matmul whose backward stays in low precision: bf16 products, f32 sums.

`x [N, K] @ w [K, M]` with x in the compute dtype (bfloat16) and w a float32 parameter: the
forward casts w to x's dtype and accumulates in float32. JAX's own transpose of that dot feeds
the float32 cotangent to both gradient dots, so they run with one float32 operand, i.e. at the
float32 rate (on XLA:CPU with AMX a [3072, 576] @ [576, 1536] runs at about 300 GFLOP/s with
bfloat16 operands and float32 accumulation against 75-85 with float32 ones; the mixed pair is
the latter). Here the cotangent of a bfloat16 output is bfloat16 already (the output was rounded
to it), so both gradient dots take bfloat16 operands and accumulate in float32, which is the same
arithmetic in another order: every product of two bfloat16 values is exact in float32. The weight
gradient is returned in float32 (JAX's transpose rounds it to bfloat16 on the way back through
the cast). An output requested in float32 (the LM head's logits) has a float32 cotangent, and its
gradients are JAX's own.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _forward(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
  return jnp.matmul(x, w.astype(x.dtype), preferred_element_type=jnp.float32).astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def mixed_matmul(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
  """x [N, K] (compute dtype) @ w [K, M] (any float dtype) -> [N, M] in `out_dtype`."""
  return _forward(x, w, out_dtype)


def _fwd(x, w, out_dtype):
  return _forward(x, w, out_dtype), (x, w)


def transposed(a: jax.Array) -> jax.Array:
  """a.T as an array of its own on CPU, where XLA would otherwise fold the transpose into the
  dot and run the dot on its float32 path (measured 3x slower); a plain `.T` elsewhere.

  The flattening forces the transposed bytes to be written out, and the barrier keeps XLA from
  folding the copy back into the dot. An array typed with an explicitly sharded axis cannot be
  flattened without naming the result's sharding; it gets the plain `.T`.
  """
  spec = getattr(jax.typeof(a).sharding, "spec", ())
  if jax.default_backend() != "cpu" or any(axis is not None for axis in spec):
    return a.T
  return jax.lax.optimization_barrier(a.T.reshape(-1)).reshape(a.shape[::-1])


def _bwd(out_dtype, residuals, g):
  x, w = residuals
  if g.dtype != x.dtype:  # a float32 output: its cotangent carries float32 detail; JAX's own
    return jax.vjp(lambda a, b: _forward(a, b, out_dtype), x, w)[1](g)
  dx = jnp.matmul(g, transposed(w.astype(x.dtype)), preferred_element_type=jnp.float32)
  dw = jnp.matmul(transposed(x), g, preferred_element_type=jnp.float32)
  return dx.astype(x.dtype), dw.astype(w.dtype)


mixed_matmul.defvjp(_fwd, _bwd)
