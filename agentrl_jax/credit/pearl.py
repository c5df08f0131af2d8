"""PEARL — process-experience aware RL: strengthen negative credit at recurring failures.

Two continuations of the same history with different outcomes first diverge at some turn `k*`.
PEARL featurizes each branch's decision there, keeps recent failure and success decisions in a
memory, clusters the failures, and — for a new lower-reward decision `x` that falls in a
*recurring* failure cluster and looks like no recent success — strengthens its negative credit:

  cluster c(x): the nearest centroid by cosine, if cos ≥ τ_c (online clustering, running means)
  recurring:    |c(x)| ≥ n_min and c(x) holds entries from ≥ 2 training steps
  success veto: max_{s ∈ S} cos(x, s) ≥ τ_s
  A'_t = A_t·(1 + β·ρ(x)),  ρ(x) = min(1, |c(x)|/n_sat)     for t in turn k* (or ≥ k*) with A_t < 0

Positive and zero advantages are never touched, and `(1 + β)·A ≤ A' ≤ A` on negatives.

Siblings are the trajectories of one `group_id` (same task and seed, hence the same first
observation); a pair is `(i, j)` with `outcome_i < outcome_j`, and each lower trajectory is paired
with the higher sibling that shares its longest action prefix. The memory lives on the host in
`PearlMemory`; the shaping itself is the pure `pearl_shaping` over arrays.
"""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array

LOCATIONS = ("divergence_turn", "suffix")
_NUM_FLAGS = 3


class Decisions(NamedTuple):
  """The first-divergence decisions of a batch, one row per (lower) trajectory.

  Attributes:
    lower: `[B]` bool, the trajectory has a higher-reward sibling with a decision at `turn`.
    turn: `[B]` int32 first-divergence turn k* (0 where `lower` is False).
    partner: `[B]` int32 index of the higher-reward sibling.
    lower_features: `[B, d]` unit-norm feature of the lower branch's decision at k*.
    upper_features: `[B, d]` unit-norm feature of the partner's decision at k*.
    upper_success: `[B]` bool, the partner succeeded (its decision enters the success bank).
  """

  lower: Array
  turn: Array
  partner: Array
  lower_features: Array
  upper_features: Array
  upper_success: Array


class MemoryArrays(NamedTuple):
  """Fixed-capacity view of the memory the jitted shaping reads.

  Attributes:
    centroids: `[C, d]` failure-cluster centroids (rows past `cluster_valid` are zero).
    counts: `[C]` float32 entries per cluster.
    recurring: `[C]` bool, count ≥ n_min and entries from ≥ 2 training steps.
    cluster_valid: `[C]` bool.
    successes: `[S, d]` success-bank features.
    success_valid: `[S]` bool.
  """

  centroids: Array
  counts: Array
  recurring: Array
  cluster_valid: Array
  successes: Array
  success_valid: Array


def decision_features(traj: types.Trajectories, *, embed_dim: int = 32, num_buckets: int = 4096,
                      seed: int = 0) -> Array:
  """`[B, N, embed_dim + 3]` unit-norm feature of each turn's decision.

  (a) a frozen embedding of the action text: the mean of fixed random vectors of its token ids
  (bucketed), standing in for a frozen sentence encoder; (b) the action's identity enters through
  the same ids; (c) error flags of the resulting observation: rejected action, env fault, and
  observation unchanged (a no-op).
  """
  table = jax.random.normal(jax.random.key(seed), (num_buckets, embed_dim)) / np.sqrt(embed_dim)
  tokens = jnp.asarray(traj.tokens) % num_buckets
  onehot = trajectory.turn_one_hot(traj).astype(jnp.float32)                       # [B, L, N]
  count = jnp.maximum(jnp.sum(onehot, axis=1), 1.0)[..., None]
  text = jnp.einsum("bln,bld->bnd", onehot, table[tokens]) / count
  anchor, known = trajectory.anchor_hashes(traj)
  flags = jnp.stack([
      ~jnp.asarray(traj.action_valid, bool),
      jnp.asarray(traj.env_error, bool),
      (jnp.asarray(traj.obs_hash) == anchor) & known,
  ], axis=-1).astype(jnp.float32)
  features = jnp.concatenate([text, flags], axis=-1)
  return features / jnp.maximum(jnp.linalg.norm(features, axis=-1, keepdims=True), 1e-8)


