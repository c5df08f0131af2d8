"""A bfloat16 copy of the policy for sampling (`RolloutConfig.sampling_dtype = 'bfloat16'`).

Sampling a small batch is bound by reading the weights once per token: a decode step's matmuls
are [B, D] @ [D, N] with B of 8-64. Held in bfloat16 the weights are half the bytes; on 2 CPU
cores a [16, 576] @ [576, 1536] step and SmolLM2's [16, 576] @ [576, 49152] logits ran 2.2x and
2.9x faster that way (f32 accumulation), where casting f32 weights inside the step was slower
than f32 itself. So the copy is cast once per rollout, outside the sampler, and the sampler's
module computes in bfloat16 with bfloat16 weights, a bfloat16 KV cache and float32 logits.

The learner is unchanged: it recomputes the old log-probs from its float32 parameters, so the
gap to the sampler's shows up in `rollout/logprob_drift`, and `LossConfig.tis_cap` corrects
for it (truncated importance sampling) as for any sampler that is not exactly the policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models import transformer

# None: the sampler runs the policy's own parameters and module (exact: the learner recomputes
# the sampler's log-probs); 'bfloat16': a bfloat16 copy as above.
SAMPLING_DTYPES = (None, "bfloat16")


def check_sampling_dtype(dtype: str | None) -> None:
  if dtype not in SAMPLING_DTYPES:
    raise ValueError(f"RolloutConfig.sampling_dtype must be one of {SAMPLING_DTYPES}, "
                     f"got {dtype!r}")


def sampling_model(graphdef: nnx.GraphDef, model_config: transformer.TransformerConfig,
                   dtype: str | None) -> tuple[nnx.GraphDef, transformer.TransformerConfig]:
  """The module structure and config the sampler runs: the policy's own for None, else the same
  `Transformer` computing in `dtype`.

  Raises:
    ValueError: `graphdef` is not `Transformer(model_config)`'s (a wrapped or custom policy),
      whose low-precision twin this cannot build.
  """
  check_sampling_dtype(dtype)
  if dtype is None:
    return graphdef, model_config
  if graphdef != _abstract_graphdef(model_config):
    raise ValueError("RolloutConfig.sampling_dtype needs the policy to be a plain "
                     "transformer.Transformer of its TransformerConfig; this policy's module "
                     "differs, so leave sampling_dtype None")
  config = dataclasses.replace(model_config, dtype=dtype,
                               tie_embeddings=model_config.tie_embeddings and not _own_head())
  return _abstract_graphdef(config), config


def _own_head() -> bool:
  """Whether the copy stores a tied head as its own [D, V] weight (`sampling_params`): on CPU,
  where the tied form is slow; accelerators read the transposed table in place."""
  return jax.default_backend() == "cpu"


def _abstract_graphdef(config: transformer.TransformerConfig) -> nnx.GraphDef:
  abstract = nnx.eval_shape(lambda: transformer.Transformer(config, nnx.Rngs(params=0)))
  return nnx.split(abstract, nnx.Param)[0]


@jax.jit
def bfloat16_copy(params: Any) -> Any:
  """`params` with every floating-point leaf in bfloat16 (integer leaves as they are)."""
  return jax.tree.map(
      lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)


def sampling_params(params: Any, model_config: transformer.TransformerConfig) -> Any:
  """The bfloat16 copy `sampling_model`'s module reads: `bfloat16_copy(params)`, plus, for tied
  embeddings on CPU, the head written out as its own [D, V] weight (`embed` transposed once per
  rollout).

  The tied head computes h @ embedᵀ; XLA:CPU runs a bfloat16 dot with a transposed operand
  through float32 (the whole 49152 x 576 table converted, about 5x the plain [N, K] @ [K, M]
  on SmolLM2's decode step), so the copy stores the transpose instead.
  """
  copy = bfloat16_copy(params)
  if not (model_config.tie_embeddings and _own_head()):
    return copy
  head = _transposed(copy["embed"][...])
  return nnx.State({**copy, "lm_head": nnx.Param(head, logical_axes=(transformer.EMBED,
                                                                     transformer.VOCAB))})


@jax.jit
def _transposed(x: jax.Array) -> jax.Array:
  return x.T


def cache_dtype(dtype: str | None):
  """The KV cache's dtype for a sampler of `dtype` (float32 for the policy's own)."""
  return jnp.float32 if dtype is None else jnp.dtype(dtype)
