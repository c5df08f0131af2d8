"""Iterative Reward Calibration (IRC, docs/methods.md#gtpo-hybrid): per-turn reward features
weighted by how well they tell successful trajectories from failed ones.

Every turn `(b, k)` carries features `f_{b,k} ∈ R^F` (env step info, read from
`traj.extras[name]`, each `[B, N]`). Over the valid turns of recent batches,

    r_pb(f) = corr(f_{b,k}, 1[success_b])                 (Pearson with a binary variable)
    w_f     = s_f · 1.0   if |r_pb| ≥ 0.3 and sign(r_pb) = s_f
              s_f · 0.3   if 0.1 ≤ |r_pb| < 0.3 and sign(r_pb) = s_f
              0           otherwise (weak, or measured against its designed sign s_f)
    r_{b,k} = Σ_f w_f · f_{b,k}

The pure kernels below compute each line; `IterativeRewardCalibration` is the reward shaper that
keeps the weights and the pooled statistics on the host and recalibrates every `every` steps.
Formalised from summary-level facts of arXiv 2604.02869 (tiers and thresholds are ours).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax import types

Array = jax.Array


class CorrelationMoments(NamedTuple):
  """Centred sums of (feature, success) pairs over turns; mergeable across batches.

  count: number of turns `n`.
  feature_mean: `[F]` mean of each feature; success_mean: mean success.
  feature_m2: `[F]` `Σ (f − f̄)²`; success_m2: `Σ (y − ȳ)²`; comoment: `[F]` `Σ (f − f̄)(y − ȳ)`.
  """

  count: Array
  feature_mean: Array
  success_mean: Array
  feature_m2: Array
  success_m2: Array
  comoment: Array


def _xp(*arrays):
  return jnp if any(isinstance(x, jax.Array) for x in arrays) else np


def turn_features(traj: types.Trajectories, names: Sequence[str]) -> Array:
  """`[B, N, F]` float32: `traj.extras[name]` of each feature, stacked in `names` order."""
  missing = [name for name in names if name not in traj.extras]
  if missing:
    raise ValueError(f"reward features {missing} are not in traj.extras (has: "
                     f"{', '.join(sorted(traj.extras)) or 'nothing'}); the env must report them "
                     f"as numbers in its step info")
  columns = []
  for name in names:
    column = jnp.asarray(traj.extras[name], jnp.float32)
    if column.shape != traj.turn_mask.shape:
      raise ValueError(f"reward feature traj.extras[{name!r}] has shape {list(column.shape)}; a "
                       f"per-turn feature is {list(traj.turn_mask.shape)}")
    columns.append(column)
  return jnp.stack(columns, axis=-1)


def calibration_turns(traj: types.Trajectories) -> Array:
  """`[B, N]` bool: existing turns of trajectories without an env fault."""
  return jnp.asarray(traj.turn_mask).astype(bool) & jnp.asarray(traj.valid_trajectory)[:, None]


def correlation_moments(features: Array, success: Array, turns: Array) -> CorrelationMoments:
  """The moments of one batch: every turn in `turns` is a pair `(f_{b,k}, success_b)`.

  Two passes (means first) keep the sums centred, so that merging batches stays exact in
  float32 for features far from zero.

  Args:
    features: `[B, N, F]` float.
    success: `[B]` bool or 0/1 trajectory success.
    turns: `[B, N]` bool turns to count.
  """
  chex.assert_rank([features, success, turns], [3, 1, 2])
  chex.assert_equal_shape_prefix([features, turns], 2)
  w = jnp.asarray(turns).astype(jnp.float32)
  f = jnp.asarray(features, jnp.float32)
  y = jnp.broadcast_to(jnp.asarray(success).astype(jnp.float32)[:, None], w.shape)
  count = jnp.sum(w)
  safe = jnp.maximum(count, 1.0)
  f_mean = jnp.einsum("bn,bnf->f", w, f) / safe
  y_mean = jnp.sum(w * y) / safe
  df = (f - f_mean) * w[..., None]
  dy = (y - y_mean) * w
  return CorrelationMoments(
      count=count, feature_mean=f_mean, success_mean=y_mean,
      feature_m2=jnp.sum(df * df, axis=(0, 1)), success_m2=jnp.sum(dy * dy),
      comoment=jnp.einsum("bnf,bn->f", df, dy))


def merge_moments(a: CorrelationMoments, b: CorrelationMoments) -> CorrelationMoments:
  """The moments of the union of two sets of turns (Chan et al.'s pairwise update).

  Operators only, so NumPy float64 moments (the host's running window) stay float64.
  """
  n = a.count + b.count
  safe = n + (n == 0)
  df = b.feature_mean - a.feature_mean
  dy = b.success_mean - a.success_mean
  cross = a.count * b.count / safe
  return CorrelationMoments(
      count=n, feature_mean=a.feature_mean + df * b.count / safe,
      success_mean=a.success_mean + dy * b.count / safe,
      feature_m2=a.feature_m2 + b.feature_m2 + df * df * cross,
      success_m2=a.success_m2 + b.success_m2 + dy * dy * cross,
      comoment=a.comoment + b.comoment + df * dy * cross)


def empty_moments(num_features: int) -> CorrelationMoments:
  """Float64 NumPy moments of no turns (the identity of `merge_moments`)."""
  zeros = np.zeros((num_features,), np.float64)
  return CorrelationMoments(count=np.float64(0), feature_mean=zeros, success_mean=np.float64(0),
                            feature_m2=zeros, success_m2=np.float64(0), comoment=zeros)


def correlation(moments: CorrelationMoments) -> Array:
  """`[F]` Pearson correlation of each feature with success; 0 where either never varies.

  With a binary success this is the point-biserial correlation `r_pb`.
  """
  xp = _xp(*moments)
  denominator = xp.sqrt(moments.feature_m2 * moments.success_m2)
  defined = denominator > 0
  return xp.where(defined, moments.comoment / xp.where(defined, denominator, 1.0), 0.0)


def point_biserial(features: Array, success: Array, turns: Array) -> Array:
  """`[F]` `r_pb` of each feature over the turns in `turns` (see `correlation_moments`)."""
  return correlation(correlation_moments(features, success, turns))


def tier_weights(r: Array, designed_signs: Array, *, strong_threshold: float = 0.3,
                 weak_threshold: float = 0.1, strong_weight: float = 1.0,
                 weak_weight: float = 0.3) -> Array:
  """`[F]` IRC weights from correlations `r` `[F]` and designed signs `s_f ∈ {−1, +1}` `[F]`.

  `s_f · strong_weight` for `|r| ≥ strong_threshold`, `s_f · weak_weight` for
  `weak_threshold ≤ |r| < strong_threshold`, 0 below; 0 as well when `sign(r) ≠ s_f`: a feature
  that separates outcomes in the direction opposite to its design would reward failure.
  """
  xp = _xp(r, designed_signs)
  magnitude = xp.abs(r)
  tier = xp.where(magnitude >= strong_threshold, strong_weight,
                  xp.where(magnitude >= weak_threshold, weak_weight, 0.0))
  agrees = xp.sign(r) == designed_signs
  return xp.where(agrees, designed_signs * tier, 0.0)


def calibrated_turn_rewards(features: Array, weights: Array, turns: Array) -> Array:
  """`[B, N]` float32 `Σ_f w_f f_{b,k}` on `turns`, 0 elsewhere."""
  chex.assert_rank([features, weights, turns], [3, 1, 2])
  reward = jnp.einsum("bnf,f->bn", jnp.asarray(features, jnp.float32),
                      jnp.asarray(weights, jnp.float32))
  return jnp.where(turns, reward, 0.0)


class IterativeRewardCalibration:
  """Reward shaper: IRC with its weights and pooled moments on the host.

  `__call__(traj)` writes `Σ_f w_f f` to `traj.extras[output_key]` (`[B, N]`) with the weights as
  they stood before the batch, then adds the batch's moments to the window (one training step
  per call). Once the window holds `every` steps it recalibrates: `r_pb` over all of the
  window's valid turns, then `tier_weights`, and the window restarts. A window in which success
  never varied says nothing about any feature; the weights then stay and the window keeps
  filling until it does. Inside the learner's jitted update the weights are read and the moments
  written through host callbacks (as `credit.pearl.PearlMemory` does), so the calibration moves
  although the update is traced once; on concrete arrays it runs directly. `traj.reward` and
  `traj.outcome` are left alone: the estimator reads the calibrated reward through its
  `turn_reward_key` (`gtpo_hybrid`, `mt_grpo`). `state_dict()`/`load_state_dict()` carry the
  calibration through checkpoints.
  """

  def __init__(self, *, features: Sequence[str], designed_signs: Sequence[float] | None = None,
               every: int = 25, strong_threshold: float = 0.3, weak_threshold: float = 0.1,
               strong_weight: float = 1.0, weak_weight: float = 0.3,
               initial_weights: Sequence[float] | None = None, stop_when_stable: bool = False,
               output_key: str = extra_keys.IRC_TURN_REWARD_KEY):
    """Args:
      features: names of the `[B, N]` per-turn features in `traj.extras`.
      designed_signs: +1 (a feature meant to be good) or −1 per feature; all +1 by default.
      every: N_irc, training steps between recalibrations (25).
      strong_threshold, weak_threshold: the |r_pb| tier bounds (0.3, 0.1).
      strong_weight, weak_weight: the tiers' weights (1.0, 0.3).
      initial_weights: weights before the first calibration; the design (`designed_signs`,
        each at strength 1) by default.
      stop_when_stable: stop recalibrating once a calibration leaves the weights unchanged.
      output_key: the `traj.extras` key the calibrated turn reward is written to.
    """
    self.features = (features,) if isinstance(features, str) else tuple(features)
    if not self.features or len(set(self.features)) != len(self.features):
      raise ValueError(f"IterativeRewardCalibration.features must be distinct names, got "
                       f"{features!r}")
    f = len(self.features)
    signs = np.ones(f) if designed_signs is None else np.asarray(designed_signs, np.float64)
    if signs.shape != (f,) or not np.all(np.isin(signs, (-1.0, 1.0))):
      raise ValueError(f"designed_signs must be {f} values of +1 or -1, got {designed_signs!r}")
    if not (isinstance(every, int) and every >= 1):
      raise ValueError(f"IterativeRewardCalibration.every must be an int >= 1, got {every!r}")
    if not 0 <= weak_threshold <= strong_threshold <= 1:
      raise ValueError(f"need 0 <= weak_threshold <= strong_threshold <= 1, got "
                       f"{weak_threshold!r}, {strong_threshold!r}")
    initial = signs if initial_weights is None else np.asarray(initial_weights, np.float64)
    if initial.shape != (f,):
      raise ValueError(f"initial_weights must have {f} values, got {initial_weights!r}")
    self.designed_signs = signs.astype(np.float32)
    self.every, self.stop_when_stable, self.output_key = every, stop_when_stable, output_key
    self.tiers = dict(strong_threshold=strong_threshold, weak_threshold=weak_threshold,
                      strong_weight=strong_weight, weak_weight=weak_weight)
    self.weights = initial.astype(np.float32)
    self.correlations = np.zeros((f,), np.float64)  # of the last calibration
    self.step = 0
    self.calibrations = 0
    self.frozen = False
    self._window = empty_moments(f)
    self._window_steps = 0

  def __call__(self, traj: types.Trajectories) -> types.Trajectories:
    features = turn_features(traj, self.features)
    turns = calibration_turns(traj)
    traced = isinstance(features, jax.core.Tracer)
    if traced:
      weights = jax.pure_callback(
          self._weights_numpy, jax.ShapeDtypeStruct(self.weights.shape, np.float32),
          vmap_method="sequential")
    else:
      weights = jnp.asarray(self.weights)
    reward = calibrated_turn_rewards(features, weights, turns)
    moments = correlation_moments(features, jnp.asarray(traj.success), turns)
    if traced:
      # Passing the reward's sum orders the write after the weights were read.
      jax.debug.callback(self._observe_callback, moments, jnp.sum(reward))
    else:
      self.observe(jax.device_get(moments))
    return traj.replace(extras={**traj.extras, self.output_key: reward})

  def observe(self, moments: CorrelationMoments) -> None:
    """Adds one training step's moments to the window; recalibrates when it is full."""
    self.step += 1
    if self.frozen:
      return
    batch = CorrelationMoments(*(np.asarray(x, np.float64) for x in moments))
    self._window = merge_moments(self._window, batch)
    self._window_steps += 1
    if self._window_steps >= self.every and self._window.success_m2 > 0:
      self._calibrate()

  def _calibrate(self) -> None:
    r = correlation(self._window)
    weights = tier_weights(r, self.designed_signs.astype(np.float64), **self.tiers)
    weights = weights.astype(np.float32)
    self.frozen = self.stop_when_stable and np.array_equal(weights, self.weights)
    self.weights, self.correlations = weights, r
    self.calibrations += 1
    self._window = empty_moments(len(self.features))
    self._window_steps = 0

  def _weights_numpy(self) -> np.ndarray:
    return self.weights.copy()

  def _observe_callback(self, moments: CorrelationMoments, _order: Any) -> None:
    self.observe(moments)

  def state_dict(self) -> dict[str, Any]:
    """The calibration as arrays and numbers; `{k: v.tolist()}` of it is JSON and loads back."""
    return {"features": np.asarray(self.features), "weights": self.weights.copy(),
            "correlations": self.correlations.copy(), "step": np.int64(self.step),
            "calibrations": np.int64(self.calibrations), "frozen": np.bool_(self.frozen),
            "window_steps": np.int64(self._window_steps),
            **{f"window_{name}": np.asarray(value, np.float64)
               for name, value in self._window._asdict().items()}}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    needed = ("features", "weights", "correlations", "step", "calibrations", "frozen",
              "window_steps", *(f"window_{name}" for name in CorrelationMoments._fields))
    missing = [key for key in needed if key not in state]
    if missing:
      raise ValueError(f"IterativeRewardCalibration.load_state_dict: missing {missing}")
    saved = tuple(str(name) for name in np.asarray(state["features"]).tolist())
    if saved != self.features:
      raise ValueError(f"IterativeRewardCalibration.load_state_dict: the checkpoint calibrated "
                       f"features {list(saved)}, this run has {list(self.features)}")
    f = len(self.features)
    window = {}
    for name in CorrelationMoments._fields:
      value = np.asarray(state[f"window_{name}"], np.float64)
      expected = (f,) if name in ("feature_mean", "feature_m2", "comoment") else ()
      if value.shape != expected:
        raise ValueError(f"IterativeRewardCalibration.load_state_dict: window_{name} has shape "
                         f"{list(value.shape)}, expected {list(expected)}")
      window[name] = value
    self.weights = np.asarray(state["weights"], np.float32).reshape(f)
    self.correlations = np.asarray(state["correlations"], np.float64).reshape(f)
    self.step = int(state["step"])
    self.calibrations = int(state["calibrations"])
    self.frozen = bool(state["frozen"])
    self._window_steps = int(state["window_steps"])
    self._window = CorrelationMoments(**window)