def common_prefix_turns(fingerprint: Array, turn_mask: Array) -> Array:
  """`[B, B]` int32: number of leading turns on which trajectories i and j took the same action."""
  chex.assert_rank([fingerprint, turn_mask], 2)
  turn_mask = turn_mask.astype(bool)
  same = ((fingerprint[:, None, :] == fingerprint[None, :, :])
          & turn_mask[:, None, :] & turn_mask[None, :, :])
  return jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=2), axis=2)


def first_divergence(traj: types.Trajectories, features: Array) -> Decisions:
  """Pairs each trajectory with the higher-reward sibling sharing its longest action prefix.

  Args:
    traj: the batch; siblings share `group_id`, rewards are `outcome`.
    features: `[B, N, d]` from `decision_features`.
  """
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  b, n = turn_mask.shape
  prefix = common_prefix_turns(trajectory.action_fingerprints(traj), turn_mask)
  num_turns = jnp.sum(turn_mask, axis=1)
  outcome = jnp.asarray(traj.outcome, jnp.float32)
  group_id = jnp.asarray(traj.group_id)
  ok = jnp.asarray(traj.valid_trajectory)
  valid = ((group_id[:, None] == group_id[None, :]) & (outcome[:, None] < outcome[None, :])
           & ok[:, None] & ok[None, :]
           & (prefix < num_turns[:, None]) & (prefix < num_turns[None, :]))
  best_prefix = jnp.max(jnp.where(valid, prefix, -1), axis=1)
  candidates = valid & (prefix == best_prefix[:, None])
  partner = jnp.argmax(jnp.where(candidates, outcome[None, :], -jnp.inf), axis=1).astype(jnp.int32)
  lower = jnp.any(valid, axis=1)
  turn = jnp.where(lower, best_prefix, 0).astype(jnp.int32)
  rows = jnp.arange(b)
  return Decisions(
      lower=lower, turn=turn, partner=partner,
      lower_features=features[rows, turn],
      upper_features=features[partner, turn],
      upper_success=lower & jnp.asarray(traj.success, bool)[partner])


def pearl_shaping(advantages: Array, turn_of_token: Array, action_mask: Array,
                  decisions: Decisions, memory: MemoryArrays, *,
                  cluster_threshold: float = 0.85, success_threshold: float = 0.90,
                  saturation: int = 10, beta: float = 0.5,
                  location: str = "divergence_turn") -> Array:
  """The PEARL kernel: `A' = A·(1 + β·ρ)` on the matched negative tokens; identity elsewhere.

  Args:
    advantages: `[B, L]` token advantages from any estimator.
    turn_of_token: `[B, L]` int32 turn of each token.
    action_mask: `[B, L]` bool.
    decisions: from `first_divergence`.
    memory: the memory before this batch.
    cluster_threshold: τ_c.
    success_threshold: τ_s.
    saturation: n_sat ≥ 1.
    beta: β ≥ 0.
    location: "divergence_turn" (default: turn k* only) or "suffix" (turns ≥ k*).
  """
  _check(cluster_threshold, success_threshold, saturation, beta, location)
  chex.assert_rank([advantages, turn_of_token, action_mask], 2)
  x = decisions.lower_features
  unit = lambda v: v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-8)
  cos = jnp.where(memory.cluster_valid[None, :], x @ unit(memory.centroids).T, -jnp.inf)
  nearest = jnp.argmax(cos, axis=1)
  in_cluster = jnp.max(cos, axis=1) >= cluster_threshold
  rho = jnp.minimum(1.0, memory.counts[nearest] / saturation)
  success_cos = jnp.where(memory.success_valid[None, :], x @ unit(memory.successes).T, -jnp.inf)
  vetoed = jnp.max(success_cos, axis=1, initial=-jnp.inf) >= success_threshold
  strengthen = decisions.lower & in_cluster & memory.recurring[nearest] & ~vetoed
  turn = decisions.turn[:, None]
  at = turn_of_token == turn if location == "divergence_turn" else turn_of_token >= turn
  selected = at & action_mask.astype(bool) & strengthen[:, None] & (advantages < 0)
  factor = 1.0 + beta * rho[:, None]
  scaled = (advantages.astype(jnp.float32) * factor).astype(advantages.dtype)
  return jnp.where(selected, scaled, advantages)


