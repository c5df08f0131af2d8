"""The data contract every stage of the flow reads and writes.

Shape letters: B trajectories, L tokens, N turns. A rollout returns one `Trajectories` pytree with
static (bucketed) shapes; everything downstream of the rollout is a pure function of it.

Token layout of one trajectory (turn k = the observation that opened it, then the action sampled):

    [obs_0 tokens][act_0 tokens][obs_1 tokens][act_1 tokens] ... [padding]
     turn 0 ......................turn 1 ......................   -1

`action_mask` is 1 on the action tokens only; `turn_start[b, k]`/`turn_end[b, k]` delimit the
action span of turn k as the half-open token range [start, end).
"""

from __future__ import annotations

from typing import Any

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = Any  # jax.Array or np.ndarray: the contract is the same on host and device.


@flax.struct.dataclass
class Trajectories:
  """A batch of multi-turn episodes with static shapes.

  Token level [B, L]:
    tokens: int32 token ids, exactly as sampled or as tokenized once on arrival.
    action_mask: bool, True where the policy sampled the token (only these carry loss).
    turn_of_token: int32 turn index of every token, -1 for padding.
    sample_logprob: float32 sampler log-prob of each sampled token, 0 elsewhere (TITO).
  Turn level [B, N]:
    turn_mask: bool, which turns exist.
    reward: float32 env reward received after the turn's action.
    done: bool, the episode ended after this turn.
    obs_hash: int32 fingerprint of the observation that followed the action.
    action_valid: bool, the env accepted the action.
    env_error: bool, the env faulted on this turn (the trajectory is excluded from the loss).
    turn_start, turn_end: int32 token offsets of the action span, [start, end).
  Trajectory level [B]:
    group_id: int32, same task and seed => same group.
    outcome: float32 terminal reward (sum of turn rewards).
    success: bool verifier result.
    sub_outcomes: named float32 [B] verifiable sub-outcomes.
    extras: named arrays a particular method needs.
  """

  tokens: Array
  action_mask: Array
  turn_of_token: Array
  sample_logprob: Array
  turn_mask: Array
  reward: Array
  done: Array
  obs_hash: Array
  action_valid: Array
  env_error: Array
  turn_start: Array
  turn_end: Array
  group_id: Array
  outcome: Array
  success: Array
  sub_outcomes: dict[str, Array] = flax.struct.field(default_factory=dict)
  extras: dict[str, Array] = flax.struct.field(default_factory=dict)

  @property
  def batch_size(self) -> int:
    return self.tokens.shape[0]

  @property
  def max_len(self) -> int:
    return self.tokens.shape[1]

  @property
  def max_turns(self) -> int:
    return self.turn_mask.shape[1]

  def validate(self) -> None:
    """Checks shapes and dtypes of every field; raises with the field's name on a mismatch."""
    b, l = self.tokens.shape
    n = self.turn_mask.shape[1]
    expect = {
        "tokens": ((b, l), np.int32), "action_mask": ((b, l), np.bool_),
        "turn_of_token": ((b, l), np.int32), "sample_logprob": ((b, l), np.float32),
        "turn_mask": ((b, n), np.bool_), "reward": ((b, n), np.float32),
        "done": ((b, n), np.bool_), "obs_hash": ((b, n), np.int32),
        "action_valid": ((b, n), np.bool_), "env_error": ((b, n), np.bool_),
        "turn_start": ((b, n), np.int32), "turn_end": ((b, n), np.int32),
        "group_id": ((b,), np.int32), "outcome": ((b,), np.float32), "success": ((b,), np.bool_),
    }
    for name, (shape, dtype) in expect.items():
      value = getattr(self, name)
      if tuple(value.shape) != shape or np.dtype(value.dtype) != dtype:
        raise ValueError(
            f"Trajectories.{name}: expected {np.dtype(dtype).name}{list(shape)}, "
            f"got {np.dtype(value.dtype).name}{list(value.shape)}")
    for name, value in self.sub_outcomes.items():
      if tuple(value.shape) != (b,):
        raise ValueError(f"Trajectories.sub_outcomes[{name!r}]: expected shape [{b}], got {list(value.shape)}")

  @property
  def valid_trajectory(self) -> Array:
    """[B] bool: trajectories with no env fault (faulted ones carry no loss)."""
    xp = jnp if isinstance(self.env_error, jax.Array) else np
    return ~xp.any(self.env_error & self.turn_mask, axis=1)


def empty_trajectories(batch_size: int, max_len: int, max_turns: int) -> Trajectories:
  """Host-side zero-filled buffers the rollout loop writes into."""
  b, l, n = batch_size, max_len, max_turns
  return Trajectories(
      tokens=np.zeros((b, l), np.int32),
      action_mask=np.zeros((b, l), np.bool_),
      turn_of_token=np.full((b, l), -1, np.int32),
      sample_logprob=np.zeros((b, l), np.float32),
      turn_mask=np.zeros((b, n), np.bool_),
      reward=np.zeros((b, n), np.float32),
      done=np.zeros((b, n), np.bool_),
      obs_hash=np.zeros((b, n), np.int32),
      action_valid=np.zeros((b, n), np.bool_),
      env_error=np.zeros((b, n), np.bool_),
      turn_start=np.zeros((b, n), np.int32),
      turn_end=np.zeros((b, n), np.int32),
      group_id=np.zeros((b,), np.int32),
      outcome=np.zeros((b,), np.float32),
      success=np.zeros((b,), np.bool_),
  )


def broadcast_turns_to_tokens(turn_values: Array, turn_of_token: Array, action_mask: Array) -> Array:
  """Broadcasts a per-turn quantity [B, N] to the action tokens [B, L]; zero elsewhere.

  `bcast(x)[b, l] = x[b, turn_of_token[b, l]] * action_mask[b, l]` (docs/methods.md#conventions).
  """
  chex.assert_rank([turn_values, turn_of_token, action_mask], [2, 2, 2])
  safe_turn = jnp.clip(turn_of_token, 0, turn_values.shape[1] - 1)
  gathered = jnp.take_along_axis(turn_values, safe_turn, axis=1)
  return jnp.where(action_mask & (turn_of_token >= 0), gathered, 0.0).astype(turn_values.dtype)


def broadcast_trajectories_to_tokens(values: Array, action_mask: Array) -> Array:
  """Broadcasts a per-trajectory scalar [B] to the action tokens [B, L]; zero elsewhere."""
  chex.assert_rank([values, action_mask], [1, 2])
  return jnp.where(action_mask, values[:, None], 0.0).astype(values.dtype)


@flax.struct.dataclass
class ActorCriticState:
  """Everything the learner updates, as one pytree.

  The module structure (nnx.GraphDef) is static and lives outside; these are the arrays.
  `critic_params`/`critic_opt_state` are None when the estimator needs no critic.
  `ref_params` is the frozen reference policy for a KL term, or None.
  """

  step: Array
  rng: Array
  policy_params: Any
  policy_opt_state: Any
  critic_params: Any = None
  critic_opt_state: Any = None
  ref_params: Any = None
