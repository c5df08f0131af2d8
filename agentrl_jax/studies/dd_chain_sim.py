"""Vectorised DD-Chain simulator for the decision-density studies
(docs/methods.md#decision-density).

The text env `envs.dd_chain` plays one episode at a time through the tokenizer; the studies need
millions of episodes, so this module re-implements the same chain as array maths: a group of `G`
episodes is `actions[G, T]`, the return is

    R = β · Σ_{t∈D} 1[a_t = y_t] + ε,    ε ~ N(0, σ_ε²),

with the decision turns `D` taken from `dd_chain.decision_turns`, so both agree on which turns
matter. Two policies: P-tab, one logit per turn (`features = None`), and P-shared,
`π(a_t = 1) = σ(θ·x_t)` with unit-norm turn features `X[T, d]`. Their score is
`ψ_t = (a_t − p_t)·x_t` (P-tab: `x_t = e_t`).

Three estimators of `∇_θ J`, all `(1/G) Σ_i Σ_t w_{i,t} ψ_{i,t}` with different weights `w`:

  * `traj`: `w_{i,t} = Â_i`, the leave-one-out group advantage on every turn (GRPO-style).
  * `turn`: critic-gated Monte Carlo, `w_{i,t} = Â_i·1[t ∈ D̂] + e_{i,t}`, `e ~ N(0, σ_c²)` models
    critic error; the oracle critic has `D̂ = D`, `σ_c = 0`.
  * `td`: the exact-TD(0) ablation, `w_{i,t} = β(1[a_t = y_t] − P(a_t = y_t))·1[t ∈ D]`, plus `ε_i`
    on the last turn. It breaks assumption A3 and is kept only to show why A3 matters.

Experiment 1 (`snr_sweep`) measures `SNR_turn / SNR_traj` across densities with P-tab at `θ = 0`;
Experiment 2 (`step_sweep`) trains P-shared with normalized-gradient SGD until the decision turns
are 90% right. Everything is jitted and vmapped over batches, densities and seeds, with explicit keys.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.advantages import density
from agentrl_jax.advantages import group
from agentrl_jax.envs import base
from agentrl_jax.envs import dd_chain
from agentrl_jax.studies import fits

Array = jax.Array

# Estimator order of the `estimator` index in `steps_to_threshold`.
ESTIMATORS = ("traj", "turn")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChainSpec:
  """The chain and the group sampling, shared by both experiments.

  Attributes:
    horizon: T, turns per episode.
    beta: reward per correct decision.
    noise_std: σ_ε, standard deviation of the outcome noise.
    group_size: G, trajectories per group; ≥ 2 for the leave-one-out baseline.
  """

  horizon: int = 64
  beta: float = 1.0
  noise_std: float = 1.0
  group_size: int = 8

  def __post_init__(self):
    if not base.is_int(self.horizon) or self.horizon < 1:
      raise ValueError(f"horizon must be an int >= 1, got {self.horizon!r}")
    if not base.is_number(self.beta):
      raise ValueError(f"beta must be a number, got {self.beta!r}")
    if not base.is_number(self.noise_std) or self.noise_std < 0:
      raise ValueError(f"noise_std must be a number >= 0, got {self.noise_std!r}")
    if not base.is_int(self.group_size) or self.group_size < 2:
      raise ValueError(f"group_size must be an int >= 2 (leave-one-out baseline), "
                       f"got {self.group_size!r}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrainSpec:
  """Normalized-gradient SGD on P-shared (docs/methods.md#step-gap).

  Attributes:
    num_features: d, the dimension of θ and of the turn features.
    learning_rate: η in `θ ← θ + η·ĝ/‖ĝ‖`.
    threshold: stop once the mean over decision turns of `P(a_t = y_t)` reaches it.
    max_steps: cap on updates; a run that never reaches the threshold reports `max_steps`.
  """

  num_features: int = 16
  learning_rate: float = 0.3
  threshold: float = 0.9
  max_steps: int = 4000

  def __post_init__(self):
    if not base.is_int(self.num_features) or self.num_features < 1:
      raise ValueError(f"num_features must be an int >= 1, got {self.num_features!r}")
    if not base.is_number(self.learning_rate) or self.learning_rate <= 0:
      raise ValueError(f"learning_rate must be a number > 0, got {self.learning_rate!r}")
    if not base.is_number(self.threshold) or not 0.5 < self.threshold < 1:
      raise ValueError(f"threshold must be in (0.5, 1), got {self.threshold!r}")
    if not base.is_int(self.max_steps) or self.max_steps < 1:
      raise ValueError(f"max_steps must be an int >= 1, got {self.max_steps!r}")


class GroupRollout(NamedTuple):
  """One group: `actions[G, T]` in {0., 1.}, `returns[G]`, and the outcome noise `ε[G]` in them."""

  actions: Array
  returns: Array
  outcome_noise: Array


class GradientSamples(NamedTuple):
  """Per-batch estimates: traj `[N_b, P]`, turn `[C, N_b, P]` (one per critic noise), td `[N_b, P]`."""

  traj: Array
  turn: Array
  td: Array


class SNRSweep(NamedTuple):
  """Experiment 1 over densities `[R]` and critic noise levels `[C]`.

  Attributes:
    densities: ρ = m/T, `[R]`.
    critic_noise_stds: σ_c, `[C]`.
    snr_traj: `[R]`; snr_turn: `[C, R]`; snr_td: `[R]`.
    ratio_turn: `SNR_turn / SNR_traj`, `[C, R]`; ratio_td: `SNR_td / SNR_traj`, `[R]`.
    ratio_turn_ci, ratio_td_ci: bootstrap percentile intervals `[..., 2]` (low, high).
    bootstrap_turn `[num_resamples, C, R]`, bootstrap_td `[num_resamples, R]`: ratios on batch
      resamples drawn independently per density (so a slope refitted on each resample gives the
      slope's interval), with the resampled signal re-centred as in `_bootstrap_snr`.
  """

  densities: np.ndarray
  critic_noise_stds: np.ndarray
  snr_traj: np.ndarray
  snr_turn: np.ndarray
  snr_td: np.ndarray
  ratio_turn: np.ndarray
  ratio_td: np.ndarray
  ratio_turn_ci: np.ndarray
  ratio_td_ci: np.ndarray
  bootstrap_turn: np.ndarray
  bootstrap_td: np.ndarray


class SharedProblem(NamedTuple):
  """A P-shared task: unit-norm `features[T, d]`, hidden `theta_star[d]`, `targets[T] = 1[Xθ* > 0]`."""

  features: Array
  theta_star: Array
  targets: Array


class StepSweep(NamedTuple):
  """Experiment 2: updates to threshold `steps[len(ESTIMATORS), R, S]` over densities and seeds.

  `final_accuracy` (same shape) is the decision-turn accuracy when the run stopped; a run stopped by
  the cap has `steps == max_steps` and accuracy below the threshold.
  """

  densities: np.ndarray
  steps: np.ndarray
  final_accuracy: np.ndarray


# ------------------------------------------------------------------------------------------------
# The chain.


def decision_masks(horizon: int, num_decisions: Sequence[int]) -> np.ndarray:
  """Bool `[R, T]`, row r True on the `m_r` decision turns of `dd_chain.decision_turns`."""
  masks = np.zeros((len(num_decisions), horizon), dtype=bool)
  for row, m in enumerate(num_decisions):
    if not base.is_int(m) or not 1 <= m <= horizon:
      raise ValueError(f"num_decisions entries must be ints in [1, {horizon}], got {m!r}")
    masks[row, list(dd_chain.decision_turns(horizon, m))] = True
  return masks


def sample_group(key: Array, probs: Array, targets: Array, decision_mask: Array,
                 spec: ChainSpec) -> GroupRollout:
  """Plays one group of `G` episodes.

  Args:
    key: PRNG key.
    probs: `[T]` float, `π(a_t = 1)`.
    targets: `[T]` in {0, 1}; only decision turns are read.
    decision_mask: `[T]` bool, the decision turns D.
    spec: the chain.

  Returns:
    `GroupRollout` with `actions[G, T]`, `returns[G]`, `outcome_noise[G]`.
  """
  chex.assert_rank([probs, targets, decision_mask], 1)
  chex.assert_equal_shape([probs, targets, decision_mask])
  action_key, noise_key = jax.random.split(key)
  shape = (spec.group_size, probs.shape[0])
  actions = jax.random.bernoulli(action_key, probs, shape).astype(jnp.float32)
  noise = spec.noise_std * jax.random.normal(noise_key, (spec.group_size,))
  returns = chain_returns(actions, targets, decision_mask, spec.beta, noise)
  return GroupRollout(actions=actions, returns=returns, outcome_noise=noise)


def chain_returns(actions: Array, targets: Array, decision_mask: Array, beta: float,
                  outcome_noise: Array) -> Array:
  """`R = β·Σ_{t∈D} 1[a_t = y_t] + ε` for `actions[..., T]`, `targets[T]`, `outcome_noise[...]`."""
  correct = (actions == targets.astype(actions.dtype)) & decision_mask
  return beta * jnp.sum(correct, axis=-1, dtype=jnp.float32) + outcome_noise


def leave_one_out_advantages(returns: Array) -> Array:
  """`Â_i = R_i − (Σ_{j≠i} R_j)/(G − 1)` over the last axis (independent of episode i: unbiased).

  The library's RLOO kernel (`group.leave_one_out_advantages`), each row of `returns` a group.
  """
  shape = returns.shape
  flat = returns.reshape(-1)
  rows = flat.shape[0] // shape[-1]
  ids = jnp.repeat(jnp.arange(rows, dtype=jnp.int32), shape[-1])
  return group.leave_one_out_advantages(flat, ids, num_groups=rows).reshape(shape)


# ------------------------------------------------------------------------------------------------
# Estimator weights `w[G, T]` and the gradient they give.


def trajectory_weights(advantages: Array, horizon: int) -> Array:
  """`w_{i,t} = Â_i` on every turn: routine turns get the full trajectory advantage."""
  return jnp.broadcast_to(advantages[:, None], (advantages.shape[0], horizon))


def gated_weights(advantages: Array, critic_mask: Array, critic_error: Array) -> Array:
  """CG-MC: `w_{i,t} = Â_i·1[t ∈ D̂] + e_{i,t}` with `critic_error = e[G, T]`.

  With `D̂` all True and `e = 0` this equals `trajectory_weights` bit for bit (x·1 + 0 = x).
  """
  return jnp.where(critic_mask[None, :], advantages[:, None], 0.0) + critic_error


def exact_td_weights(rollout: GroupRollout, probs: Array, targets: Array, decision_mask: Array,
                     beta: float) -> Array:
  """The exact TD(0) critic's advantages, `β(1[a_t = y_t] − P(a_t = y_t))·1[t ∈ D]` + ε on turn T−1."""
  targets = targets.astype(jnp.float32)
  correct = (rollout.actions == targets).astype(jnp.float32)
  p_correct = targets * probs + (1.0 - targets) * (1.0 - probs)
  weights = jnp.where(decision_mask, beta * (correct - p_correct), 0.0)
  return weights.at[:, -1].add(rollout.outcome_noise)


def policy_gradient(weights: Array, actions: Array, probs: Array,
                    features: Array | None = None) -> Array:
  """`ĝ = (1/G) Σ_i Σ_t w_{i,t} (a_{i,t} − p_t) x_t`.

  Args:
    weights: `[G, T]`.
    actions: `[G, T]` in {0., 1.}.
    probs: `[T]`, `π(a_t = 1)`.
    features: `[T, d]` for P-shared; None for P-tab (x_t = e_t, gradient `[T]`).

  Returns:
    `[T]` (P-tab) or `[d]` (P-shared).
  """
  chex.assert_equal_shape([weights, actions])
  per_turn = jnp.mean(weights * (actions - probs[None, :]), axis=0)
  return per_turn if features is None else per_turn @ features


def exact_tabular_gradient(probs: Array, targets: Array, decision_mask: Array,
                           beta: float) -> Array:
  """True `∇_θ J` for P-tab: `β p_t(1 − p_t)(2y_t − 1)` on decision turns, 0 on routine turns.

  `J = β Σ_{t∈D} P(a_t = y_t)` and `dp_t/dθ_t = p_t(1 − p_t)`.
  """
  sign = 2.0 * targets.astype(jnp.float32) - 1.0
  return jnp.where(decision_mask, beta * probs * (1.0 - probs) * sign, 0.0)


def predicted_ratio(num_decisions: np.ndarray, horizon: int, critic_noise_std: float,
                    spec: ChainSpec, prob: float = 0.5) -> np.ndarray:
  """Stylized theory: `SNR_turn/SNR_traj = (ρ + κ)^(−1/2)`, `κ = σ_c²/E[Â²]`.

  `E[Â²] = Var(R)·G/(G − 1)` for the leave-one-out advantage, `Var(R) = mβ²p(1−p) + σ_ε²`.
  """
  m = np.asarray(num_decisions, dtype=np.float64)
  var_return = m * spec.beta**2 * prob * (1 - prob) + spec.noise_std**2
  kappa = critic_noise_std**2 / (var_return * spec.group_size / (spec.group_size - 1))
  return (m / horizon + kappa) ** -0.5


# ------------------------------------------------------------------------------------------------
# Experiment 1: SNR over batches (P-tab).


def _batch_gradients(key: Array, probs: Array, targets: Array, decision_mask: Array,
                     critic_noise_stds: Array, spec: ChainSpec) -> GradientSamples:
  rollout_key, critic_key = jax.random.split(key)
  rollout = sample_group(rollout_key, probs, targets, decision_mask, spec)
  advantages = leave_one_out_advantages(rollout.returns)
  # One standard-normal draw scaled by every σ_c: common random numbers across critic levels.
  unit_error = jax.random.normal(critic_key, rollout.actions.shape)
  turn = jax.vmap(lambda s: gated_weights(advantages, decision_mask, s * unit_error))(
      critic_noise_stds)
  weights = jnp.concatenate([
      trajectory_weights(advantages, probs.shape[0])[None],
      turn,
      exact_td_weights(rollout, probs, targets, decision_mask, spec.beta)[None]])
  # A single batched contraction over the stacked weights: equal weight rows then give
  # bit-identical gradients (two separate contractions may be fused and rounded differently).
  grads = jax.vmap(policy_gradient, in_axes=(0, None, None))(weights, rollout.actions, probs)
  return GradientSamples(traj=grads[0], turn=grads[1:-1], td=grads[-1])


def gradient_samples(key: Array, probs: Array, targets: Array, decision_mask: Array,
                     critic_noise_stds: Array, spec: ChainSpec, num_batches: int) -> GradientSamples:
  """P-tab gradient estimates on `num_batches` independent groups, all estimators on the same groups.

  Args:
    key: PRNG key; batch n uses `fold_in(key, n)`.
    probs: `[T]` policy, `π(a_t = 1)`.
    targets: `[T]` in {0, 1}.
    decision_mask: `[T]` bool; the oracle critic's D̂ is D.
    critic_noise_stds: `[C]` σ_c values for the turn-level estimator.
    spec: the chain.
    num_batches: N_b.

  Returns:
    `GradientSamples(traj[N_b, T], turn[C, N_b, T], td[N_b, T])`.
  """
  keys = jax.vmap(functools.partial(jax.random.fold_in, key))(jnp.arange(num_batches))
  per_batch = jax.vmap(_batch_gradients, in_axes=(0, None, None, None, None, None))(
      keys, probs, targets, decision_mask, jnp.asarray(critic_noise_stds, jnp.float32), spec)
  return per_batch._replace(turn=jnp.swapaxes(per_batch.turn, 0, 1))


def _snr(samples: Array) -> Array:
  return density.gradient_snr(samples).snr


def _bootstrap_snr(samples: Array) -> Array:
  """The SNR of a bootstrap resample, re-centred on the full-sample estimate.

  In the bootstrap world the population mean is the sample mean ḡ, whose squared norm is the
  full-sample signal plus `v/N_b`; a resample's bias-corrected signal is centred there, not on the
  full-sample `S²`. At low SNR (the trajectory estimator at small ρ) that shift is most of the
  signal, and plain percentile intervals then miss the estimate they belong to. Subtracting `v/N_b`
  once more puts the resampled signal back on `S²`, so the percentile interval brackets it.
  """
  out = density.gradient_snr(samples)
  signal = jnp.maximum(out.signal - out.noise / samples.shape[0], jnp.finfo(jnp.float32).tiny)
  return jnp.sqrt(signal) / jnp.sqrt(out.noise)


def _resampled_ratios(index: Array, samples: GradientSamples) -> tuple[Array, Array]:
  traj = _bootstrap_snr(samples.traj[index])
  turn = jax.vmap(lambda s: _bootstrap_snr(s[index]))(samples.turn)
  return turn / traj, _bootstrap_snr(samples.td[index]) / traj


@functools.partial(jax.jit, static_argnames=("spec", "num_batches", "num_resamples"))
def _snr_sweep_arrays(key: Array, masks: Array, critic_noise_stds: Array, *, spec: ChainSpec,
                      num_batches: int, num_resamples: int):
  horizon = masks.shape[1]
  target_key, key = jax.random.split(key)
  targets = jax.random.bernoulli(target_key, 0.5, (horizon,)).astype(jnp.float32)
  probs = jnp.full((horizon,), 0.5, jnp.float32)  # P-tab at θ = 0.

  def one_density(args):
    row, mask = args
    sample_key, boot_key = jax.random.split(jax.random.fold_in(key, row))
    samples = gradient_samples(sample_key, probs, targets, mask, critic_noise_stds, spec,
                               num_batches)
    indices = jax.random.randint(boot_key, (num_resamples, num_batches), 0, num_batches)
    boot_turn, boot_td = jax.lax.map(lambda i: _resampled_ratios(i, samples), indices)
    return (_snr(samples.traj), jax.vmap(_snr)(samples.turn), _snr(samples.td), boot_turn,
            boot_td)

  rows = jnp.arange(masks.shape[0])
  return jax.lax.map(one_density, (rows, masks))


def snr_sweep(key: Array, spec: ChainSpec, num_decisions: Sequence[int],
              critic_noise_stds: Sequence[float] = (0.0,), num_batches: int = 4000,
              num_resamples: int = 200, confidence: float = 0.95) -> SNRSweep:
  """Experiment 1: `SNR_turn/SNR_traj` for P-tab at θ = 0 across densities.

  Each density draws its own `num_batches` groups (independent keys); on them every estimator is
  evaluated (common random numbers), so the ratios share the batch noise.

  Args:
    key: PRNG key (targets, batches, bootstrap).
    spec: the chain; `spec.horizon` is T.
    num_decisions: the m values; ρ = m/T.
    critic_noise_stds: σ_c values of the turn-level estimator; 0 is the oracle critic.
    num_batches: N_b ≥ 2 groups per density.
    num_resamples: bootstrap resamples over batches.
    confidence: width of the percentile intervals.

  Returns:
    `SNRSweep` as NumPy arrays.
  """
  if not base.is_int(num_batches) or num_batches < 2:
    raise ValueError(f"num_batches must be an int >= 2, got {num_batches!r}")
  if not base.is_int(num_resamples) or num_resamples < 1:
    raise ValueError(f"num_resamples must be an int >= 1, got {num_resamples!r}")
  if not 0 < confidence < 1:
    raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
  stds = np.asarray(critic_noise_stds, dtype=np.float32)
  if stds.ndim != 1 or stds.size == 0 or np.any(stds < 0):
    raise ValueError(f"critic_noise_stds must be a non-empty list of values >= 0, "
                     f"got {critic_noise_stds!r}")
  masks = decision_masks(spec.horizon, num_decisions)
  out = jax.device_get(_snr_sweep_arrays(
      key, jnp.asarray(masks), jnp.asarray(stds), spec=spec, num_batches=num_batches,
      num_resamples=num_resamples))
  snr_traj, snr_turn, snr_td, boot_turn, boot_td = (
      np.asarray(x, dtype=np.float64) for x in out)
  # lax.map stacks densities first; the documented layout puts the critic axis first.
  boot_turn, boot_td = np.moveaxis(boot_turn, 0, 2), boot_td.T
  return SNRSweep(
      densities=np.asarray(num_decisions, dtype=np.float64) / spec.horizon,
      critic_noise_stds=np.asarray(critic_noise_stds, dtype=np.float64),
      snr_traj=snr_traj,
      snr_turn=snr_turn.T,
      snr_td=snr_td,
      ratio_turn=(snr_turn / snr_traj[:, None]).T,
      ratio_td=snr_td / snr_traj,
      ratio_turn_ci=fits.percentile_interval(boot_turn, confidence),
      ratio_td_ci=fits.percentile_interval(boot_td, confidence),
      bootstrap_turn=boot_turn,
      bootstrap_td=boot_td)


# ------------------------------------------------------------------------------------------------
# Experiment 2: training to threshold (P-shared).


def shared_problem(key: Array, horizon: int, num_features: int) -> SharedProblem:
  """Unit-norm Gaussian turn features, a hidden `θ* ~ N(0, I)`, realizable targets `1[x_t·θ* > 0]`."""
  feature_key, theta_key = jax.random.split(key)
  features = jax.random.normal(feature_key, (horizon, num_features))
  features = features / jnp.linalg.norm(features, axis=-1, keepdims=True)
  theta_star = jax.random.normal(theta_key, (num_features,))
  targets = (features @ theta_star > 0).astype(jnp.float32)
  return SharedProblem(features=features, theta_star=theta_star, targets=targets)


def decision_accuracy(theta: Array, problem: SharedProblem, decision_mask: Array) -> Array:
  """Mean over decision turns of `P(a_t = y_t)` under `π(a_t = 1) = σ(θ·x_t)`."""
  probs = jax.nn.sigmoid(problem.features @ theta)
  p_correct = jnp.where(problem.targets > 0, probs, 1.0 - probs)
  return jnp.sum(jnp.where(decision_mask, p_correct, 0.0)) / jnp.sum(decision_mask)


class _TrainCarry(NamedTuple):
  theta: Array
  step: Array
  accuracy: Array


def steps_to_threshold(key: Array, problem: SharedProblem, decision_mask: Array, estimator: Array,
                       spec: ChainSpec, train: TrainSpec) -> tuple[Array, Array]:
  """Normalized-gradient SGD from θ = 0 until the decision-turn accuracy reaches the threshold.

      θ ← θ + η·ĝ/‖ĝ‖   (no step when ĝ = 0, e.g. a group with equal returns)

  One group of `spec.group_size` episodes per update; update k samples with `fold_in(key, k)`.

  Args:
    key: PRNG key for sampling.
    problem: features, targets.
    decision_mask: `[T]` bool.
    estimator: int scalar, index into `ESTIMATORS` (0 = traj, 1 = turn with the oracle critic).
    spec: the chain.
    train: the optimizer and the stopping rule.

  Returns:
    `(steps, accuracy)`: updates taken (`train.max_steps` if the threshold was never reached) and
    the accuracy when stopping.
  """
  horizon = problem.features.shape[0]

  def keep_going(carry):
    return (carry.step < train.max_steps) & (carry.accuracy < train.threshold)

  def update(carry):
    probs = jax.nn.sigmoid(problem.features @ carry.theta)
    rollout = sample_group(jax.random.fold_in(key, carry.step), probs, problem.targets,
                           decision_mask, spec)
    advantages = leave_one_out_advantages(rollout.returns)
    weights = jnp.where(estimator == 0, trajectory_weights(advantages, horizon),
                        gated_weights(advantages, decision_mask, 0.0))
    grad = policy_gradient(weights, rollout.actions, probs, problem.features)
    norm = jnp.linalg.norm(grad)
    direction = jnp.where(norm > 0, grad / jnp.where(norm > 0, norm, 1.0), 0.0)
    theta = carry.theta + train.learning_rate * direction
    return _TrainCarry(theta=theta, step=carry.step + 1,
                       accuracy=decision_accuracy(theta, problem, decision_mask))

  theta = jnp.zeros(problem.features.shape[1])
  start = _TrainCarry(theta=theta, step=jnp.int32(0),
                      accuracy=decision_accuracy(theta, problem, decision_mask))
  final = jax.lax.while_loop(keep_going, update, start)
  return final.step, final.accuracy


@functools.partial(jax.jit, static_argnames=("spec", "train", "num_seeds"))
def _step_sweep_arrays(key: Array, masks: Array, *, spec: ChainSpec, train: TrainSpec,
                       num_seeds: int):
  def one_run(estimator, mask, seed):
    seed_key = jax.random.fold_in(key, seed)
    problem_key, sample_key = jax.random.split(seed_key)
    problem = shared_problem(problem_key, spec.horizon, train.num_features)
    # The seed fixes the task; each estimator samples from its own stream, so the runs are
    # independent (as the rank test assumes) while facing the same task.
    run_key = jax.random.fold_in(sample_key, estimator)
    return steps_to_threshold(run_key, problem, mask, estimator, spec, train)

  over_seeds = jax.vmap(one_run, in_axes=(None, None, 0))
  over_masks = jax.vmap(over_seeds, in_axes=(None, 0, None))
  over_estimators = jax.vmap(over_masks, in_axes=(0, None, None))
  return over_estimators(jnp.arange(len(ESTIMATORS)), masks, jnp.arange(num_seeds))


def step_sweep(key: Array, spec: ChainSpec, train: TrainSpec, num_decisions: Sequence[int],
               num_seeds: int = 8) -> StepSweep:
  """Experiment 2: updates to threshold for each estimator, density and seed.

  Seed s (`fold_in(key, s)`) draws the features, θ* and the sampling streams, so the same seed
  gives both estimators the same task at every density.

  Args:
    key: PRNG key.
    spec: the chain (docs/methods.md#step-gap: T = 128, G = 4, σ_ε = 0).
    train: optimizer and stopping rule.
    num_decisions: the m values; ρ = m/T.
    num_seeds: runs per estimator and density.

  Returns:
    `StepSweep` with `steps[2, R, S]` as NumPy arrays.
  """
  if not base.is_int(num_seeds) or num_seeds < 1:
    raise ValueError(f"num_seeds must be an int >= 1, got {num_seeds!r}")
  masks = decision_masks(spec.horizon, num_decisions)
  steps, accuracy = jax.device_get(
      _step_sweep_arrays(key, jnp.asarray(masks), spec=spec, train=train, num_seeds=num_seeds))
  return StepSweep(densities=np.asarray(num_decisions, dtype=np.float64) / spec.horizon,
                   steps=np.asarray(steps), final_accuracy=np.asarray(accuracy))
