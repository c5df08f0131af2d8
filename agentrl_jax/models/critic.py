"""Critics: a separate value model, one initialised from the policy, or a head on the policy trunk.

* Separate: `transformer.create(dataclasses.replace(policy_config, head="value"), seed)`.
* From the policy (docs/methods.md#t1 warm start): `critic_from_policy` copies the policy's trunk
  (embeddings, blocks, final norm) into a value model with a fresh, zero value head, so the
  critic starts from what the (SFT'd) policy has learned and predicts 0 everywhere.
* Shared trunk: `value_head_params` is one [D] vector read on top of the policy's features
  (`shared_trunk_values`); `detach_trunk` keeps the value loss from moving the policy.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax.models import transformer


def critic_config(policy: transformer.TransformerConfig) -> transformer.TransformerConfig:
  """The policy's architecture with a value head (one scalar per token)."""
  return dataclasses.replace(policy, head="value", tie_embeddings=True)


def critic_from_policy(policy: transformer.TransformerConfig, policy_params: nnx.State
                       ) -> tuple[nnx.GraphDef, nnx.State]:
  """A value model holding a copy of the policy's trunk and a zero value head."""
  config = critic_config(policy)
  graphdef, params = transformer.create(config, seed=0)
  source = {path: var for path, var in jax.tree_util.tree_leaves_with_path(
      policy_params, is_leaf=lambda x: isinstance(x, nnx.Variable))}

  def take(path, var):
    if path in source:
      return var.replace(value=jnp.array(source[path][...], copy=True))
    return var  # the value head: zeros from its initializer

  params = jax.tree_util.tree_map_with_path(take, params,
                                            is_leaf=lambda x: isinstance(x, nnx.Variable))
  return graphdef, params


def value_head_params(policy: transformer.TransformerConfig) -> jax.Array:
  """A fresh [D] value head for the shared-trunk critic (zeros: the first values are 0)."""
  return jnp.zeros((policy.d_model,), jnp.float32)


def shared_trunk_values(graphdef: nnx.GraphDef, policy_params: nnx.State, head: jax.Array,
                        tokens: jax.Array, pos: transformer.Positions,
                        detach_trunk: bool = True) -> jax.Array:
  """Values [B, T] = policy features · head."""
  if detach_trunk:
    policy_params = jax.lax.stop_gradient(policy_params)
  features, _ = nnx.merge(graphdef, policy_params).features(tokens, pos)
  return features @ head