class PearlMemory:
  """Correction: PEARL with its host-side memory of recent failures and successes.

  `__call__(traj, advantages)` shapes the batch against the memory as it stood *before* the
  batch, then adds the batch's decisions to the memory (one training step per call). Called
  inside the learner's jitted update, it reads the memory and writes the new decisions through
  host callbacks, so the memory keeps changing although the update is traced once; called on
  concrete arrays it does the same directly. `state_dict()`/`load_state_dict()` carry the memory
  through checkpoints.
  """

  def __init__(self, *, window: int = 5, cluster_threshold: float = 0.85,
               success_threshold: float = 0.90, min_count: int = 3, saturation: int = 10,
               beta: float = 0.5, location: str = "divergence_turn", max_clusters: int = 256,
               max_successes: int = 1024, embed_dim: int = 32, feature_seed: int = 0,
               update_memory: bool = True):
    """Args:
      window: W, training steps the memory remembers (default 5).
      cluster_threshold: τ_c (default 0.85).
      success_threshold: τ_s (default 0.90).
      min_count: n_min (default 3).
      saturation: n_sat (default 10).
      beta: β (default 0.5).
      location: "divergence_turn" (default) or "suffix".
      max_clusters, max_successes: capacities of the arrays the jitted shaping reads.
      embed_dim, feature_seed: the frozen action-text embedding.
      update_memory: add each batch's decisions to the memory (False: read-only).
    """
    _check(cluster_threshold, success_threshold, saturation, beta, location)
    for name, value in (("window", window), ("min_count", min_count), ("max_clusters", max_clusters),
                        ("max_successes", max_successes), ("embed_dim", embed_dim)):
      if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"PearlMemory.{name} must be an int >= 1, got {value!r}")
    self.window, self.min_count = window, min_count
    self.cluster_threshold, self.success_threshold = cluster_threshold, success_threshold
    self.saturation, self.beta, self.location = saturation, beta, location
    self.max_clusters, self.max_successes = max_clusters, max_successes
    self.embed_dim, self.feature_seed = embed_dim, feature_seed
    self.update_memory = update_memory
    self.feature_dim = embed_dim + _NUM_FLAGS
    self.step = 0
    self._failures: collections.deque[tuple[int, np.ndarray]] = collections.deque()
    self._successes: collections.deque[tuple[int, np.ndarray]] = collections.deque()

  # -- the pure part ---------------------------------------------------------------------------

  def decisions(self, traj: types.Trajectories) -> Decisions:
    features = decision_features(traj, embed_dim=self.embed_dim, seed=self.feature_seed)
    return first_divergence(traj, features)

  def __call__(self, traj: types.Trajectories, advantages: Array) -> Array:
    decisions = self.decisions(traj)
    traced = isinstance(advantages, jax.core.Tracer)
    if traced:
      memory = jax.pure_callback(self._memory_numpy, self._memory_shapes(), vmap_method="sequential")
    else:
      memory = self.memory_arrays()
    shaped = pearl_shaping(
        advantages, jnp.asarray(traj.turn_of_token), jnp.asarray(traj.action_mask), decisions,
        memory, cluster_threshold=self.cluster_threshold,
        success_threshold=self.success_threshold, saturation=self.saturation, beta=self.beta,
        location=self.location)
    if self.update_memory:
      if traced:
        # Passing the shaped sum orders the write after the read above.
        jax.debug.callback(self._observe_callback, decisions, jnp.sum(shaped))
      else:
        self.observe(jax.device_get(decisions))
    return shaped

  # -- the host-side memory --------------------------------------------------------------------

  def observe(self, decisions: Decisions) -> None:
    """Adds one training step's decisions to the memory and forgets steps older than the window."""
    self.step += 1
    lower = np.asarray(decisions.lower, bool)
    for row in np.flatnonzero(lower):
      self._failures.append((self.step, np.asarray(decisions.lower_features[row], np.float32)))
      if decisions.upper_success[row]:
        self._successes.append((self.step, np.asarray(decisions.upper_features[row], np.float32)))
    for bank in (self._failures, self._successes):
      while bank and bank[0][0] <= self.step - self.window:
        bank.popleft()
    while len(self._successes) > self.max_successes:
      self._successes.popleft()

  def _observe_callback(self, decisions: Decisions, _order: Any) -> None:
    self.observe(decisions)

  def clusters(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Online clustering of the failure memory in arrival order.

    Returns (centroids [c, d], counts [c], distinct training steps [c]).
    """
    centroids: list[np.ndarray] = []
    counts: list[int] = []
    steps: list[set[int]] = []
    for step, x in self._failures:
      if centroids:
        matrix = np.stack(centroids)
        cos = matrix @ x / np.maximum(np.linalg.norm(matrix, axis=1) * np.linalg.norm(x), 1e-8)
        best = int(np.argmax(cos))
        if cos[best] >= self.cluster_threshold:
          counts[best] += 1
          centroids[best] = centroids[best] + (x - centroids[best]) / counts[best]
          steps[best].add(step)
          continue
      centroids.append(x.copy())
      counts.append(1)
      steps.append({step})
    d = self.feature_dim
    return (np.stack(centroids) if centroids else np.zeros((0, d), np.float32),
            np.asarray(counts, np.float32), np.asarray([len(s) for s in steps], np.int32))

  def memory_arrays(self) -> MemoryArrays:
    """The memory as fixed-capacity arrays (the largest clusters and the latest successes)."""
    centroids, counts, distinct = self.clusters()
    keep = np.argsort(-counts, kind="stable")[:self.max_clusters]
    c, s, d = self.max_clusters, self.max_successes, self.feature_dim
    out_centroids = np.zeros((c, d), np.float32)
    out_counts = np.zeros((c,), np.float32)
    recurring = np.zeros((c,), bool)
    valid = np.zeros((c,), bool)
    out_centroids[:len(keep)] = centroids[keep]
    out_counts[:len(keep)] = counts[keep]
    recurring[:len(keep)] = (counts[keep] >= self.min_count) & (distinct[keep] >= 2)
    valid[:len(keep)] = True
    successes = np.zeros((s, d), np.float32)
    success_valid = np.zeros((s,), bool)
    if self._successes:
      bank = np.stack([x for _, x in self._successes])[-s:]
      successes[:len(bank)] = bank
      success_valid[:len(bank)] = True
    return MemoryArrays(centroids=out_centroids, counts=out_counts, recurring=recurring,
                        cluster_valid=valid, successes=successes, success_valid=success_valid)

  def _memory_numpy(self) -> MemoryArrays:
    return self.memory_arrays()

  def _memory_shapes(self) -> MemoryArrays:
    c, s, d = self.max_clusters, self.max_successes, self.feature_dim
    f32, boolean = np.float32, np.bool_
    return MemoryArrays(
        centroids=jax.ShapeDtypeStruct((c, d), f32), counts=jax.ShapeDtypeStruct((c,), f32),
        recurring=jax.ShapeDtypeStruct((c,), boolean), cluster_valid=jax.ShapeDtypeStruct((c,), boolean),
        successes=jax.ShapeDtypeStruct((s, d), f32), success_valid=jax.ShapeDtypeStruct((s,), boolean))

  def state_dict(self) -> dict[str, np.ndarray]:
    """The memory as arrays; `{k: v.tolist()}` of it is JSON and loads back the same."""
    d = self.feature_dim

    def bank(entries):
      steps = np.asarray([s for s, _ in entries], np.int64)
      feats = np.stack([x for _, x in entries]) if entries else np.zeros((0, d), np.float32)
      return steps, feats

    f_steps, f_feats = bank(self._failures)
    s_steps, s_feats = bank(self._successes)
    return {"step": np.asarray(self.step, np.int64), "failure_steps": f_steps,
            "failure_features": f_feats, "success_steps": s_steps, "success_features": s_feats}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    needed = ("step", "failure_steps", "failure_features", "success_steps", "success_features")
    missing = [k for k in needed if k not in state]
    if missing:
      raise ValueError(f"PearlMemory.load_state_dict: missing {missing}")
    features = {}
    for key in ("failure_features", "success_features"):
      value = np.asarray(state[key], np.float32)
      if value.size == 0:
        value = value.reshape(0, self.feature_dim)
      if value.ndim != 2 or value.shape[1] != self.feature_dim:
        raise ValueError(f"PearlMemory.load_state_dict: {key} must be [n, {self.feature_dim}], "
                         f"got {list(value.shape)}")
      features[key] = value
    self.step = int(state["step"])
    self._failures = collections.deque(
        (int(s), x) for s, x in zip(np.asarray(state["failure_steps"]), features["failure_features"]))
    self._successes = collections.deque(
        (int(s), x) for s, x in zip(np.asarray(state["success_steps"]), features["success_features"]))


def _check(cluster_threshold: float, success_threshold: float, saturation: int, beta: float,
           location: str) -> None:
  for name, value in (("cluster_threshold", cluster_threshold), ("success_threshold", success_threshold)):
    if not -1.0 <= value <= 1.0:
      raise ValueError(f"pearl {name} is a cosine and must be in [-1, 1], got {value!r}")
  if not (isinstance(saturation, int) and saturation >= 1):
    raise ValueError(f"pearl saturation must be an int >= 1, got {saturation!r}")
  if not beta >= 0:
    raise ValueError(f"pearl beta must be >= 0, got {beta!r}")
  if location not in LOCATIONS:
    raise ValueError(f"pearl location must be one of {LOCATIONS}, got {location!r}")
