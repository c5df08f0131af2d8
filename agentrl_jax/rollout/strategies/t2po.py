"""T²PO turn-level dynamic sampling (TDS): resample turns that made no exploration progress.

Each sampled turn gets a self-calibrated uncertainty score U (entropy fused with confidence over
the response's tokens). A turn whose score barely moved against the row's previous turn,
0 < |U_k − U_{k−1}| < η, is sampled again from the same prefix, at most `max_try` times,
recomputing the test after each draw; the last draw is kept even if it still fails. Turn 0 is
never resampled, and Δ = 0 exactly is not resampled (the source's strict `> 0`). The number of
episodes and turns never changes; only which action a turn keeps.

Score [ABSTRACT in the spec]: per action token j, H_j = top-k entropy / log|V| and C_j = max p;
M_j = α·H̄_j + (1 − α)·(1 − C̄_j) with bars = trailing means over the last `window` tokens;
U = mean_j M_j over the response.

Token-level thinking intervention: set `SamplingConfig.thinking` (`sampler.ThinkingConfig`); the
decode loop then closes a thinking block once M stalls after j_min tokens or the block reaches its
budget. The strategy's draws (first and resampled) go through that loop, and the close tokens it
forced are kept in the conversation but out of `action_mask`, as in `RolloutRunner.collect`.
The turn score U is taken over all of a response's tokens, forced ones included.

Gin: `learner.train.strategy = @t2po.TurnResampling()`.
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
from agentrl_jax.rollout.strategies import common

_RETRY_SALT = 0x7D5


def turn_uncertainty(entropy: np.ndarray, confidence: np.ndarray, valid: np.ndarray, *,
                     alpha: float, window: int) -> np.ndarray:
  """U [B] = mean_j M_j, M_j = α·H̄_j + (1 − α)·(1 − C̄_j), over each row's valid tokens.

  Args:
    entropy, confidence, valid: [B, A] per action token (valid tokens lead each row).
    alpha: weight of the entropy term.
    window: w, the trailing window of the moving averages H̄_j, C̄_j (tokens j−w+1..j).
  Returns:
    [B] float64; 0 for rows with no tokens.
  """
  valid = np.asarray(valid, bool)
  m = np.zeros(valid.shape[0])
  for b in range(valid.shape[0]):
    n = int(valid[b].sum())
    if not n:
      continue
    h = np.asarray(entropy[b, :n], np.float64)
    c = np.asarray(confidence[b, :n], np.float64)
    scores = []
    for j in range(n):
      lo = max(0, j - window + 1)
      scores.append(alpha * h[lo:j + 1].mean() + (1 - alpha) * (1 - c[lo:j + 1].mean()))
    m[b] = np.mean(scores)
  return m


def resample_mask(u: np.ndarray, prev_u: np.ndarray, candidates: np.ndarray, turn: int,
                  threshold: float) -> np.ndarray:
  """[B] bool: regenerate iff turn ≥ 1 and 0 < |U_k − U_{k−1}| < η (strict on both sides)."""
  if turn == 0:
    return np.zeros(u.shape, bool)
  delta = np.abs(u - prev_u)
  return np.asarray(candidates, bool) & (delta > 0) & (delta < threshold)


class _ForcedRecorder:
  """Wraps a runner's jitted turn samplers to keep the last call's `TurnSample.forced`.

  `common.sample_turn` returns ids and log-probs only; the forced flags line up with a row's
  kept ids (a stop-string cut only drops a tail), so they are read back after each draw.
  """

  def __init__(self, tool: common.Tools):
    self.last = None
    self.tool = dataclasses.replace(tool, sample_turn=self._wrap(tool.sample_turn),
                                    greedy_turn=self._wrap(tool.greedy_turn))

  def _wrap(self, fn):
    def recorded(*args, **kwargs):
      out = fn(*args, **kwargs)
      self.last = out.forced
      return out
    return recorded

  def forced(self, draw: common.TurnDraw) -> list[np.ndarray]:
    """Per row, which of the last draw's kept tokens were forced (all False with thinking off)."""
    flags = None if self.last is None else np.asarray(jax.device_get(self.last))
    return [np.zeros(len(ids), bool) if flags is None else flags[i, :len(ids)].copy()
            for i, ids in enumerate(draw.tokens)]


