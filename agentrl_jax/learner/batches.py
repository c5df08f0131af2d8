"""A host's trajectories -> the batch the update sees, and the metrics of the whole batch.

With several processes every host holds only its rows; these functions give the hosts' shares a
common shape, assemble them into global arrays, and combine their metrics.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import types
from agentrl_jax.parallel import multihost
from agentrl_jax.parallel import rules as rules_lib
from agentrl_jax.rollout import groups as groups_lib
from agentrl_jax.rollout import loop as loop_lib


def to_device(traj: types.Trajectories) -> types.Trajectories:
  return jax.tree.map(jnp.asarray, traj)


def pad_tokens(traj: types.Trajectories, length: int) -> types.Trajectories:
  """Pads the token columns (and token-level extras) to `length`, the agreed multi-host length."""
  width = traj.tokens.shape[1]
  pad = lambda x, value=0: np.pad(x, ((0, 0), (0, length - width)), constant_values=value)
  token_level = traj.tokens.shape != traj.reward.shape  # else [B, L] and [B, N] look alike
  pad_rows = lambda x: np.pad(x, [(0, 0), (0, length - width)] + [(0, 0)] * (x.ndim - 2))
  extras = {k: pad_rows(v) if token_level and v.shape[:2] == traj.tokens.shape else v
            for k, v in traj.extras.items()}
  return traj.replace(tokens=pad(traj.tokens), action_mask=pad(traj.action_mask),
                      turn_of_token=pad(traj.turn_of_token, -1),
                      sample_logprob=pad(traj.sample_logprob), extras=extras)


def _fill_names(values: dict[str, np.ndarray], names: Sequence[str], like: np.ndarray) -> dict[str, np.ndarray]:
  return {name: values.get(name, np.zeros_like(like)) for name in names}


def align_over_hosts(traj: types.Trajectories) -> types.Trajectories:
  """Gives every host's share the same token length and the same extras/sub-outcome keys."""
  if jax.process_count() == 1:
    return traj
  traj = pad_tokens(traj, multihost.agree_max(traj.tokens.shape[1]))
  per_turn = {k: v for k, v in traj.extras.items() if v.shape == traj.reward.shape}
  per_episode = {k: v for k, v in traj.extras.items() if v.ndim == 1}
  # Token-level extras (teacher log-probs, MoE routing) come from the run's own configuration,
  # so every host has them; per-turn and per-episode env info may be missing on some hosts.
  extras = {**traj.extras,
            **_fill_names(per_turn, multihost.agree_names(per_turn), traj.reward.astype(np.float32)),
            **_fill_names(per_episode, multihost.agree_names(per_episode), traj.outcome.astype(np.float32))}
  sub = _fill_names(traj.sub_outcomes, multihost.agree_names(traj.sub_outcomes),
                    traj.outcome.astype(np.float32))
  return traj.replace(extras=extras, sub_outcomes=sub)


def global_batch(traj: types.Trajectories, device_mesh) -> types.Trajectories:
  """This host's rows -> the batch the update sees (global arrays on the mesh, if any)."""
  if device_mesh is None:
    return to_device(traj)
  if jax.process_count() == 1:
    return rules_lib.shard_batch(traj, device_mesh)
  return multihost.global_batch(align_over_hosts(traj), device_mesh)


def tied_group_fraction(group_id: np.ndarray, outcome: np.ndarray) -> float:
  """The fraction of groups of ≥ 2 episodes whose outcomes are all equal (0 without such groups).

  A group-relative baseline (GRPO, RLOO, Dr.GRPO) gives every episode of a tied group zero
  advantage, so a batch of tied groups carries no outcome gradient: every task already solved, or
  none of its samples solving it (DAPO's dynamic sampling drops such groups for that reason).
  """
  groups = groups_lib.groups_of(group_id, outcome)
  counted = groups.tied[groups.size > 1]
  return float(counted.mean()) if counted.size else 0.0


def iteration_metrics(traj: types.Trajectories, stats: loop_lib.RolloutStats) -> dict[str, float]:
  """Metrics of the whole batch: every host's rows and counters are combined first."""
  rows = multihost.gather_rows({"success": traj.success.astype(np.float32),
                                "outcome": traj.outcome.astype(np.float32),
                                "group": traj.group_id.astype(np.int32),
                                "turns": traj.turn_mask.sum(axis=1).astype(np.float32)})
  counters = ("episodes", "turns", "sampled_tokens", "env_errors", "env_timeouts",
              "invalid_actions", "truncated", "budget_truncated", "stop_string_cuts")
  totals = multihost.gather_rows(np.asarray([[getattr(stats, c) for c in counters]], np.int64)).sum(0)
  seconds = float(multihost.gather_rows(np.asarray([stats.seconds])).max())
  combined = loop_lib.RolloutStats(**dict(zip(counters, map(int, totals))), seconds=seconds)
  return {
      "train/success": float(np.mean(rows["success"])),
      "train/outcome": float(np.mean(rows["outcome"])),
      "train/turns": float(np.mean(rows["turns"])),
      "train/tied_groups": tied_group_fraction(rows["group"], rows["outcome"]),
      **combined.as_metrics(),
  }
