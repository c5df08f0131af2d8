"""Turn- and span-level views of a batch that reward shapers, estimators and corrections share.

They sit at the bottom of the flow, beside `types`, so that `rewards/`, `advantages/` and
`credit/` can all use them without importing one another.

Token layout (see `types`): turn k's action occupies the half-open token range
`[turn_start[b, k], turn_end[b, k])`, marked by `action_mask`; `turn_of_token` is −1 on padding.
Everything here is a pure function of arrays and runs under `jax.jit`.
"""

from __future__ import annotations

from typing import Any, Mapping

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types

Array = jax.Array


# Odd 32-bit constants of a multiplicative mixer; any odd constants with good avalanche would do.
_MIX_A = 0x9E3779B1
_MIX_B = 0x85EBCA77
_MIX_C = 0xC2B2AE3D


def require(mapping: Mapping[str, Any], key: str, *, where: str, method: str, meaning: str) -> Array:
  """Returns `mapping[key]` as a jax array, or raises a ValueError naming the missing key.

  Args:
    mapping: `traj.extras` or `traj.sub_outcomes`.
    key: the name the method documents.
    where: "extras" or "sub_outcomes", for the message.
    method: the method's name, for the message.
    meaning: what the array is, with its shape, for the message.
  """
  if key not in mapping:
    have = ", ".join(sorted(mapping)) or "nothing"
    raise ValueError(f"{method} needs traj.{where}[{key!r}] ({meaning}); traj.{where} has: {have}")
  return jnp.asarray(mapping[key])


def turn_one_hot(traj: types.Trajectories) -> Array:
  """`[B, L, N]` bool: token l is an action token of turn k."""
  n = traj.turn_mask.shape[1]
  turn = jnp.asarray(traj.turn_of_token)
  onehot = turn[:, :, None] == jnp.arange(n)[None, None, :]
  return onehot & jnp.asarray(traj.action_mask, bool)[:, :, None]


def tokens_per_turn(traj: types.Trajectories) -> Array:
  """`[B, N]` float32 number of action tokens in each turn (`ntok` of
  docs/methods.md#conventions)."""
  return jnp.sum(turn_one_hot(traj), axis=1).astype(jnp.float32)


def turn_mean(token_values: Array, traj: types.Trajectories) -> Array:
  """`[B, N]` mean of a token quantity over each turn's action tokens (0 for empty turns)."""
  onehot = turn_one_hot(traj).astype(jnp.float32)
  total = jnp.einsum("bl,bln->bn", token_values.astype(jnp.float32), onehot)
  count = jnp.sum(onehot, axis=1)
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)


def to_tokens(turn_values: Array, traj: types.Trajectories) -> Array:
  """Broadcasts a `[B, N]` quantity to the action tokens `[B, L]` (zero elsewhere)."""
  return types.broadcast_turns_to_tokens(
      turn_values, jnp.asarray(traj.turn_of_token), jnp.asarray(traj.action_mask, bool))


def action_fingerprints(traj: types.Trajectories) -> Array:
  """`[B, N]` uint32 fingerprint of each turn's action token ids (equal actions ⇒ equal value).

  Each token contributes a mixed hash of (token id, offset inside the action); the contributions
  are summed modulo 2³², so equal id sequences give equal fingerprints and a different order or
  length almost surely a different one. Turns without action tokens get 0.
  """
  tokens = jnp.asarray(traj.tokens).astype(jnp.uint32)
  turn = jnp.clip(jnp.asarray(traj.turn_of_token), 0, traj.turn_mask.shape[1] - 1)
  start = jnp.take_along_axis(jnp.asarray(traj.turn_start), turn, axis=1)
  offset = (jnp.arange(tokens.shape[1])[None, :] - start).astype(jnp.uint32)
  mixed = (tokens + jnp.uint32(1)) * jnp.uint32(_MIX_A) + offset * jnp.uint32(_MIX_B)
  mixed = (mixed ^ (mixed >> 15)) * jnp.uint32(_MIX_C)
  mixed = mixed ^ (mixed >> 13)
  onehot = turn_one_hot(traj)
  return jnp.sum(jnp.where(onehot, mixed[:, :, None], jnp.uint32(0)), axis=1, dtype=jnp.uint32)


def earlier_turn_matrix(turn_mask: Array) -> Array:
  """`[B, N, N]` bool: `[b, k, j]` is True for existing turns j < k (the memory before turn k)."""
  n = turn_mask.shape[1]
  lower = jnp.tril(jnp.ones((n, n), bool), k=-1)
  return lower[None] & turn_mask[:, None, :] & turn_mask[:, :, None]


def anchor_hashes(traj: types.Trajectories) -> tuple[Array, Array]:
  """Hash of the state each turn acts from, and whether it is known.

  Returns:
    anchor: `[B, N]` int32, `extras["initial_obs_hash"]` for turn 0 (0 when absent) and
      `obs_hash[:, k − 1]` for k ≥ 1.
    known: `[B, N]` bool; False at turn 0 when the rollout recorded no initial hash.
  """
  obs_hash = jnp.asarray(traj.obs_hash)
  chex.assert_rank(obs_hash, 2)
  b, n = obs_hash.shape
  initial = traj.extras.get(extra_keys.INITIAL_OBS_HASH_KEY)
  known0 = initial is not None
  initial = jnp.zeros((b,), obs_hash.dtype) if initial is None else jnp.asarray(initial, obs_hash.dtype)
  chex.assert_shape(initial, (b,))
  anchor = jnp.concatenate([initial[:, None], obs_hash[:, :-1]], axis=1)
  known = jnp.ones((b, n), bool).at[:, 0].set(known0)
  return anchor, known


def with_turn_rewards(traj: types.Trajectories, reward: Array) -> types.Trajectories:
  """Replaces the turn rewards [B, N] and moves each trajectory's outcome by the same total.

  Trajectory-level estimators read `outcome`; turn-level ones read `reward`. Shifting both by
  the shaped amount keeps them consistent: R_b = R_ext,b + Σ_k r_int[b, k].
  """
  reward = jnp.where(traj.turn_mask, reward, 0.0).astype(jnp.float32)
  delta = jnp.sum(reward - jnp.where(traj.turn_mask, traj.reward, 0.0), axis=1)
  return traj.replace(reward=reward, outcome=traj.outcome + delta)


def last_turn(turn_mask: Array) -> Array:
  """`[B, N]` bool one-hot of each trajectory's last existing turn (all False for empty rows)."""
  n = turn_mask.shape[1]
  count = jnp.sum(turn_mask, axis=1)
  return (jnp.arange(n)[None, :] == (count - 1)[:, None]) & (count > 0)[:, None]