def _unmask_forced(batch: common.RowBatch, rows: np.ndarray, forced: list[np.ndarray],
                   turn: int) -> None:
  """Takes the forced tokens of the just-written turn out of `action_mask` (they stay in
  `tokens`; their sample log-prob is already 0) and counts them per turn."""
  traj = batch.traj
  counts = traj.extras.setdefault(extra_keys.THINK_FORCED_KEY,
                                  np.zeros(traj.reward.shape, np.float32))
  for i in rows:
    start = traj.turn_start[i, turn]
    traj.action_mask[i, start:start + len(forced[i])] &= ~forced[i]
    counts[i, turn] = float(forced[i].sum())


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TurnResampling:
  """Turn-level dynamic sampling (defaults: η and max_try from the source's scripts).

  Attributes:
    threshold: η; a turn with 0 < ΔU < η is resampled.
    max_try: most regenerations of one turn.
    alpha: α, entropy vs (1 − confidence) in M.
    window: w, moving-average window of M, in tokens.
    top_k: log-probs per token the entropy is taken over.
  """

  threshold: float = 0.3
  max_try: int = 2
  alpha: float = 0.5
  window: int = 32
  top_k: int = 20

  def __post_init__(self):
    if self.threshold < 0:
      raise ValueError(f"TurnResampling.threshold must be >= 0, got {self.threshold}")
    if self.max_try < 0:
      raise ValueError(f"TurnResampling.max_try must be >= 0, got {self.max_try}")
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"TurnResampling.alpha must be in [0, 1], got {self.alpha}")
    if self.window < 1 or self.top_k < 1:
      raise ValueError(f"TurnResampling.window and top_k must be >= 1, got {self.window}, {self.top_k}")

  def _uncertainty(self, tool, params, batch, draw, turn) -> np.ndarray:
    stats = common.turn_token_stats(tool, params, batch, draw, turn, self.top_k)
    return turn_uncertainty(stats.entropy, stats.confidence, stats.valid, alpha=self.alpha,
                            window=self.window)

  def collect(self, runner: loop_lib.RolloutRunner, make_env: common.MakeEnv,
              seeds: Sequence[int], group_ids: Sequence[int], *, params, rng: jax.Array,
              row_ids: Sequence[int] | None = None
              ) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
    """Plays one episode per seed with TDS.

    Returns ordinary `Trajectories` plus `extras["t2po_uncertainty"]` [B, N] (U of each kept turn)
    and `extras["t2po_retries"]` [B, N] (regenerations of each turn); with
    `SamplingConfig.thinking` also `extras[extra_keys.THINK_FORCED_KEY]` [B, N] (forced closes).
    """
    row_ids = common.check_inputs(seeds, group_ids, row_ids)
    start_time = time.perf_counter()
    thinking = runner.config.sampling.thinking is not None
    recorder = _ForcedRecorder(common.tools(runner, thinking_ok=True))
    tool = recorder.tool
    b, n_turns = len(seeds), runner.config.max_turns
    batch = common.start(runner, [make_env() for _ in seeds], seeds, group_ids, row_ids)
    stats = loop_lib.RolloutStats(episodes=b)
    kept_u = np.zeros((b, n_turns), np.float32)
    retries = np.zeros((b, n_turns), np.float32)
    prev_u = np.zeros(b)
    for turn in range(n_turns):
      common.append_observations(runner, batch, turn, stats)
      if not batch.active.any():
        break
      key = common.turn_key(rng, turn)
      draw = common.sample_turn(tool, params, batch, turn, key)
      forced = recorder.forced(draw)
      u = self._uncertainty(tool, params, batch, draw, turn)
      for attempt in range(1, self.max_try + 1):
        redo = resample_mask(u, prev_u, batch.active, turn, self.threshold)
        if not redo.any():
          break
        again = common.sample_turn(tool, params, batch, turn,
                                   common.retry_key(key, _RETRY_SALT, attempt), rows=np.flatnonzero(redo))
        forced_again = recorder.forced(again)
        u_again = self._uncertainty(tool, params, batch, again, turn)
        for i in np.flatnonzero(redo):
          stats.sampled_tokens += len(draw.tokens[i])  # the discarded draw was paid for
          draw.tokens[i], draw.logprobs[i] = again.tokens[i], again.logprobs[i]
          forced[i] = forced_again[i]
        draw.cache = common.where_cache_rows(redo, again.cache, draw.cache)
        u = np.where(redo, u_again, u)
        retries[redo, turn] += 1
      rows = draw.rows
      kept_u[rows, turn] = u[rows]
      prev_u[rows] = u[rows]
      common.play_turn(runner, tool, batch, draw, turn, stats)
      if thinking:
        _unmask_forced(batch, rows, forced, turn)
    batch.traj.extras[extra_keys.T2PO_UNCERTAINTY_KEY] = kept_u
    batch.traj.extras[extra_keys.T2PO_RETRIES_KEY] = retries
    return common.finish(runner, batch, stats, start_time)
