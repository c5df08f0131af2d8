"""ARPO-style entropy branching: spend part of each prompt's sample budget on branches taken where
the policy grows uncertain after an environment response (docs/methods.md#arpo).

Each prompt group has M rows (its budget). The first N start as full rollouts; the other M − N
are dormant slots filled by branching. After every environment response (turn k ≥ 1), each live
row's new generation is scored by its entropy H (the first `entropy_tokens` action tokens, top-k
entropy normalised by log|V|, summed); with ΔH = H − H_init (H_init: the row's first turn) and
u ~ U(0, 1), the row branches iff clip(u − w·ΔH, 0, 1) ≤ τ, i.e. with probability
clip(τ + w·ΔH, 0, 1), up to `beam_size − 1` times per turn while slots remain. A branch copies the
row's prefix up to and including the new observation (tokens, KV cache rows, env by deep copy) and
samples the turn's action, and everything after, with its own row id. A group that made no branch
in a round branches once from its first live rollout. Slots still empty when every row of the
group has ended are played as fresh rollouts from the prompt, so a group always returns exactly
M samples.

Advantage attribution is the estimator's business: with GRPO every path is a sample (the hard
attribution of the source), and shared prefix tokens are simply observations of several rows.

Differences from the source: the branch point is the start of an action turn (the text envs here
respond to every turn, so every turn follows a "tool call"); unfilled slots are played from the
prompt rather than left to a later round.

Gin: `learner.train.strategy = @arpo.EntropyBranching()`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout.strategies import common

_BRANCH_SALT = 0xA290


def branch_probability(delta_h: np.ndarray, tau: float, weight: float) -> np.ndarray:
  """P(branch) = clip(τ + w·ΔH, 0, 1)."""
  return np.clip(tau + weight * np.asarray(delta_h, np.float64), 0.0, 1.0)


def branch_decisions(u: np.ndarray, delta_h: np.ndarray, tau: float, weight: float) -> np.ndarray:
  """Branch iff p = clip(u − w·ΔH, 0, 1) ≤ τ, for u ~ U(0, 1) (so P = `branch_probability`)."""
  p = np.clip(np.asarray(u, np.float64) - weight * np.asarray(delta_h, np.float64), 0.0, 1.0)
  return p <= tau


def branch_uniforms(key: jax.Array, row_ids: np.ndarray, num: int) -> np.ndarray:
  """[B, num] u ~ U(0, 1) per row, from the row's global id only."""
  keys = sampler_lib.row_keys(jax.random.fold_in(key, _BRANCH_SALT), np.asarray(row_ids, np.int32))
  return np.asarray(jax.vmap(lambda k: jax.random.uniform(k, (num,)))(keys))


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EntropyBranching:
  """Entropy-triggered branching (defaults: the source's scripts, except M = the group size).

  Attributes:
    initial_rollouts: N, full rollouts started per group (a group smaller than N branches never).
    beam_size: a source makes at most beam_size − 1 branches per turn.
    branch_probability: τ, the branch probability at ΔH = 0.
    entropy_weight: w, how much rising entropy raises the branch probability.
    entropy_tokens: k, action tokens of a turn whose entropies are summed into H.
    top_k: log-probs per token the entropy is taken over.
  """

  initial_rollouts: int = 8
  beam_size: int = 2
  branch_probability: float = 0.5
  entropy_weight: float = 0.2
  entropy_tokens: int = 20
  top_k: int = 10

  def __post_init__(self):
    if self.initial_rollouts < 1:
      raise ValueError(f"EntropyBranching.initial_rollouts must be >= 1, got {self.initial_rollouts}")
    if self.beam_size < 1:
      raise ValueError(f"EntropyBranching.beam_size must be >= 1, got {self.beam_size}")
    if not 0.0 <= self.branch_probability <= 1.0:
      raise ValueError(f"EntropyBranching.branch_probability must be in [0, 1], got "
                       f"{self.branch_probability}")
    if self.entropy_tokens < 1 or self.top_k < 1:
      raise ValueError(f"EntropyBranching.entropy_tokens and top_k must be >= 1, got "
                       f"{self.entropy_tokens}, {self.top_k}")

  def _entropy(self, tool, params, batch, draw, turn) -> np.ndarray:
    stats = common.turn_token_stats(tool, params, batch, draw, turn, self.top_k)
    k = self.entropy_tokens
    return (np.asarray(stats.entropy)[:, :k] * np.asarray(stats.valid)[:, :k]).sum(axis=1)

  def _branch_pairs(self, batch: common.RowBatch, dormant: np.ndarray, groups: np.ndarray,
                    delta_h: np.ndarray, key: jax.Array) -> list[tuple[int, int]]:
    """(slot, source) pairs of this turn's branches."""
    u = branch_uniforms(key, batch.row_ids, max(self.beam_size - 1, 1))
    pairs = []
    for g in np.unique(groups[dormant]):
      rows = np.flatnonzero(groups == g)
      free = [int(r) for r in rows if dormant[r]]
      sources = [int(r) for r in rows if batch.active[r]]
      made = 0
      for s in sources:
        for j in range(self.beam_size - 1):
          if free and branch_decisions(u[s, j], delta_h[s], self.branch_probability,
                                       self.entropy_weight):
            pairs.append((free.pop(0), s))
            made += 1
      if not made and free and sources:  # no branching this round: one from the first rollout
        pairs.append((free.pop(0), sources[0]))
    return pairs

  def collect(self, runner: loop_lib.RolloutRunner, make_env: common.MakeEnv,
              seeds: Sequence[int], group_ids: Sequence[int], *, params, rng: jax.Array,
              row_ids: Sequence[int] | None = None
              ) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
    """Plays each group's budget of M = group-size samples with entropy branching.

    Returns ordinary `Trajectories` plus, per row, `extras["arpo_source"]` (the row it branched
    from; −1 for an initial rollout, −2 for a slot played from the prompt),
    `extras["arpo_branch_turn"]` (the turn it branched at, −1 if none) and per turn
    `extras["arpo_entropy"]` [B, N] (H of each played turn).
    """
    row_ids = common.check_inputs(seeds, group_ids, row_ids)
    start_time = time.perf_counter()
    tool = common.tools(runner)
    b, n_turns = len(seeds), runner.config.max_turns
    groups = np.asarray(group_ids, np.int32)
    common.check_groups_share_seeds(seeds, group_ids, "EntropyBranching")
    initial = np.zeros(b, bool)
    for g in np.unique(groups):
      initial[np.flatnonzero(groups == g)[:self.initial_rollouts]] = True
    batch = common.start(runner, [make_env() for _ in seeds], seeds, group_ids, row_ids,
                         active=initial)
    stats = loop_lib.RolloutStats(episodes=b)
    dormant = ~initial
    h_init = np.zeros(b)
    entropy = np.zeros((b, n_turns), np.float32)
    source = np.where(initial, -1.0, -2.0).astype(np.float32)
    branch_turn = np.full(b, -1.0, np.float32)
    for turn in range(n_turns):
      common.append_observations(runner, batch, turn, stats)
      if not batch.active.any():
        break
      key = common.turn_key(rng, turn)
      draw = common.sample_turn(tool, params, batch, turn, key)
      h = self._entropy(tool, params, batch, draw, turn)
      if turn == 0:
        h_init[draw.rows] = h[draw.rows]
      elif dormant.any():
        pairs = self._branch_pairs(batch, dormant, groups, h - h_init, key)
        if pairs:
          slots = np.array([p[0] for p in pairs])
          sources = np.array([p[1] for p in pairs])
          common.copy_rows(batch, slots, sources)
          dormant[slots] = False
          h_init[slots] = h_init[sources]
          entropy[slots, :turn] = entropy[sources, :turn]  # the shared turns are the source's
          source[slots] = sources
          branch_turn[slots] = turn
          # The branch samples this turn's action itself, with its own row id.
          extra = common.sample_turn(tool, params, batch, turn, key, rows=slots)
          h[slots] = self._entropy(tool, params, batch, extra, turn)[slots]
          for i in slots:
            draw.tokens[i], draw.logprobs[i] = extra.tokens[i], extra.logprobs[i]
          taken = np.zeros(b, bool)
          taken[slots] = True
          draw.cache = common.where_cache_rows(taken, extra.cache, draw.cache)
          draw.rows = np.union1d(draw.rows, slots)
      entropy[draw.rows, turn] = h[draw.rows]
      common.play_turn(runner, tool, batch, draw, turn, stats)
    common.close(runner, batch, stats)
    if dormant.any():
      self._play_from_prompt(runner, tool, batch, dormant, seeds, group_ids, params, rng, stats)
    batch.traj.extras[extra_keys.ARPO_SOURCE_KEY] = source
    batch.traj.extras[extra_keys.ARPO_BRANCH_TURN_KEY] = branch_turn
    batch.traj.extras[extra_keys.ARPO_ENTROPY_KEY] = entropy
    return common.finish(runner, batch, stats, start_time)

  def _play_from_prompt(self, runner, tool, batch, rows_mask, seeds, group_ids, params, rng, stats):
    """Plays the still-empty slots as fresh rollouts in a batch of the same shape (no recompile)."""
    fill = common.start(runner, list(batch.envs), seeds, group_ids,
                        batch.row_ids, active=rows_mask)
    common.play(runner, tool, fill, params, rng, stats)
    rows = np.flatnonzero(rows_mask)
    common.copy_traj_rows(batch.traj, rows, fill.traj, rows)
    batch.cursor[rows] = fill.cursor[rows]
