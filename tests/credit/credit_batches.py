"""Small hand-written batches for the credit and reward tests."""

from __future__ import annotations

import dataclasses

import numpy as np

from agentrl_jax import types

OBS_TOKEN = 3  # every observation token; action ids are chosen per test


@dataclasses.dataclass
class Turn:
  """One turn: `obs` observation tokens, then the action ids `act`."""

  act: tuple[int, ...] = (10,)
  obs: int = 2
  reward: float = 0.0
  obs_hash: int = 0
  valid: bool = True
  logp: float = -0.5


def make_batch(rows, *, max_len: int = 24, max_turns: int = 4, group_id=None, success=None,
               outcome=None) -> types.Trajectories:
  """Builds host Trajectories from rows of `Turn`s (outcome defaults to the reward sum)."""
  b = len(rows)
  traj = types.empty_trajectories(b, max_len, max_turns)
  for i, row in enumerate(rows):
    pos = 0
    for k, turn in enumerate(row):
      traj.turn_of_token[i, pos:pos + turn.obs + len(turn.act)] = k
      traj.tokens[i, pos:pos + turn.obs] = OBS_TOKEN
      pos += turn.obs
      end = pos + len(turn.act)
      traj.tokens[i, pos:end] = turn.act
      traj.action_mask[i, pos:end] = True
      traj.sample_logprob[i, pos:end] = turn.logp
      traj.turn_start[i, k], traj.turn_end[i, k] = pos, end
      traj.turn_mask[i, k] = True
      traj.reward[i, k] = turn.reward
      traj.obs_hash[i, k] = turn.obs_hash
      traj.action_valid[i, k] = turn.valid
      pos = end
    if row:
      traj.done[i, len(row) - 1] = True
  traj.outcome[:] = traj.reward.sum(1) if outcome is None else outcome
  traj.success[:] = traj.outcome > 0 if success is None else success
  traj.group_id[:] = np.zeros(b, np.int32) if group_id is None else group_id
  traj.validate()
  return traj


def random_batch(rng: np.random.Generator, *, b: int = 6, max_len: int = 32,
                 max_turns: int = 4) -> types.Trajectories:
  """Random turn layouts (1–4 turns of 1–3 action tokens), two groups, repeated observations."""
  rows = []
  for _ in range(b):
    n = int(rng.integers(1, max_turns + 1))
    rows.append([Turn(act=tuple(int(a) for a in rng.integers(10, 14, size=int(rng.integers(1, 4)))),
                      obs=int(rng.integers(1, 3)), reward=float(rng.choice([0.0, 0.0, 1.0])),
                      obs_hash=int(rng.integers(0, 3)), valid=bool(rng.random() > 0.2),
                      logp=float(-rng.random() * 2)) for _ in range(n)])
  return make_batch(rows, max_len=max_len, max_turns=max_turns,
                    group_id=np.arange(b) % 2)


def outcome_advantages(traj: types.Trajectories, per_trajectory) -> np.ndarray:
  """`[B, L]` advantages equal to `per_trajectory[b]` on the action tokens."""
  return np.where(traj.action_mask, np.asarray(per_trajectory, np.float32)[:, None], 0.0).astype(np.float32)
