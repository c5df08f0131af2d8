"""The policy's action distribution and the positions it is scored at, shared by sampler and learner.

One definition on both sides is what keeps the learner's log-probs those of the sampled tokens
(TITO): the same vocabulary restriction and temperature (`policy_log_probs`), the same action
positions (`action_view`), and the same context floors (`trajectory_positions`).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.models import transformer


def vocabulary_mask(vocab_size: int, allowed_token_ids: tuple[int, ...] | None) -> jax.Array | None:
  """[V] bool mask of samplable tokens, or None when every token is allowed."""
  if allowed_token_ids is None:
    return None
  bad = [t for t in allowed_token_ids if not 0 <= t < vocab_size]
  if bad:
    raise ValueError(f"allowed_token_ids {bad} are outside the vocabulary [0, {vocab_size})")
  return jnp.zeros((vocab_size,), bool).at[jnp.asarray(allowed_token_ids)].set(True)


def policy_log_probs(logits: jax.Array, allowed: jax.Array | None, temperature: float = 1.0) -> jax.Array:
  """Log-probabilities of the policy's action distribution [..., V].

  The single definition of the policy shared by the sampler and the learner (TITO): the same
  vocabulary restriction and temperature on both sides.
  """
  logits = logits.astype(jnp.float32)
  if temperature > 0:
    logits = logits / temperature
  if allowed is not None:
    logits = jnp.where(allowed, logits, -1e30)
  return jax.nn.log_softmax(logits, axis=-1)


def token_log_probs(logits: jax.Array, tokens: jax.Array, allowed: jax.Array | None,
                    temperature: float) -> tuple[jax.Array, jax.Array]:
  """Log-prob [B, L] of each token under the policy, and the policy's entropy there.

  The logits at position t−1 predict token t; position 0 gets 0 (it is never an action token,
  since every conversation opens with an observation).
  """
  logp_all = policy_log_probs(logits[:, :-1], allowed, temperature)
  logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp_all) * jnp.where(jnp.isfinite(logp_all), logp_all, 0.0), axis=-1)
  pad = jnp.zeros((tokens.shape[0], 1), jnp.float32)
  return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, entropy], axis=1)


class ActionView(NamedTuple):
  """The first K action tokens of each row: their token index [B, K] and whether they exist."""

  index: jax.Array
  valid: jax.Array

  def gather(self, x: jax.Array) -> jax.Array:
    """[B, L] token-level array -> [B, K] values at the action tokens (0 where none)."""
    return jnp.where(self.valid, jnp.take_along_axis(x, self.index, axis=1), 0).astype(x.dtype)


def action_view(action_mask: jax.Array, max_actions: int) -> ActionView:
  """Locates the action tokens; `max_actions` must bound the action tokens of any row.

  Loss terms live on action tokens only, so the learner evaluates the LM head (the costliest
  part of a small model: V columns per position) at these K positions instead of all L.
  """
  k = min(max_actions, action_mask.shape[1])
  order = jnp.argsort(~action_mask, axis=1, stable=True)[:, :k].astype(jnp.int32)
  return ActionView(index=order, valid=jnp.take_along_axis(action_mask, order, axis=1))


def action_log_probs(graphdef: nnx.GraphDef, params, tokens, positions, view: ActionView,
                     allowed: jax.Array | None, temperature: float,
                     routing: jax.Array | None = None,
                     head_chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
  """Log-prob and policy entropy [B, K] at the action tokens of `view`.

  The hidden state at position t−1 predicts token t, so the head reads the row before each action.
  `routing` [B, L, layers, k] replays a mixture-of-experts policy's recorded expert choices.
  `head_chunk` evaluates the head `head_chunk` action positions at a time (`chunked_head_terms`).
  """
  model = nnx.merge(graphdef, params)
  features, _ = model.features(tokens, positions, routing=routing)
  prev = jnp.maximum(view.index - 1, 0)
  hidden = jnp.take_along_axis(features, prev[..., None], axis=1)
  picked = jnp.take_along_axis(tokens, view.index, axis=1)
  terms = lambda h, t: head_terms(model.head_out(h), t, allowed, temperature)
  if head_chunk is None or head_chunk >= hidden.shape[1]:
    logp, entropy = terms(hidden, picked)
  else:
    logp, entropy = chunked_head_terms(terms, hidden, picked, head_chunk)
  return jnp.where(view.valid, logp, 0.0), jnp.where(view.valid, entropy, 0.0)


def head_terms(logits: jax.Array, picked: jax.Array, allowed: jax.Array | None,
               temperature: float) -> tuple[jax.Array, jax.Array]:
  """Log-prob of `picked` [...] and the policy's entropy under `logits` [..., V]."""
  logp_all = policy_log_probs(logits, allowed, temperature)
  logp = jnp.take_along_axis(logp_all, picked[..., None], axis=-1)[..., 0]
  return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


def chunked_head_terms(terms, hidden: jax.Array, picked: jax.Array,
                       chunk: int) -> tuple[jax.Array, jax.Array]:
  """`terms(hidden, picked)` over `chunk` positions of axis 1 at a time, each rematerialised.

  The full-vocabulary logits of every action position ([B, K, V]: 0.6 GB for 16 × 192 positions
  of a 49k vocabulary, and the backward holds more of that size) are the largest arrays of a
  small model's update; a sequential map under `jax.checkpoint` keeps one chunk's alive and
  recomputes it in the backward, for one more pass of the head.
  """
  b, k = picked.shape
  n = -(-k // chunk)
  pad = n * chunk - k
  hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
  picked = jnp.pad(picked, ((0, 0), (0, pad)))
  blocks = lambda x: jnp.moveaxis(x.reshape(b, n, chunk, *x.shape[2:]), 1, 0)
  logp, entropy = jax.lax.map(jax.checkpoint(lambda a: terms(*a)), (blocks(hidden), blocks(picked)))
  unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * chunk)[:, :k]
  return unblock(logp), unblock(entropy)


def floor_per_token(turn_of_token: jax.Array, context_floor: jax.Array) -> jax.Array:
  """[B, L] int32 context floor of every token, to pass as `transformer.Positions.floor`.

  floor[b, l] = context_floor[b, turn_of_token[b, l]]; padding (turn −1) gets 0.

  Args:
    turn_of_token: [B, L] int32 turn of each token, −1 for padding.
    context_floor: [B, N] per-turn floors as the rollout records them (`traj.extras
      ['context_floor']`, float32 token offsets).
  """
  chex.assert_rank([turn_of_token, context_floor], 2)
  safe = jnp.clip(turn_of_token, 0, context_floor.shape[1] - 1)
  floor = jnp.take_along_axis(jnp.asarray(context_floor), safe, axis=1)
  return jnp.where(turn_of_token >= 0, floor, 0).astype(jnp.int32)


def trajectory_positions(traj: types.Trajectories) -> transformer.Positions:
  """Positions for a full forward pass over a batch, with its context floors if it has them.

  What the learner passes to the policy (and critic) so it scores the tokens under the same
  attention masks the sampler used; batches without `extras['context_floor']` ('full') get no
  floor.
  """
  positions = transformer.positions_from_turns(traj.turn_of_token)
  if extra_keys.FLOOR_KEY in traj.extras:
    positions = positions.replace(floor=floor_per_token(traj.turn_of_token, traj.extras[extra_keys.FLOOR_KEY]))
  return positions
