"""Step-level group baselines from shared states: GiGPO and GAGPO.

Both work on the turn layout `[B, N]` of `Trajectories`; a "step row" of verl-agent is one existing
turn `(b, k)`. The state a turn acts from (its *anchor*) is the observation *before* the turn's
action. `Trajectories.obs_hash[b, k]` fingerprints the observation *after* turn `k`'s action, so

    anchor[b, 0] = initial observation hash,   anchor[b, k] = obs_hash[b, k − 1]   (k ≥ 1).

The initial hash comes from `traj.extras["initial_obs_hash"]` (`[B]` int32) when the rollout
provides it; otherwise every trajectory of the batch is taken to start from the same state (the
hash constant 0), which holds when a group shares one task and seed. Anchor states are grouped by
exact hash equality inside each `group_id` (a hash table built from segment reductions, no
dictionaries and no sort; see `step_groups`).
"""

from __future__ import annotations

import difflib
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import gae as gae_lib
from agentrl_jax.advantages import group

Array = jax.Array

GIGPO_MODES = ("mean_norm", "mean_std_norm")
GAGPO_SINGLETON_RULES = ("time_baseline", "self")


class GiGPOOutput(NamedTuple):
  """Attributes (all float32):

  advantages: `[B, N]` `A^E + ω·A^S`, zero on missing turns and excluded trajectories.
  episode_advantages: `[B]` `A^E`; `[B, N]` when a step penalty is given (each step row's
    episode score then carries its own penalty).
  step_advantages: `[B, N]` `A^S`.
  """

  advantages: Array
  episode_advantages: Array
  step_advantages: Array


class GAGPOOutput(NamedTuple):
  """Attributes (all `[B, N]` float32, zero on missing turns):

  advantages: group-normalised GAE advantages `Â`.
  raw_advantages: GAE advantages `A` before the normalisation.
  state_values: the grouped value proxy `V̂(s_{b,k})`.
  """

  advantages: Array
  raw_advantages: Array
  state_values: Array


def anchor_hashes(obs_hash: Array, initial_hash: Array | None = None) -> Array:
  """`[B, N]` hash of the state each turn acts from: `initial_hash`, then `obs_hash[:, k−1]`.

  Args:
    obs_hash: `[B, N]` int hash of the observation following each turn's action.
    initial_hash: `[B]` int hash of the first observation; 0 for every row if None.
  """
  chex.assert_rank(obs_hash, 2)
  if initial_hash is None:
    initial_hash = jnp.zeros(obs_hash.shape[:1], obs_hash.dtype)
  chex.assert_shape(initial_hash, obs_hash.shape[:1])
  return jnp.concatenate(
      [jnp.asarray(initial_hash, obs_hash.dtype)[:, None], obs_hash[:, :-1]], axis=1)


