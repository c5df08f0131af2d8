"""Mixture-of-experts SwiGLU feed-forward with top-k routing, and routing replay (R3).

Router: logits z = x·W_r over E experts; the top-k experts by logit are selected and their gates
are softmax(z over the selected k) (top-k-then-softmax). Routing replay (docs/methods.md#t1, R3):
given the expert indices the sampler recorded for each token, the selection is forced to them
and the gates are recomputed from the current logits over exactly those k; gradients reach the
router through the gate values, never through the (discrete) selection.

Every expert runs on every token and the outputs are combined with the (mostly zero) gate
weights: exact and simple, at E/k times the FLOPs of a dispatching implementation. That suits
the small models trained here; a token-dispatch kernel would replace `_expert_outputs` alone.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

EXPERT, EMBED, MLP = "expert", "embed", "mlp"  # the logical names of models/transformer.py


def route(logits: jax.Array, k: int, replay: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """Expert indices [..., k] and their gates [..., k] from router logits [..., E].

  With `replay`, the indices are the replayed ones and only the gates are recomputed.
  """
  if replay is None:
    _, experts = jax.lax.top_k(logits, k)
  else:
    experts = replay.astype(jnp.int32)
  gates = jax.nn.softmax(jnp.take_along_axis(logits, experts, axis=-1), axis=-1)
  return experts.astype(jnp.int32), gates


def combine_weights(experts: jax.Array, gates: jax.Array, num_experts: int) -> jax.Array:
  """[..., E] weight of each expert for each token (the gate where selected, else 0)."""
  return jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=gates.dtype) * gates[..., None], axis=-2)


class MoEFeedForward(nnx.Module):
  """E SwiGLU experts [E, D, H] / [E, H, D] behind a linear router [D, E]."""

  def __init__(self, config, rngs: nnx.Rngs):
    e, d, h = config.num_experts, config.d_model, config.hidden_dim
    self.k = config.experts_per_token
    self.num_experts = e

    def param(std, shape, axes):
      return nnx.Param(nnx.initializers.normal(std)(rngs.params(), shape, jnp.float32),
                       logical_axes=axes)

    self.router = param(1.0 / math.sqrt(d), (d, e), (EMBED, EXPERT))
    self.w_gate = param(1.0 / math.sqrt(d), (e, d, h), (EXPERT, EMBED, MLP))
    self.w_up = param(1.0 / math.sqrt(d), (e, d, h), (EXPERT, EMBED, MLP))
    self.w_down = param(1.0 / math.sqrt(h), (e, h, d), (EXPERT, MLP, EMBED))

  def _expert_outputs(self, x):
    gated = jax.nn.silu(jnp.einsum("btd,edh->bteh", x, self.w_gate[...]))
    gated = gated * jnp.einsum("btd,edh->bteh", x, self.w_up[...])
    return jnp.einsum("bteh,ehd->bted", gated, self.w_down[...])

  def __call__(self, x: jax.Array, replay: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """[B, T, D] -> ([B, T, D] output, [B, T, k] int32 expert indices used)."""
    logits = (x @ self.router[...]).astype(jnp.float32)
    experts, gates = route(logits, self.k, replay)
    weights = combine_weights(experts, gates, self.num_experts).astype(x.dtype)
    return jnp.einsum("bte,bted->btd", weights, self._expert_outputs(x)), experts
