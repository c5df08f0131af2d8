"""Intrinsic penalty for actions whose observation the episode has already seen
(docs/methods.md#curiosity).

An agent stuck in a confident loop keeps producing observations it has seen before ("hit wall",
the same page, the same error). Penalising such an action — only where the penalty cannot fight
task completion — buys state-space coverage without a learned novelty model.

Turn k's memory is `M_k = {o_0, o_1, …, o_k}` (the initial observation and every observation
that followed an earlier action); turn k's action is a duplicate when `o_{k+1} ∈ M_k`. In this
library `obs_hash[b, k]` is `o_{k+1}`; `o_0` comes from `traj.extras["initial_obs_hash"]` (`[B]`
int32) when the rollout records it, and is left out of the memory otherwise.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array

GATES = ("unproductive", "step", "always")


def duplicate_observations(obs_hash: Array, turn_mask: Array,
                           initial_hash: Array | None = None) -> Array:
  """`[B, N]` bool: the observation after turn k's action is already in the episode's memory.

  `dup[b, k] = 1[obs_hash[b, k] ∈ {initial_hash[b]} ∪ {obs_hash[b, j] : j < k}]`, an O(N²)
  pairwise comparison under a strictly lower-triangular mask.

  Args:
    obs_hash: `[B, N]` int hash of the observation following each turn's action, turns [0, N).
    turn_mask: `[B, N]` bool, which turns exist.
    initial_hash: `[B]` int hash of the first observation, or None to leave it out of the memory.
  """
  chex.assert_rank([obs_hash, turn_mask], [2, 2])
  chex.assert_equal_shape([obs_hash, turn_mask])
  turn_mask = turn_mask.astype(bool)
  same = obs_hash[:, :, None] == obs_hash[:, None, :]
  dup = jnp.any(same & trajectory.earlier_turn_matrix(turn_mask), axis=2)
  if initial_hash is not None:
    chex.assert_shape(initial_hash, obs_hash.shape[:1])
    dup |= obs_hash == jnp.asarray(initial_hash, obs_hash.dtype)[:, None]
  return dup & turn_mask


def duplicate_observation_intrinsic_reward(
    duplicate: Array, reward: Array, turn_mask: Array, success: Array, *,
    penalty: float = 0.1, max_total: float = 0.5, gate: str = "unproductive") -> Array:
  """`[B, N]` intrinsic reward `r_int ≤ 0`, with `Σ_k r_int[b, k] ≥ −max_total`.

    c[b, k]     = 1[r[b, k] ≤ 0]·(1 − success_b)   ("unproductive"), 1[r[b, k] ≤ 0] ("step"), 1 ("always")
    r_int[b, k] = −penalty · dup[b, k] · c[b, k] · turn_mask[b, k]
    r_int[b, :] ← r_int[b, :] · max_total / |Σ_k r_int[b, k]|   where the sum is below −max_total

  Args:
    duplicate: `[B, N]` bool from `duplicate_observations`.
    reward: `[B, N]` extrinsic reward of each turn.
    turn_mask: `[B, N]` bool.
    success: `[B]` bool.
    penalty: λ_dup ≥ 0, the penalty per duplicate.
    max_total: λ_max ≥ 0, the most an episode can lose.
    gate: one of `GATES`.
  """
  _check_hyperparameters(penalty, max_total, gate)
  chex.assert_rank([duplicate, reward, turn_mask, success], [2, 2, 2, 1])
  unrewarded = reward <= 0
  if gate == "unproductive":
    condition = unrewarded & ~success.astype(bool)[:, None]
  elif gate == "step":
    condition = unrewarded
  else:
    condition = jnp.ones_like(unrewarded)
  r_int = -penalty * (duplicate & condition & turn_mask.astype(bool)).astype(jnp.float32)
  total = jnp.sum(r_int, axis=1, keepdims=True)
  scale = jnp.where(total < -max_total, max_total / jnp.maximum(-total, 1e-12), 1.0)
  return r_int * scale


def duplicate_observation_penalty(traj: types.Trajectories, *, penalty: float = 0.1,
                                  max_total: float = 0.5,
                                  gate: str = "unproductive") -> types.Trajectories:
  """Reward shaper: adds the duplicate-observation penalty to the turn rewards.

  Reads `obs_hash`, `turn_mask`, `reward`, `success` and, when present,
  `extras["initial_obs_hash"]` (`[B]` int32, the first observation's hash). `outcome` moves by the
  episode's total penalty (`trajectory.with_turn_rewards`), so trajectory-level estimators see
  `R_b = R_ext,b + Σ_k r_int[b, k]`.

  Args:
    traj: the batch.
    penalty: λ_dup (default 0.1, the scale of verl-agent's invalid-action penalty).
    max_total: λ_max (default 0.5: any success is worth more than any penalty when R_success = 1).
    gate: "unproductive" (default: unrewarded turns of unsuccessful episodes), "step"
      (unrewarded turns) or "always".
  """
  _check_hyperparameters(penalty, max_total, gate)
  initial = traj.extras.get(extra_keys.INITIAL_OBS_HASH_KEY)
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  dup = duplicate_observations(jnp.asarray(traj.obs_hash), turn_mask,
                               None if initial is None else jnp.asarray(initial))
  reward = jnp.asarray(traj.reward, jnp.float32)
  r_int = duplicate_observation_intrinsic_reward(
      dup, reward, turn_mask, jnp.asarray(traj.success), penalty=penalty, max_total=max_total,
      gate=gate)
  return trajectory.with_turn_rewards(traj, reward + r_int)


def _check_hyperparameters(penalty: float, max_total: float, gate: str) -> None:
  if not penalty >= 0:
    raise ValueError(f"curiosity penalty must be >= 0, got {penalty!r}")
  if not max_total >= 0:
    raise ValueError(f"curiosity max_total must be >= 0, got {max_total!r}")
  if gate not in GATES:
    raise ValueError(f"curiosity gate must be one of {GATES}, got {gate!r}")