def mix32(h: Array) -> Array:
  """MurmurHash3's 32-bit finaliser: a bijection on uint32 that spreads every input bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


class _ProbeState(NamedTuple):
  ids: Array  # [R] int32 group id found so far (the first row of the group).
  unresolved: Array  # [R] bool rows whose group is not found yet.
  round: Array  # int32 probe round, seeds the slot hash.


def step_groups(group_id: Array, anchor_hash: Array, turn_mask: Array, *,
                table_factor: float = 2) -> Array:
  """Anchor-state group ids: equal `(group_id[b], anchor_hash[b, k])` ⇔ equal id.

  The id of a group is the flat index `b·N + k` of its first row in row-major order, so ids are
  canonical (they do not depend on hashing) but not dense. Missing turns all share the id of the
  first missing row; give them zero weight in any reduction.

  Exact hash grouping with static shapes and no sort: each round hashes every unresolved row's key
  into a table of `≥ table_factor·R` slots, takes the smallest unresolved row index per slot with
  one `segment_min`, and resolves the rows whose key equals that row's key. All rows of a key share
  a slot in a round, so they resolve together, to their first row; every round resolves at least
  one key per occupied slot, and the rounds (a `while_loop`, reseeded each round) stop when none
  is left; with the default table two or three rounds resolve 10⁵ rows. A `lexsort` of
  (group, hash) keys gives the same partition about 20× slower on CPU (bench/advantages.py):
  XLA's multi-operand sort is slow there.

  Args:
    group_id: `[B]` int.
    anchor_hash: `[B, N]` int.
    turn_mask: `[B, N]` bool.
    table_factor: hash table slots per row (rounded up to a power of two); more slots, fewer
      collisions and rounds, more memory. 2 was the fastest of 1/8 … 16 at 10⁵ rows on CPU.

  Returns:
    `[B, N]` int32 ids in `[0, B·N)`.
  """
  chex.assert_rank([group_id, anchor_hash, turn_mask], [1, 2, 2])
  chex.assert_equal_shape([anchor_hash, turn_mask])
  chex.assert_type([group_id, anchor_hash], int)
  if not table_factor > 0:
    raise ValueError(f"table_factor must be > 0, got {table_factor!r}")
  b, n = anchor_hash.shape
  rows = b * n
  gid = jnp.broadcast_to(jnp.asarray(group_id)[:, None], (b, n)).reshape(-1)
  key = jnp.asarray(anchor_hash).reshape(-1)
  # One [R, 2] array so that a round reads a candidate's whole key with a single gather.
  key_dtype = jnp.promote_types(gid.dtype, key.dtype)
  full_key = jnp.stack([gid.astype(key_dtype), key.astype(key_dtype)], axis=1)
  exists = jnp.asarray(turn_mask).astype(bool).reshape(-1)
  row_index = jnp.arange(rows, dtype=jnp.int32)
  bits = max(1, int(np.ceil(np.log2(max(table_factor * rows, 2)))))
  group_bits = gid.astype(jnp.uint32)
  key_bits = key.astype(jnp.uint32)

  def probe(state: _ProbeState) -> _ProbeState:
    seed = state.round.astype(jnp.uint32) * jnp.uint32(0x9E3779B9)
    slot = (mix32(key_bits ^ mix32(group_bits + seed)) >> (32 - bits)).astype(jnp.int32)
    first = jax.ops.segment_min(jnp.where(state.unresolved, row_index, rows), slot, 1 << bits)
    # Unresolved rows find at least themselves in their slot; the clip only guards resolved rows.
    candidate = jnp.minimum(first[slot], rows - 1)
    match = state.unresolved & jnp.all(full_key[candidate] == full_key, axis=1)
    return _ProbeState(ids=jnp.where(match, candidate, state.ids),
                       unresolved=state.unresolved & ~match, round=state.round + 1)

  first_missing = jnp.argmax(~exists).astype(jnp.int32)
  start = _ProbeState(ids=jnp.where(exists, 0, first_missing), unresolved=exists,
                      round=jnp.zeros((), jnp.int32))
  final = jax.lax.while_loop(lambda state: jnp.any(state.unresolved), probe, start)
  return final.ids.reshape(b, n)


def step_returns(rewards: Array, turn_mask: Array, discount: float) -> Array:
  """Discounted return-to-go per turn, `G_k = r_k + γ·G_{k'}` (k' the next existing turn), `[B, N]`.

  This is GAE with `V ≡ 0` and `λ = 1`; missing turns are skipped and get 0.
  """
  return gae_lib.generalized_advantage_estimation(
      rewards, jnp.zeros_like(rewards), turn_mask, discount, 1.0).advantages


def _flat_segment_stats(x: Array, ids: Array, weights: Array, num: int) -> group.GroupStatistics:
  return group.group_statistics(x.reshape(-1), ids.reshape(-1), num, weights.reshape(-1))


def _gather(per_segment: Array, ids: Array) -> Array:
  return per_segment[ids]


def gigpo_advantages(
    episode_scores: Array,
    step_rewards: Array,
    anchor_hash: Array,
    turn_mask: Array,
    group_id: Array,
    num_groups: int | None = None,
    discount: float = 0.95,
    step_weight: float = 1.0,
    mode: str = "mean_norm",
    eps: float = 1e-6,
    episode_stats_over: str = "step_rows",
    weights: Array | None = None,
    step_penalty: Array | None = None,
) -> GiGPOOutput:
  """GiGPO: episode-level group advantage plus an anchor-state step-level advantage.

      A^E_b     = norm_g(s_b)                 over the step rows (or trajectories) of group g
      G_{b,k}   = r_{b,k} + γ·G_{b,k+1}       (reverse scan over existing turns)
      A^S_{b,k} = norm_S(G_{b,k})             over S = {(b', k') in g : anchor(b', k') = anchor(b, k)}
      A_{b,k}   = A^E_b + ω·A^S_{b,k}

  `norm(x) = x − mean` (`mean_norm`) or `(x − mean)/(std + eps)` (`mean_std_norm`), unbiased std.
  The episode level follows verl's group-of-one rule (mean 0, std 1); a singleton step group gets
  `A^S = 0`. Reference: Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training",
  2025 (verl-agent).

  A step penalty `p_{b,k}` (verl-agent's invalid-action penalty) is charged the way verl-agent
  charges it, to the step row itself: the row's episode score becomes `s_b − p_{b,k}` and the
  return its step group normalises `G_{b,k} − p_{b,k}` (verl-agent subtracts it after the
  discounted returns are formed, so it does not reach earlier turns). Counting each trajectory
  once (`episode_stats_over="trajectories"`) has no per-row score; the trajectory's score is then
  `s_b − Σ_k p_{b,k}`.

  Args:
    episode_scores: `[B]` float episode reward `s_b`.
    step_rewards: `[B, N]` float per-turn env reward `r_{b,k}`, turns over `[0, N)`.
    anchor_hash: `[B, N]` int hash of the state before turn `k` (see `anchor_hashes`).
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, num_groups)`.
    num_groups: static G for the episode level; defaults to B.
    discount: γ for the step returns.
    step_weight: ω.
    mode: "mean_norm" or "mean_std_norm".
    eps: added to the std.
    episode_stats_over: "step_rows" (verl-agent: each existing turn counts as one sample, so long
      episodes weigh more) or "trajectories" (each trajectory once).
    weights: optional `[B]` 0/1 mask of trajectories to include (e.g. no env fault).
    step_penalty: optional `[B, N]` float `p_{b,k}` charged to each step row (see above).

  Returns:
    `GiGPOOutput`.
  """
  chex.assert_rank([episode_scores, step_rewards, anchor_hash, turn_mask, group_id],
                   [1, 2, 2, 2, 1])
  chex.assert_equal_shape([step_rewards, anchor_hash, turn_mask])
  if step_penalty is not None:
    chex.assert_equal_shape([step_penalty, step_rewards])
  if mode not in GIGPO_MODES:
    raise ValueError(f"mode must be one of {GIGPO_MODES}, got {mode!r}")
  if episode_stats_over not in ("step_rows", "trajectories"):
    raise ValueError(
        f"episode_stats_over must be 'step_rows' or 'trajectories', got {episode_stats_over!r}")
  b, n = step_rewards.shape
  keep = jnp.ones((b,), bool) if weights is None else jnp.asarray(weights) > 0
  rows = jnp.asarray(turn_mask).astype(bool) & keep[:, None]
  normalize = mode == "mean_std_norm"

  if step_penalty is None:
    episode = _episode_advantages(episode_scores, group_id, rows, keep, num_groups, normalize,
                                  eps, episode_stats_over)
    episode_rows = episode[:, None]
    penalty = 0.0
  else:
    penalty = jnp.where(rows, jnp.asarray(step_penalty, jnp.float32), 0.0)
    episode = episode_rows = _penalized_episode_advantages(
        episode_scores, penalty, group_id, rows, keep, num_groups, normalize, eps,
        episode_stats_over)

  returns = step_returns(step_rewards.astype(jnp.float32), rows, discount) - penalty
  ids = step_groups(group_id, anchor_hash, rows)
  # Deviations from shifted sums: two rows of one anchor state can differ by 1e-4 at a return
  # of 1000, below the float32 rounding of their mean (group.group_deviations).
  stats = group.group_deviations(returns.reshape(-1), ids.reshape(-1), b * n,
                                 rows.reshape(-1).astype(jnp.float32), detect_contiguous=False)
  count, step, std = (x.reshape(b, n) for x in stats)
  if normalize:
    step = step / (std + eps)
  step = jnp.where(rows & (count > 1), step, 0.0)

  advantages = jnp.where(rows, episode_rows + step_weight * step, 0.0)
  return GiGPOOutput(advantages=advantages, episode_advantages=episode, step_advantages=step)


def _episode_advantages(scores, group_id, rows, keep, num_groups, normalize, eps, stats_over):
  """`[B]` `A^E`: one score per trajectory, counted once per step row or once."""
  if stats_over == "step_rows":
    multiplicity = jnp.sum(rows, axis=1).astype(jnp.float32)
  else:
    multiplicity = keep.astype(jnp.float32)
  return group.group_relative_advantages(
      scores, group_id, num_groups, normalize_by_std=normalize, eps=eps, weights=multiplicity)


def _penalized_episode_advantages(scores, penalty, group_id, rows, keep, num_groups, normalize,
                                  eps, stats_over):
  """`[B, N]` `A^E` with each step row's penalty in its episode score, zero on missing rows."""
  b, n = rows.shape
  if stats_over == "trajectories":
    per_trajectory = _episode_advantages(scores - jnp.sum(penalty, axis=1), group_id, rows, keep,
                                         num_groups, normalize, eps, stats_over)
    return jnp.where(rows, per_trajectory[:, None], 0.0)
  row_scores = jnp.asarray(scores, jnp.float32)[:, None] - penalty
  gid = jnp.broadcast_to(jnp.asarray(group_id)[:, None], (b, n))
  # Group ids stay those of the trajectories, so the segment count is the trajectories'.
  flat = group.group_relative_advantages(
      row_scores.reshape(-1), gid.reshape(-1), b if num_groups is None else num_groups,
      normalize_by_std=normalize, eps=eps, weights=rows.reshape(-1).astype(jnp.float32))
  return flat.reshape(b, n)


def grouped_value_proxy(
    returns: Array,
    anchor_hash: Array,
    turn_mask: Array,
    group_id: Array,
    singleton: str = "time_baseline",
) -> Array:
  """GAGPO's critic-free state value `V̂(s_{b,k})`, `[B, N]`.

  `V̂(s)` is the mean return of all rows of the same group that act from state `s` (anchor groups
  of size ≥ 2). For a singleton state: `time_baseline` uses the mean `G` of the group's rows at the
  same turn index `k`, or the group's mean `G` over all its rows if that set is a singleton too;
  `self` uses the row's own `G` (an ablation: its TD terms telescope away).

  Args:
    returns: `[B, N]` float return-to-go `G_{b,k}`.
    anchor_hash: `[B, N]` int.
    turn_mask: `[B, N]` bool rows to use.
    group_id: `[B]` int in `[0, B)`.
    singleton: "time_baseline" or "self".
  """
  if singleton not in GAGPO_SINGLETON_RULES:
    raise ValueError(f"singleton must be one of {GAGPO_SINGLETON_RULES}, got {singleton!r}")
  b, n = returns.shape
  rows = jnp.asarray(turn_mask).astype(bool)
  w = rows.astype(jnp.float32)
  state_ids = step_groups(group_id, anchor_hash, rows)
  state = _flat_segment_stats(returns, state_ids, w, b * n)
  state_count, state_mean = _gather(state.count, state_ids), _gather(state.mean, state_ids)
  if singleton == "self":
    fallback = returns
  else:
    # Segment (group, turn index) = group_id·N + k, in [0, B·N).
    gid = jnp.broadcast_to(jnp.asarray(group_id)[:, None], (b, n))
    time_ids = gid * n + jnp.arange(n)[None, :]
    time = _flat_segment_stats(returns, time_ids, w, b * n)
    time_count, time_mean = _gather(time.count, time_ids), _gather(time.mean, time_ids)
    uid = _flat_segment_stats(returns, gid, w, b)
    fallback = jnp.where(time_count > 1, time_mean, _gather(uid.mean, gid))
  return jnp.where(rows, jnp.where(state_count > 1, state_mean, fallback), 0.0)


def gagpo_advantages(
    step_rewards: Array,
    anchor_hash: Array,
    turn_mask: Array,
    group_id: Array,
    discount: float = 0.95,
    lambda_: float = 0.95,
    eps: float = 1e-6,
    singleton: str = "time_baseline",
    weights: Array | None = None,
) -> GAGPOOutput:
  """GAGPO: GAE over turns with a grouped, critic-free value proxy, normalised per group.

      G_{b,k}   = Σ_{j≥k} γ^{j−k} r_{b,j}
      V̂(s_{b,k}) = grouped_value_proxy(G)               (terminal value 0)
      δ_{b,k}   = r_{b,k} + γ·V̂(s_{b,k+1}) − V̂(s_{b,k})
      A_{b,k}   = Σ_{l≥0} (γλ)^l δ_{b,k+l}              (reverse scan, missing turns skipped)
      Â_{b,k}   = (A_{b,k} − mean_g A) / (std_g A + eps)  over all step rows of group g

  The normalisation uses the §0.2 rules (unbiased std; a group with one row keeps mean 0, std 1).
  Formalised from arXiv 2605.13217 (docs/methods.md#gagpo); the action-level ratio of its loss is
  `losses.policy.turn_mean_log_ratio`.

  Args:
    step_rewards: `[B, N]` float `r_{b,k}`, turns over `[0, N)`.
    anchor_hash: `[B, N]` int state before turn `k` (see `anchor_hashes`).
    turn_mask: `[B, N]` bool.
    group_id: `[B]` int in `[0, B)`.
    discount: γ.
    lambda_: λ.
    eps: added to the std.
    singleton: see `grouped_value_proxy`.
    weights: optional `[B]` 0/1 mask of trajectories to include.

  Returns:
    `GAGPOOutput`.
  """
  chex.assert_rank([step_rewards, anchor_hash, turn_mask, group_id], [2, 2, 2, 1])
  chex.assert_equal_shape([step_rewards, anchor_hash, turn_mask])
  if singleton not in GAGPO_SINGLETON_RULES:
    raise ValueError(f"singleton must be one of {GAGPO_SINGLETON_RULES}, got {singleton!r}")
  b, n = step_rewards.shape
  keep = jnp.ones((b,), bool) if weights is None else jnp.asarray(weights) > 0
  rows = jnp.asarray(turn_mask).astype(bool) & keep[:, None]
  rewards = step_rewards.astype(jnp.float32)
  returns = step_returns(rewards, rows, discount)
  values = grouped_value_proxy(returns, anchor_hash, rows, group_id, singleton)
  raw = gae_lib.generalized_advantage_estimation(
      rewards, values, rows, discount, lambda_).advantages
  gid = jnp.broadcast_to(jnp.asarray(group_id)[:, None], (b, n)).reshape(-1)
  normalized = group.group_relative_advantages(
      raw.reshape(-1), gid, b, normalize_by_std=True, eps=eps,
      weights=rows.reshape(-1).astype(jnp.float32)).reshape(b, n)
  return GAGPOOutput(advantages=normalized, raw_advantages=raw, state_values=values)


def trajectory_anchor_hashes(traj: types.Trajectories, anchor_key: str | None = None) -> Array:
  """`anchor_hashes` of a batch, with the initial hash from `traj.extras` when present.

  With `anchor_key`, `traj.extras[anchor_key]` ([B, N], the key of the state each turn acts
  from, e.g. SLEA's structural cluster) is the anchor instead of the exact observation hash.
  """
  if anchor_key is not None:
    if anchor_key not in traj.extras:
      raise ValueError(f"anchor_key={anchor_key!r} is not in traj.extras (have "
                       f"{sorted(traj.extras)}); the env must report it in each step's info")
    keys = jnp.asarray(traj.extras[anchor_key])
    if keys.shape != traj.obs_hash.shape:
      raise ValueError(f"traj.extras[{anchor_key!r}] has shape {keys.shape}; anchors are per turn "
                       f"{traj.obs_hash.shape}")
    return keys.astype(jnp.int32)
  initial = traj.extras.get(extra_keys.INITIAL_OBS_HASH_KEY)
  if initial is not None:
    initial = jnp.asarray(initial)
  return anchor_hashes(jnp.asarray(traj.obs_hash), initial)


def similar_anchor_ids(
    anchor_observations: Sequence[Sequence[str]],
    group_id,
    max_turns: int,
    threshold: float = 0.95,
) -> np.ndarray:
  """Host-side GiGPO `enable_similarity` grouping: anchor ids from near-duplicate observation text.

  Inside each group, rows are visited in order (trajectory-major, then turn); a row joins the first
  cluster whose representative (its first member) has `difflib.SequenceMatcher` ratio ≥ `threshold`
  with the row's text, or opens a new cluster. The result replaces exact hashes as `anchor_hash` in
  `gigpo_advantages` / `gagpo_advantages`. This is Python over strings, O(rows · clusters) ratio
  calls per group, and belongs on the host next to the rollout, never under jit.

  Args:
    anchor_observations: per trajectory, the observation text each turn acts from (the state before
      the turn's action), one string per existing turn.
    group_id: `[B]` int group ids.
    max_turns: N, the static turn dimension of the output.
    threshold: similarity needed to join a cluster (0.95 in verl-agent).

  Returns:
    `[B, N]` int32 cluster ids, unique within a group; −1 on missing turns.
  """
  group_id = np.asarray(group_id)
  if len(anchor_observations) != group_id.shape[0]:
    raise ValueError(f"got {len(anchor_observations)} trajectories of observations for "
                     f"{group_id.shape[0]} group ids")
  out = np.full((group_id.shape[0], max_turns), -1, np.int32)
  representatives: dict[int, list[str]] = {}
  for b, texts in enumerate(anchor_observations):
    if len(texts) > max_turns:
      raise ValueError(f"trajectory {b} has {len(texts)} turns, more than max_turns={max_turns}")
    clusters = representatives.setdefault(int(group_id[b]), [])
    for k, text in enumerate(texts):
      for index, representative in enumerate(clusters):
        if difflib.SequenceMatcher(None, text, representative).ratio() >= threshold:
          out[b, k] = index
          break
      else:
        out[b, k] = len(clusters)
        clusters.append(text)
  return out
