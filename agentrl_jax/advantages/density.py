"""Decision density ρ̂ and gradient signal-to-noise ratio (docs/methods.md#decision-density, arXiv
2606.22164).

Diagnostics, not estimators: `gradient_snr` measures how much signal a gradient estimator carries
over a set of independent samples; `decision_density` estimates the fraction of consequential turns
in real agent data from a learned critic, and `batch_decision_density` from a batch of groups
alone (no critic).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import types
from agentrl_jax.advantages import step as step_lib

Array = jax.Array


class SNROutput(NamedTuple):
  """Attributes (float32 scalars):

  snr: amplitude SNR `sqrt(S²) / sqrt(v)`.
  signal: bias-corrected squared signal `S² = ‖ḡ‖² − v/N_b` (floored at a tiny positive value).
  noise: `v`, the summed per-coordinate unbiased variance.
  """

  snr: Array
  signal: Array
  noise: Array


class SNRRatioOutput(NamedTuple):
  """ratio `SNR_a / SNR_b` on all samples, and the bootstrap percentile interval [low, high]."""

  ratio: Array
  low: Array
  high: Array


class DecisionDensity(NamedTuple):
  """density: scalar ρ̂ over all existing turns; per_trajectory: `[B]` ρ̂; decisions: `[B, N]` bool."""

  density: Array
  per_trajectory: Array
  decisions: Array


def _flatten_samples(gradients: Any) -> Array:
  leaves = jax.tree.leaves(gradients)
  if not leaves:
    raise ValueError("gradient_snr needs at least one array")
  num_samples = leaves[0].shape[0]
  for leaf in leaves:
    if leaf.ndim < 1 or leaf.shape[0] != num_samples:
      raise ValueError(
          f"every leaf needs the same leading sample axis {num_samples}, got shape {leaf.shape}")
  return jnp.concatenate(
      [jnp.reshape(leaf, (num_samples, -1)).astype(jnp.float32) for leaf in leaves], axis=1)


def _snr_from_flat(samples: Array, bias_terms: int = 1) -> SNROutput:
  """SNR with `bias_terms` copies of v/N_b removed from ‖ḡ‖² (2 inside a bootstrap resample)."""
  num_samples = samples.shape[0]
  mean = jnp.mean(samples, axis=0)
  noise = jnp.sum(jnp.var(samples, axis=0, ddof=1))
  tiny = jnp.finfo(jnp.float32).tiny
  signal = jnp.maximum(jnp.sum(mean**2) - bias_terms * noise / num_samples, tiny)
  return SNROutput(snr=jnp.sqrt(signal) / jnp.sqrt(noise), signal=signal, noise=noise)


def gradient_snr(gradients: Any) -> SNROutput:
  """Amplitude SNR of a gradient estimator from `N_b ≥ 2` independent samples.

      ḡ = mean_n ĝ⁽ⁿ⁾,   v = Σ_coords var_n(ĝ⁽ⁿ⁾)   (ddof = 1)
      S² = max(‖ḡ‖² − v/N_b, tiny)                    (‖ḡ‖² is biased up by v/N_b)
      SNR = sqrt(S²) / sqrt(v)

  Invariant to rescaling all samples by a constant `c ≠ 0`.

  Args:
    gradients: an array `[N_b, ...]`, or a pytree whose leaves all share the leading axis `N_b`
      (e.g. a stacked parameter gradient).

  Returns:
    `SNROutput(snr, signal, noise)`.
  """
  samples = _flatten_samples(gradients)
  if samples.shape[0] < 2:
    raise ValueError(f"gradient_snr needs at least 2 samples, got {samples.shape[0]}")
  return _snr_from_flat(samples)


def gradient_snr_ratio(key: Array, gradients_a: Any, gradients_b: Any,
                       num_resamples: int = 200, confidence: float = 0.95) -> SNRRatioOutput:
  """`SNR(a) / SNR(b)` with a bootstrap interval over batches (common random numbers).

  Sample `n` of `a` and of `b` must come from the same batch; each bootstrap resample draws one
  set of batch indices and uses it for both estimators.

  Args:
    key: PRNG key for the resampling.
    gradients_a: `[N_b, ...]` array or pytree (e.g. the turn-level estimator).
    gradients_b: same layout (e.g. the trajectory-level estimator).
    num_resamples: bootstrap resamples (200 in docs/methods.md#snr-scaling).
    confidence: width of the percentile interval.
  """
  a, b = _flatten_samples(gradients_a), _flatten_samples(gradients_b)
  chex.assert_equal_shape_prefix([a, b], 1)
  num_samples = a.shape[0]

  def ratio(index, bias_terms):
    return (_snr_from_flat(a[index], bias_terms).snr /
            _snr_from_flat(b[index], bias_terms).snr)

  # A resample's ‖ḡ*‖² is centred on the sample's ‖ḡ‖², itself biased up by v/N_b; removing
  # v*/N_b twice centres the resampled signal on the corrected estimate, so the interval
  # brackets the point estimate.
  indices = jax.random.randint(key, (num_resamples, num_samples), 0, num_samples)
  resampled = jax.lax.map(lambda index: ratio(index, 2), indices)
  tail = 50.0 * (1.0 - confidence)
  low, high = jnp.percentile(resampled, jnp.array([tail, 100.0 - tail]))
  return SNRRatioOutput(ratio=ratio(jnp.arange(num_samples), 1), low=low, high=high)


def decision_density(q_values: Array, state_values: Array, turn_mask: Array,
                     threshold: float) -> DecisionDensity:
  """Estimated decision density ρ̂: the share of turns whose action moves the value by more than τ.

      decision_{b,k} = |Q̂(h_{b,k}, a_{b,k}) − V̂(h_{b,k})| > τ
      ρ̂ = Σ decision · turn_mask / Σ turn_mask

  Args:
    q_values: `[B, N]` float critic estimate of the taken action's value `Q̂(h, a)`.
    state_values: `[B, N]` float `V̂(h)` before the action.
    turn_mask: `[B, N]` bool, which turns exist.
    threshold: τ ≥ 0.

  Returns:
    `DecisionDensity(density, per_trajectory, decisions)`; empty trajectories get ρ̂ = 0.
  """
  chex.assert_rank([q_values, state_values, turn_mask], 2)
  chex.assert_equal_shape([q_values, state_values, turn_mask])
  if isinstance(threshold, (int, float)) and threshold < 0:
    raise ValueError(f"threshold must be >= 0, got {threshold!r}")
  rows = jnp.asarray(turn_mask).astype(bool)
  gap = jnp.abs(q_values.astype(jnp.float32) - state_values.astype(jnp.float32))
  decisions = rows & (gap > threshold)
  count = jnp.sum(rows, axis=1).astype(jnp.float32)
  per_trajectory = jnp.sum(decisions, axis=1) / jnp.maximum(count, 1.0)
  density = jnp.sum(decisions) / jnp.maximum(jnp.sum(count), 1.0)
  return DecisionDensity(density=density, per_trajectory=per_trajectory, decisions=decisions)


def action_hashes(traj: types.Trajectories) -> Array:
  """`[B, N]` int32 hash of each turn's sampled action ids (equal actions, equal hashes).

  Each action token is mixed with its offset in the turn and the terms are summed per turn, so
  the hash depends on the ids and their order; missing turns hash to 0.
  """
  tokens = jnp.asarray(traj.tokens).astype(jnp.uint32)
  acting = jnp.asarray(traj.action_mask).astype(bool)
  turn = jnp.asarray(traj.turn_of_token)
  start = jnp.take_along_axis(jnp.asarray(traj.turn_start), jnp.maximum(turn, 0), axis=1)
  offset = (jnp.arange(tokens.shape[1])[None, :] - start).astype(jnp.uint32)
  term = step_lib.mix32(tokens * jnp.uint32(0x9E3779B1) + step_lib.mix32(offset + 1))
  term = jnp.where(acting & (turn >= 0), term, jnp.uint32(0))
  n = traj.turn_mask.shape[1]
  per_turn = jax.vmap(lambda t, ids: jax.ops.segment_sum(t, ids, n))(
      term, jnp.where(acting & (turn >= 0), turn, n - 1))
  return per_turn.astype(jnp.int32)


def _segment_mean(values: Array, ids: Array, weights: Array) -> Array:
  """Each row's mean of `values` over the rows sharing its id (weighted), `[B, N]`."""
  flat_ids, w = ids.reshape(-1), weights.reshape(-1).astype(jnp.float32)
  num = flat_ids.shape[0]
  total = jax.ops.segment_sum(values.reshape(-1) * w, flat_ids, num)
  count = jax.ops.segment_sum(w, flat_ids, num)
  return (total / jnp.maximum(count, 1.0))[flat_ids].reshape(ids.shape)


def batch_decision_density(traj: types.Trajectories, threshold: float) -> DecisionDensity:
  """`decision_density` with values estimated from the batch's groups instead of a critic.

  V̂(h) is the mean undiscounted return-to-go of the group's turns acting from the same state
  (the anchor state GiGPO groups on) and Q̂(h, a) the mean over those that also took the same
  action. Both are Monte-Carlo means over a few episodes, so later decisions add noise to
  routine turns' gaps: with small groups ρ̂ is biased upwards, and τ should sit above that noise.
  """
  mask = jnp.asarray(traj.turn_mask).astype(bool) & jnp.asarray(traj.valid_trajectory)[:, None]
  returns = step_lib.step_returns(jnp.asarray(traj.reward, jnp.float32), mask, 1.0)
  anchors = step_lib.trajectory_anchor_hashes(traj)
  group_id = jnp.asarray(traj.group_id)
  state_ids = step_lib.step_groups(group_id, anchors, mask)
  action_ids = step_lib.step_groups(
      group_id, step_lib.mix32((anchors.astype(jnp.uint32) * jnp.uint32(0x85EBCA6B))
                               ^ action_hashes(traj).astype(jnp.uint32)).astype(jnp.int32), mask)
  return decision_density(_segment_mean(returns, action_ids, mask),
                          _segment_mean(returns, state_ids, mask), mask, threshold)
