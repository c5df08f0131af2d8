"""The SNR ∝ ρ^(−1/2) law measured on the tiny transformer's policy gradients, on DD-Chain text.

`dd_chain_sim` checks the decision-density law on a tabular policy whose turn scores are
orthogonal by construction. Here the policy is the tiny transformer (`models/transformer.py`
`tiny`, the shipped tokenizer, sampling restricted to the action words "0"/"1") at its random
initialisation, playing the text env `envs/dd_chain.py` through the ordinary rollout runner; the
gradients are taken in parameter space, where every turn's score shares the same weights.

For a group of `G` episodes with leave-one-out advantages `Â_i` (`group.leave_one_out_advantages`)
an estimator is `ĝ = (1/G) Σ_i ∇_θ Σ_t w_{i,t} log π(a_{i,t} | h_{i,t})` with

  * trajectory-level credit: `w_{i,t} = Â_i` on every turn (GRPO-style);
  * turn-level credit, oracle critic: `w_{i,t} = Â_i·1[t ∈ D]` (zero on routine turns; the env
    knows D);
  * turn-level credit, learned critic: `w_{i,t} = Â_i·1[t ∈ D̂]`, where `D̂` is read off a linear
    per-turn value fitted on the batch (`learned_decision_turns`).

Two things make the study affordable on a CPU, neither changes what is measured:

  * One set of episodes serves every density. The policy never sees m (the observations are
    "turn k of T" for every m), so the episodes are played once and each density's returns come
    from replaying the same actions through `DDChain(num_decisions=m)` with the same seeds
    (`chain_returns`); the densities share their random numbers, and the slope's bootstrap
    resamples groups jointly across densities.
  * Linearity in `w`: `∇ Σ_t Â_i·g_t log π_t = Â_i·∇ Σ_{t∈S} log π_t` for a gate set `S`, so each
    trajectory needs one backward pass per distinct gate set (all turns, each D_m, each D̂_m),
    not one per (estimator, density) (`trajectory_gradients`, `group_samples`).

The group samples of all estimators and densities are compressed by one fixed count sketch
(`count_sketch`, `sketch_dim` coordinates; linear, so sample means and variances commute with
it, and inner products are preserved in expectation) to keep them in memory; `sketch_dim = 0`
keeps the exact gradients. Each sample is one group, so the samples are independent, as
`density.gradient_snr` assumes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.advantages import density
from agentrl_jax.advantages import group
from agentrl_jax.envs import base
from agentrl_jax.envs import dd_chain
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop
from agentrl_jax.rollout import sampler
from agentrl_jax.studies import dd_chain_sim
from agentrl_jax.studies import fits

Array = jax.Array

# Estimator order of the `estimator` axis of `Measurement.samples`; 0 is the reference of ratios.
ESTIMATORS = ("traj", "oracle", "learned")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StudySpec:
  """The chain, the policy and the sample sizes.

  Attributes:
    horizon: T, turns per episode.
    num_decisions: the m values; ρ = m/T.
    group_size: G, episodes per group (≥ 2 for the leave-one-out baseline).
    num_groups: N_b, groups (= independent gradient samples) per density.
    chunk_groups: groups per rollout and gradient chunk (the unit a run resumes from).
    beta: reward per correct decision.
    noise_std: σ_ε, the outcome noise (each episode has its own seed, hence its own ε); 0, the
      env's default, keeps Var(R) = mβ²/4, so the trajectory-level SNR at small ρ is
      measurable on fewer groups (the predicted ratio does not depend on σ_ε).
    target_seed: the env's task (the targets y_t of each m).
    seed: model initialisation and sampling seed.
    sketch_dim: coordinates of the count sketch of the gradients; 0 keeps them exact.
    critic_threshold: τ of the learned critic's `|Q̂ − V̂| > τ` (β/4 is halfway between a routine
      turn's 0 and a decision turn's β/2 at p = ½).
    gradient_batch: trajectories per jitted gradient call (memory: batch × gates × parameters).
    warmup_steps: Adam steps that raise the policy's entropy over the action words before
      anything is measured (`warm_to_uniform`), so π("1" | h_t) starts near ½ on every turn as
      the law's tabular policy does; 0 measures the random initialisation.
    warmup_learning_rate: Adam's learning rate for those steps.
  """

  horizon: int = 32
  num_decisions: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
  group_size: int = 8
  num_groups: int = 256
  chunk_groups: int = 8
  beta: float = 1.0
  noise_std: float = 0.0
  target_seed: int = 0
  seed: int = 0
  sketch_dim: int = 16384
  critic_threshold: float = 0.25
  gradient_batch: int = 8
  warmup_steps: int = 0
  warmup_learning_rate: float = 3e-3

  def __post_init__(self):
    for name in ("horizon", "num_groups", "chunk_groups", "gradient_batch"):
      value = getattr(self, name)
      if not base.is_int(value) or value < 1:
        raise ValueError(f"StudySpec.{name} must be an int >= 1, got {value!r}")
    if not base.is_int(self.group_size) or self.group_size < 2:
      raise ValueError(f"StudySpec.group_size must be an int >= 2 (leave-one-out baseline), "
                       f"got {self.group_size!r}")
    if self.num_groups % self.chunk_groups or self.num_groups < 2:
      raise ValueError(f"StudySpec.num_groups={self.num_groups} must be >= 2 and a multiple of "
                       f"chunk_groups={self.chunk_groups}")
    if (self.chunk_groups * self.group_size) % self.gradient_batch:
      raise ValueError(f"StudySpec.gradient_batch={self.gradient_batch} must divide a chunk's "
                       f"{self.chunk_groups * self.group_size} episodes")
    if not self.num_decisions or any(not base.is_int(m) or not 1 <= m <= self.horizon
                                     for m in self.num_decisions):
      raise ValueError(f"StudySpec.num_decisions must be ints in [1, {self.horizon}], got "
                       f"{self.num_decisions!r}")
    if not base.is_number(self.noise_std) or self.noise_std < 0:
      raise ValueError(f"StudySpec.noise_std must be a number >= 0, got {self.noise_std!r}")
    if not base.is_int(self.sketch_dim) or self.sketch_dim < 0:
      raise ValueError(f"StudySpec.sketch_dim must be an int >= 0, got {self.sketch_dim!r}")
    if not base.is_number(self.critic_threshold) or self.critic_threshold < 0:
      raise ValueError(f"StudySpec.critic_threshold must be >= 0, got {self.critic_threshold!r}")
    if not base.is_int(self.warmup_steps) or self.warmup_steps < 0:
      raise ValueError(f"StudySpec.warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
    if not base.is_number(self.warmup_learning_rate) or self.warmup_learning_rate <= 0:
      raise ValueError(f"StudySpec.warmup_learning_rate must be > 0, got "
                       f"{self.warmup_learning_rate!r}")

  @property
  def densities(self) -> np.ndarray:
    return np.asarray(self.num_decisions, np.float64) / self.horizon

  @property
  def chunk_episodes(self) -> int:
    return self.chunk_groups * self.group_size

  @property
  def num_chunks(self) -> int:
    return self.num_groups // self.chunk_groups


class Episodes(NamedTuple):
  """Played episodes: `actions[M, T]` in {0, 1}, `seeds[M]`, and `returns[R, M]` per density."""

  actions: np.ndarray
  seeds: np.ndarray
  returns: np.ndarray


class LearnedCritic(NamedTuple):
  """The batch-fitted critic per density: `effects[R, T]` (ŵ_t), `decisions[R, T]` bool (D̂),
  and `density[R]`, the ρ̂ of `density.decision_density` over all turns of the batch."""

  effects: np.ndarray
  decisions: np.ndarray
  density: np.ndarray


class CountSketch(NamedTuple):
  """A fixed linear map `R^P → R^k`: coordinate j adds `sign[j]·x_j` to bucket `bucket[j]`."""

  bucket: Array
  sign: Array
  dim: int


class Measurement(NamedTuple):
  """The study's raw result.

  Attributes:
    spec: what was measured.
    samples: `[len(ESTIMATORS), R, N_b, P]` per-group gradient estimates (sketched unless
      `spec.sketch_dim == 0`).
    critic: the learned critic of each density.
    gates: `[K, T]` bool, the distinct gate sets that were differentiated.
    turn_probs: `[T]` the policy's mean `π("1" | h_t)` per turn over the episodes (at random
      initialisation far from ½ on the first turns; see `matched_tabular_ratios`).
  """

  spec: StudySpec
  samples: np.ndarray
  critic: LearnedCritic
  gates: np.ndarray
  turn_probs: np.ndarray


class Analysis(NamedTuple):
  """SNRs, ratios to the trajectory-level estimator, and log–log fits of ratio against ρ.

  Attributes:
    densities: ρ `[R]`.
    snr: `[E, R]` per estimator (order of `ESTIMATORS`).
    ratio: `[E − 1, R]` `SNR_e / SNR_traj` for the turn-level estimators.
    ratio_ci: `[E − 1, R, 2]` per-density bootstrap intervals (`density.gradient_snr_ratio`).
    slope, intercept, r2: `[E − 1]` OLS of `log ratio` on `log ρ`.
    slope_ci: `[E − 1, 2]` percentile interval of the slope over joint bootstrap resamples of
      the groups (the same groups at every density, since the densities share episodes).
    bootstrap_ratio: `[S, E − 1, R]` the resampled ratios behind `slope_ci`.
    signal, noise: `[E, R]` the bias-corrected `‖ḡ‖²` and `tr Cov` behind each SNR, so a ratio
      splits into `sqrt(signal_e/signal_traj)·sqrt(noise_traj/noise_e)`.
  """

  densities: np.ndarray
  snr: np.ndarray
  ratio: np.ndarray
  ratio_ci: np.ndarray
  slope: np.ndarray
  intercept: np.ndarray
  r2: np.ndarray
  slope_ci: np.ndarray
  bootstrap_ratio: np.ndarray
  signal: np.ndarray
  noise: np.ndarray


# ------------------------------------------------------------------------------------------------
# The run and the episodes.


def _max_len(horizon: int) -> int:
  # "turn k of T" frames to at most 9 tokens for T < 1000, plus one action token; the first
  # observation adds the instruction's 6 tokens.
  return 10 * horizon + 16


def make_run(spec: StudySpec) -> tuple[assembly.Run, Any]:
  """The tiny transformer on DD-Chain through `assembly.resolve` and `build_run`; (run, params),
  the params warmed towards uniform first when `spec.warmup_steps > 0`.

  The env is played with `num_decisions = spec.num_decisions[0]`; its returns are replaced by
  `chain_returns`, which recomputes them for every density.
  """
  config = configs.TrainConfig(
      env_name="dd_chain", seed=spec.seed, restrict_to_action_words=True,
      env_kwargs=dict(horizon=spec.horizon, num_decisions=spec.num_decisions[0],
                      beta=spec.beta, noise_std=spec.noise_std, target_seed=spec.target_seed))
  max_len = _max_len(spec.horizon)
  rollout = loop.RolloutConfig(
      max_turns=spec.horizon, max_len=max_len, obs_buckets=(16, 32),
      length_buckets=tuple(range(32, max_len, 32)) + (max_len,),
      sampling=sampler.SamplingConfig(temperature=1.0))
  resolved = assembly.resolve(config, None, rollout)
  graphdef, params = transformer.create(resolved.model, spec.seed)
  run = assembly.build_run(resolved, graphdef)
  return run, warm_to_uniform(run, params, spec)


def warm_to_uniform(run: assembly.Run, params, spec: StudySpec) -> Any:
  """`spec.warmup_steps` Adam steps of `−mean_t H(π(· | h_t))` over the action words; new params.

  The histories are one chunk of episodes played by the initial policy with chunk index
  `spec.num_chunks`, which no measurement uses, so the measured episodes stay fresh. The
  objective knows nothing of the targets or the decision turns: it only moves π("1" | h_t)
  towards ½ on every turn (at random initialisation it is about 0.05 on the first turns).
  """
  if not spec.warmup_steps:
    return params
  traj = jax.tree.map(jnp.asarray, play_chunk(run, params, spec, spec.num_chunks))
  view = distribution.action_view(traj.action_mask, spec.horizon)
  positions = distribution.trajectory_positions(traj)
  optimizer = optax.adam(spec.warmup_learning_rate)

  def negative_entropy(p):
    _, entropy = distribution.action_log_probs(run.graphdef, p, traj.tokens, positions, view,
                                               run.allowed, run.temperature)
    return -jnp.sum(entropy) / jnp.maximum(jnp.sum(view.valid), 1)

  @jax.jit
  def update(p, opt_state):
    grads = jax.grad(negative_entropy)(p)
    updates, opt_state = optimizer.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  opt_state = optimizer.init(params)
  for _ in range(spec.warmup_steps):
    params, opt_state = update(params, opt_state)
  return params


def play_chunk(run: assembly.Run, params, spec: StudySpec, chunk: int) -> types.Trajectories:
  """Plays chunk `chunk`: episodes `chunk·B … (chunk + 1)·B − 1`, each its own seed and row id.

  Rows `i` and `j` of the chunk are in the same group when `i // G == j // G`.
  """
  size = spec.chunk_episodes
  rows = np.arange(chunk * size, (chunk + 1) * size)
  envs = [run.make_env() for _ in rows]
  traj, _ = run.runner.collect(envs, rows.tolist(), (np.arange(size) // spec.group_size).tolist(),
                               params=params, rng=jax.random.fold_in(jax.random.key(spec.seed), chunk),
                               row_ids=rows.tolist())
  if not np.all(traj.done.any(axis=1)) or np.any(traj.env_error):
    raise RuntimeError("a DD-Chain episode did not finish cleanly; raise max_len")
  return traj


def action_choices(traj: types.Trajectories, tokenizer, horizon: int) -> np.ndarray:
  """`[B, T]` int, the action of every turn as 0/1 (one sampled token per turn)."""
  mask = np.asarray(traj.action_mask)
  if not np.all(mask.sum(axis=1) == horizon):
    raise ValueError(f"expected one action token on each of {horizon} turns, got "
                     f"{sorted(set(mask.sum(axis=1).tolist()))}")
  ids = np.asarray(traj.tokens)[mask].reshape(-1, horizon)
  lookup = {tokenizer.single_token_id(word): a for a, word in enumerate(dd_chain.ACTIONS)}
  return np.vectorize(lookup.__getitem__)(ids).astype(np.int32)


def turn_probabilities(trajs: Sequence[types.Trajectories], actions: np.ndarray) -> np.ndarray:
  """`[T]` mean over episodes of `π("1" | h_t)`, from the sampler's log-prob of the taken action."""
  logp = np.concatenate([np.asarray(t.sample_logprob)[np.asarray(t.action_mask)] for t in trajs])
  taken = np.exp(logp.reshape(actions.shape))
  return np.where(actions == 1, taken, 1.0 - taken).mean(axis=0)


def chain_returns(actions: np.ndarray, seeds: np.ndarray, spec: StudySpec) -> np.ndarray:
  """`[R, M]` the return of each episode under each density, by replaying it in `DDChain`.

  The same seed gives the same outcome noise ε at every m, so only the decision set differs.
  """
  returns = np.zeros((len(spec.num_decisions), len(seeds)), np.float32)
  for r, m in enumerate(spec.num_decisions):
    env = dd_chain.DDChain(horizon=spec.horizon, num_decisions=m, beta=spec.beta,
                           noise_std=spec.noise_std, target_seed=spec.target_seed)
    for i, (row, seed) in enumerate(zip(actions, seeds)):
      env.reset(int(seed))
      for a in row:
        result = env.step(dd_chain.ACTIONS[int(a)])
      returns[r, i] = result.reward
  return returns


def group_advantages(returns: np.ndarray, group_size: int) -> np.ndarray:
  """Leave-one-out advantages `[..., M]`, consecutive blocks of `group_size` episodes a group."""
  flat = jnp.asarray(returns, jnp.float32).reshape(-1)
  ids = jnp.arange(flat.shape[0], dtype=jnp.int32) // group_size
  out = group.leave_one_out_advantages(flat, ids, num_groups=flat.shape[0] // group_size)
  return np.asarray(out).reshape(np.shape(returns))


# ------------------------------------------------------------------------------------------------
# Credit and the learned critic.


def trajectory_credit(advantages: Array, horizon: int) -> Array:
  """`w[B, T] = Â_b` on every turn."""
  return jnp.broadcast_to(jnp.asarray(advantages)[:, None], (advantages.shape[0], horizon))


def turn_credit(advantages: Array, decision_mask: Array) -> Array:
  """`w[B, T] = Â_b·1[t ∈ D]`: the turn-level credit of a critic that marks `decision_mask`."""
  return jnp.where(jnp.asarray(decision_mask)[None, :], jnp.asarray(advantages)[:, None], 0.0)


def learned_decision_turns(actions: np.ndarray, returns: np.ndarray,
                           threshold: float) -> tuple[np.ndarray, np.ndarray, float]:
  """A per-turn linear critic fitted on the batch, and the decision turns it finds.

  OLS of `R` on the centred actions, `R ≈ R̄ + Σ_t ŵ_t (a_t − p̂_t)` (`p̂_t` the batch mean of
  `a_t`), read as a value of the history: `V̂(h_t) = R̄ + Σ_{s<t} ŵ_s (a_s − p̂_s)` and
  `Q̂(h_t, a_t) = V̂(h_t) + ŵ_t (a_t − p̂_t)`. `density.decision_density` marks `|Q̂ − V̂| > τ`
  per (episode, turn); a turn is in D̂ when it is marked in most episodes.

  Args:
    actions: `[M, T]` in {0, 1}.
    returns: `[M]`.
    threshold: τ.

  Returns:
    `(effects ŵ [T], decisions D̂ [T] bool, ρ̂)`.
  """
  a = np.asarray(actions, np.float64)
  centred = a - a.mean(axis=0)
  r = np.asarray(returns, np.float64)
  effects = np.linalg.lstsq(centred, r - r.mean(), rcond=None)[0]
  step = centred * effects
  state_values = r.mean() + np.cumsum(step, axis=1) - step
  out = density.decision_density(jnp.asarray(state_values + step, jnp.float32),
                                 jnp.asarray(state_values, jnp.float32),
                                 jnp.ones(a.shape, bool), threshold)
  decisions = np.asarray(out.decisions).mean(axis=0) > 0.5
  return effects.astype(np.float32), decisions, float(out.density)


# ------------------------------------------------------------------------------------------------
# Gradients.


def _row(x):
  return jax.tree.map(lambda leaf: leaf[None], x)


def trajectory_gradients(graphdef, params, traj: types.Trajectories, weights: Array,
                         allowed: Array | None, temperature: float = 1.0,
                         max_actions: int | None = None) -> Any:
  """Per-trajectory gradients of `K` surrogates: `∇_θ Σ_k w[b, j, k] log π(a_{b,k})`.

  `jax.vmap` over trajectories of one forward pass (`distribution.action_log_probs`, the
  learner's log-probs) and `K` vector–Jacobian products, so `weights[:, j]` is the j-th
  surrogate's token-level credit. With `K = 1` this is `vmap(grad)` of `Σ_k A_k log π(a_k)`.
  `K` is static: each surrogate is its own pullback in the compiled program.

  Args:
    graphdef, params: the policy.
    traj: `B` trajectories.
    weights: `[B, K, A]` credit of the first `A` action tokens of each row (here one per turn).
    allowed: the policy's vocabulary mask.
    temperature: the sampling temperature.
    max_actions: `A` (default `weights.shape[-1]`).

  Returns:
    The parameter pytree with leaves `[B, K, ...]`.
  """
  weights = jnp.asarray(weights, jnp.float32)
  view = distribution.action_view(jnp.asarray(traj.action_mask), max_actions or weights.shape[-1])
  positions = distribution.trajectory_positions(traj)

  def one(tokens, pos, index, valid, w):
    def log_probs(p):
      logp, _ = distribution.action_log_probs(
          graphdef, p, tokens[None], _row(pos), distribution.ActionView(index[None], valid[None]),
          allowed, temperature)
      return logp[0]

    _, pullback = jax.vjp(log_probs, params)
    # One pullback per surrogate, unrolled: a `jax.vmap` over the cotangents compiled (jit, CPU,
    # jax 0.10.2) to wrong gradients for K > 2, e.g. a nonzero gradient for an all-zero credit
    # (tests/studies/test_transformer_snr.py checks jit against eager and the zero credit).
    grads = [pullback(w[j])[0] for j in range(w.shape[0])]
    return jax.tree.map(lambda *g: jnp.stack(g), *grads)

  return jax.vmap(one)(jnp.asarray(traj.tokens), positions, view.index, view.valid, weights)


def flat_gradients(grads: Any) -> Array:
  """Leaves `[B, K, ...]` → one `[B, K, P]` array (leaf order of `jax.tree.leaves`)."""
  leaves = jax.tree.leaves(grads)
  return jnp.concatenate([leaf.reshape(leaf.shape[:2] + (-1,)) for leaf in leaves], axis=-1)


def count_sketch(key: Array, num_params: int, dim: int) -> CountSketch:
  """A random bucket in `[0, dim)` and sign ±1 per coordinate: `E⟨Sx, Sy⟩ = ⟨x, y⟩`."""
  bucket_key, sign_key = jax.random.split(key)
  return CountSketch(bucket=jax.random.randint(bucket_key, (num_params,), 0, dim),
                     sign=jnp.where(jax.random.bernoulli(sign_key, 0.5, (num_params,)), 1.0, -1.0),
                     dim=dim)


def sketched(sketch: CountSketch, x: Array) -> Array:
  """`S x` over the last axis: `[..., P]` → `[..., k]`."""
  lead = x.shape[:-1]
  flat = (x * sketch.sign).reshape(-1, x.shape[-1])
  out = jnp.zeros((flat.shape[0], sketch.dim), flat.dtype).at[:, sketch.bucket].add(flat)
  return out.reshape(lead + (sketch.dim,))


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "dim"))
def _gate_gradients(graphdef, params, traj, gates, allowed, bucket, sign, *, temperature, dim):
  weights = jnp.broadcast_to(gates[None], (traj.tokens.shape[0],) + gates.shape)
  flat = flat_gradients(trajectory_gradients(graphdef, params, traj, weights, allowed,
                                             temperature))
  return flat if not dim else sketched(CountSketch(bucket, sign, dim), flat)


def gate_gradients(run: assembly.Run, params, traj: types.Trajectories, gates: np.ndarray,
                   sketch: CountSketch | None) -> np.ndarray:
  """`[B, K, P]` (or `[B, K, k]` sketched): `∇ Σ_{t ∈ S_j} log π(a_t)` for each gate set `S_j`."""
  traj = jax.tree.map(jnp.asarray, traj)
  gates = jnp.asarray(gates, jnp.float32)
  if sketch is None:
    return np.asarray(_gate_gradients(run.graphdef, params, traj, gates, run.allowed, None, None,
                                      temperature=run.temperature, dim=0))
  return np.asarray(_gate_gradients(run.graphdef, params, traj, gates, run.allowed, sketch.bucket,
                                    sketch.sign, temperature=run.temperature, dim=sketch.dim))


def group_samples(gate_grads: np.ndarray, advantages: np.ndarray, gate_index: np.ndarray,
                  group_size: int) -> np.ndarray:
  """Per-group estimates `[E, R, B/G, P]` from gate gradients, by linearity in the credit.

      ĝ_{e,r,n} = (1/G) Σ_{i ∈ group n} Â_{r,i} · ∇ Σ_{t ∈ S_{e,r}} log π(a_{i,t})

  Args:
    gate_grads: `[B, K, P]` from `gate_gradients`.
    advantages: `[R, B]` leave-one-out advantages per density.
    gate_index: `[E, R]` int, which gate set estimator e uses at density r.
    group_size: G; rows `i // G` form group n.
  """
  b, _, p = gate_grads.shape
  picked = gate_grads[:, gate_index]  # [B, E, R, P]
  weighted = picked * np.asarray(advantages, np.float32).T[:, None, :, None]
  return weighted.reshape(b // group_size, group_size, *picked.shape[1:]).mean(axis=1).transpose(
      1, 2, 0, 3)


def gate_sets(spec: StudySpec, learned: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The distinct gates `[K, T]` (all turns first) and `gate_index[E, R]` into them."""
  oracle = [np.asarray(dd_chain.DDChain(horizon=spec.horizon, num_decisions=m).decision_mask)
            for m in spec.num_decisions]
  wanted = [[np.ones(spec.horizon, bool)] * len(oracle), oracle, list(np.asarray(learned, bool))]
  gates: list[np.ndarray] = []
  index = np.zeros((len(ESTIMATORS), len(oracle)), np.int32)
  for e, row in enumerate(wanted):
    for r, gate in enumerate(row):
      match = [k for k, g in enumerate(gates) if np.array_equal(g, gate)]
      if not match:
        gates.append(gate)
        match = [len(gates) - 1]
      index[e, r] = match[0]
  return np.stack(gates), index


# ------------------------------------------------------------------------------------------------
# The measurement, resumable chunk by chunk.


def _spec_record(spec: StudySpec) -> dict[str, Any]:
  return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(spec).items()}


# Bumped whenever a cached chunk would be computed differently (2: one pullback per gate, after
# the vmap over cotangents gave wrong gradients), so a stale directory is refused, not reused.
_CACHE_FORMAT = 2


def _check_cache(cache_dir: str, spec: StudySpec) -> None:
  path = os.path.join(cache_dir, "spec.json")
  record = dict(_spec_record(spec), cache_format=_CACHE_FORMAT)
  if os.path.exists(path):
    with open(path) as f:
      found = json.load(f)
    if found != record:
      raise ValueError(f"{cache_dir!r} holds a run of another spec ({found}); use a fresh "
                       f"directory or the same spec ({record})")
  else:
    files.makedirs(cache_dir)
    with open(path, "w") as f:
      json.dump(record, f)


def _save(path: str, **arrays) -> None:
  tmp = path + ".tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def _play_all(run, params, spec: StudySpec, cache_dir: str | None, log) -> tuple[list, Episodes]:
  trajs, actions = [], []
  for chunk in range(spec.num_chunks):
    path = cache_dir and os.path.join(cache_dir, f"episodes_{chunk:04d}.npz")
    if path and os.path.exists(path):
      with np.load(path) as data:
        traj = types.Trajectories(**{k: data[k] for k in data.files if k in _TRAJ_FIELDS})
    else:
      traj = play_chunk(run, params, spec, chunk)
      if path:
        _save(path, **{k: getattr(traj, k) for k in _TRAJ_FIELDS})
      log(f"played chunk {chunk + 1}/{spec.num_chunks}")
    trajs.append(traj)
    actions.append(action_choices(traj, run.tokenizer, spec.horizon))
  actions = np.concatenate(actions)
  seeds = np.arange(actions.shape[0])
  returns = chain_returns(actions, seeds, spec)
  played = np.concatenate([np.asarray(t.outcome) for t in trajs])
  # The played env is the first density's: its own returns must be the replayed ones.
  np.testing.assert_allclose(returns[0], played, rtol=1e-5, atol=1e-5)
  return trajs, Episodes(actions=actions, seeds=seeds, returns=returns)


_TRAJ_FIELDS = tuple(f.name for f in dataclasses.fields(types.Trajectories)
                     if f.name not in ("sub_outcomes", "extras"))


def measure(spec: StudySpec, cache_dir: str | None = None, log=print,
            built: tuple[assembly.Run, Any] | None = None) -> Measurement:
  """Plays `spec.num_groups` groups, fits the learned critic, and takes every group gradient.

  Args:
    spec: the study.
    cache_dir: where each chunk's episodes and group samples are saved as they finish; a rerun
      resumes from them (the directory is tied to `spec`). None keeps everything in memory.
    log: progress messages.
    built: `make_run(spec)`'s result, to reuse its compiled sampler (default: build one).

  Returns:
    `Measurement`.
  """
  if cache_dir:
    _check_cache(cache_dir, spec)
  run, params = built or make_run(spec)
  trajs, episodes = _play_all(run, params, spec, cache_dir, log)
  fitted = [learned_decision_turns(episodes.actions, episodes.returns[r], spec.critic_threshold)
            for r in range(len(spec.num_decisions))]
  critic = LearnedCritic(effects=np.stack([f[0] for f in fitted]),
                         decisions=np.stack([f[1] for f in fitted]),
                         density=np.array([f[2] for f in fitted]))
  gates, gate_index = gate_sets(spec, critic.decisions)
  advantages = group_advantages(episodes.returns, spec.group_size)
  num_params = sum(x.size for x in jax.tree.leaves(params))
  sketch = (count_sketch(jax.random.key(spec.seed + 1), num_params, spec.sketch_dim)
            if spec.sketch_dim else None)
  chunks = []
  for chunk, traj in enumerate(trajs):
    path = cache_dir and os.path.join(cache_dir, f"samples_{chunk:04d}.npz")
    if path and os.path.exists(path):
      with np.load(path) as data:
        if np.array_equal(data["gates"], gates):
          chunks.append(data["samples"])
          continue
    rows = slice(chunk * spec.chunk_episodes, (chunk + 1) * spec.chunk_episodes)
    grads = np.concatenate([
        gate_gradients(run, params, _slice(traj, start, spec.gradient_batch), gates, sketch)
        for start in range(0, spec.chunk_episodes, spec.gradient_batch)])
    samples = group_samples(grads, advantages[:, rows], gate_index, spec.group_size)
    if path:
      _save(path, samples=samples, gates=gates)
    chunks.append(samples)
    log(f"gradients of chunk {chunk + 1}/{spec.num_chunks}")
  return Measurement(spec=spec, samples=np.concatenate(chunks, axis=2), critic=critic,
                     gates=gates, turn_probs=turn_probabilities(trajs, episodes.actions))


def _slice(traj: types.Trajectories, start: int, size: int) -> types.Trajectories:
  return jax.tree.map(lambda x: x[start:start + size], traj)


# ------------------------------------------------------------------------------------------------
# Analysis.


def _recentred_snr(samples: Array) -> Array:
  """SNR of a bootstrap resample with `v/N_b` removed once more (as `dd_chain_sim` does), so the
  resampled signal is centred on the full-sample estimate rather than above it."""
  out = density.gradient_snr(samples)
  signal = jnp.maximum(out.signal - out.noise / samples.shape[0], jnp.finfo(jnp.float32).tiny)
  return jnp.sqrt(signal) / jnp.sqrt(out.noise)


# Under jit the samples are arguments; un-jitted, `lax.map` would capture them as constants and
# XLA would spend minutes folding a constant of N_b × P floats.
_snr_ratio = jax.jit(density.gradient_snr_ratio, static_argnames=("num_resamples", "confidence"))


@jax.jit
def _joint_bootstrap(samples: Array, indices: Array) -> Array:
  """`[S, E, R]` re-centred SNRs, resample s using the same groups for every (e, r)."""
  per_cell = jax.vmap(jax.vmap(_recentred_snr))
  return jax.lax.map(lambda index: per_cell(samples[:, :, index]), indices)


def _fit(rho: np.ndarray, ratio: np.ndarray, boot: np.ndarray,
         confidence: float) -> tuple[float, float, float, np.ndarray]:
  """Log–log fit over the densities with a positive ratio (a zero estimator has none)."""
  keep = np.isfinite(ratio) & (ratio > 0)
  if keep.sum() < 2 or len(set(rho[keep].tolist())) < 2:
    return np.nan, np.nan, np.nan, np.full(2, np.nan)
  fit = fits.loglog_fit(rho[keep], ratio[keep])
  boot = boot[:, keep]
  boot = boot[np.all(np.isfinite(boot) & (boot > 0), axis=1)]
  slope_ci = (fits.percentile_interval(fits.loglog_fit(rho[keep], boot).slope, confidence)
              if len(boot) else np.full(2, np.nan))
  return float(fit.slope), float(fit.intercept), float(fit.r2), slope_ci


def analyse(measurement: Measurement, key: Array, num_resamples: int = 200,
            confidence: float = 0.95) -> Analysis:
  """`gradient_snr` of every estimator and density, ratios to `traj`, and the log–log fits.

  A learned critic that marks no turn at some density gives an identically zero estimator (no
  signal, no noise): SNR 0, ratio 0, and that density is left out of its fit.

  Args:
    measurement: from `measure`.
    key: PRNG key of the bootstraps.
    num_resamples: bootstrap resamples (per-density intervals and the joint slope bootstrap).
    confidence: interval width.
  """
  samples = jnp.asarray(measurement.samples)
  num_estimators, num_densities, num_groups = samples.shape[:3]
  outs = [[density.gradient_snr(samples[e, r]) for r in range(num_densities)]
          for e in range(num_estimators)]
  signal = np.array([[float(o.signal) for o in row] for row in outs])
  noise = np.array([[float(o.noise) for o in row] for row in outs])
  snr = np.where(noise > 0, np.sqrt(signal) / np.sqrt(np.where(noise > 0, noise, 1.0)), 0.0)
  ratio_key, joint_key = jax.random.split(key)
  ratio_ci = np.full((num_estimators - 1, num_densities, 2), np.nan)
  for e in range(1, num_estimators):
    for r in range(num_densities):
      if snr[e, r] > 0:
        out = _snr_ratio(jax.random.fold_in(ratio_key, r), samples[e, r], samples[0, r],
                         num_resamples=num_resamples, confidence=confidence)
        ratio_ci[e - 1, r] = [float(out.low), float(out.high)]
  indices = jax.random.randint(joint_key, (num_resamples, num_groups), 0, num_groups)
  boot = np.asarray(_joint_bootstrap(samples, indices), np.float64)
  boot_ratio = np.where(snr[None, 1:] > 0, boot[:, 1:] / boot[:, :1], 0.0)
  ratio = snr[1:] / snr[:1]
  rho = measurement.spec.densities
  fitted = [_fit(rho, ratio[e], boot_ratio[:, e], confidence) for e in range(num_estimators - 1)]
  return Analysis(densities=rho, snr=snr, ratio=ratio, ratio_ci=ratio_ci,
                  slope=np.array([f[0] for f in fitted]),
                  intercept=np.array([f[1] for f in fitted]),
                  r2=np.array([f[2] for f in fitted]),
                  slope_ci=np.stack([f[3] for f in fitted]), bootstrap_ratio=boot_ratio,
                  signal=signal, noise=noise)


def matched_tabular_ratios(key: Array, spec: StudySpec, turn_probs: np.ndarray,
                           num_batches: int = 4000) -> np.ndarray:
  """`[R]` oracle `SNR_turn/SNR_traj` of `dd_chain_sim`'s tabular policy with the transformer's
  per-turn probabilities, the same chain (targets, β, σ_ε, G) and the same estimators.

  The stylised `ρ^(−1/2)` assumes `p_t = ½` on every turn; a policy far from ½ on some turns
  (the transformer at initialisation on the first turns) changes each turn's score variance and
  the dependence of `Â` on a decision turn's score, and with it the ratio. This reference keeps
  exactly those per-turn statistics and drops only the shared parameters, so the gap between it
  and the transformer is what parameter sharing does.
  """
  chain = dd_chain_sim.ChainSpec(horizon=spec.horizon, beta=spec.beta, noise_std=spec.noise_std,
                                 group_size=spec.group_size)
  ratios = []
  for r, m in enumerate(spec.num_decisions):
    env = dd_chain.DDChain(horizon=spec.horizon, num_decisions=m, target_seed=spec.target_seed)
    targets = np.zeros(spec.horizon, np.float32)
    for t, word in env.targets.items():
      targets[t] = float(dd_chain.ACTIONS.index(word))
    out = dd_chain_sim.gradient_samples(
        jax.random.fold_in(key, r), jnp.asarray(turn_probs, jnp.float32), jnp.asarray(targets),
        jnp.asarray(env.decision_mask), jnp.zeros((1,), jnp.float32), chain, num_batches)
    ratios.append(float(density.gradient_snr(out.turn[0]).snr / density.gradient_snr(out.traj).snr))
  return np.array(ratios)


def summary(measurement: Measurement, analysis: Analysis,
            matched: np.ndarray | None = None) -> dict[str, Any]:
  """A JSON-ready record: the spec, per-density SNRs, ratios and their signal/noise split, fits,
  the learned critic's decision turns against the oracle's (precision and recall of D̂), the
  policy's per-turn probabilities and, if given, `matched_tabular_ratios` with its fit."""
  spec = measurement.spec
  oracle = np.stack([dd_chain.DDChain(horizon=spec.horizon, num_decisions=m).decision_mask
                     for m in spec.num_decisions])
  found = measurement.critic.decisions
  hits = (found & oracle).sum(axis=1)
  estimators = {}
  for e, name in enumerate(ESTIMATORS[1:]):
    estimators[name] = {
        "ratio": analysis.ratio[e].tolist(), "ratio_ci": analysis.ratio_ci[e].tolist(),
        "slope": float(analysis.slope[e]), "slope_ci": np.asarray(analysis.slope_ci[e]).tolist(),
        "r2": float(analysis.r2[e]), "intercept": float(analysis.intercept[e]),
        "noise_ratio": np.sqrt(analysis.noise[0] / np.maximum(analysis.noise[e + 1], 1e-30)
                               ).tolist(),
        "signal_ratio": np.sqrt(analysis.signal[e + 1] / analysis.signal[0]).tolist()}
  reference = None
  if matched is not None:
    fit = fits.loglog_fit(analysis.densities, matched)
    reference = {"ratio": np.asarray(matched).tolist(), "slope": float(fit.slope),
                 "r2": float(fit.r2)}
  return _json_ready({
      "spec": _spec_record(spec),
      "densities": analysis.densities.tolist(),
      "predicted_ratio": (analysis.densities ** -0.5).tolist(),
      "snr": {name: analysis.snr[e].tolist() for e, name in enumerate(ESTIMATORS)},
      "estimators": estimators,
      "num_resamples": int(analysis.bootstrap_ratio.shape[0]),
      "episodes_per_density": spec.num_groups * spec.group_size,
      "gradient_passes_per_episode": int(measurement.gates.shape[0]),
      "turn_probs": np.asarray(measurement.turn_probs).tolist(),
      "matched_tabular": reference,
      "learned_critic": {
          "density": measurement.critic.density.tolist(),
          "decisions": [np.flatnonzero(row).tolist() for row in found],
          "precision": (hits / np.maximum(found.sum(axis=1), 1)).tolist(),
          "recall": (hits / oracle.sum(axis=1)).tolist()},
  })


def _json_ready(x):
  """NaN (an undefined interval or fit) → None, so the record is strict JSON."""
  if isinstance(x, dict):
    return {k: _json_ready(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_json_ready(v) for v in x]
  if isinstance(x, float) and not np.isfinite(x):
    return None
  return x


def across_seeds(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Pools `summary` records of the same study at several seeds (model init and sampling).

  Per estimator: each seed's slope, their mean with a 95% Student-t interval over seeds, and the
  log-log fit of the geometric-mean ratio over seeds (its slope and R²: the law's shape once the
  per-seed noise is averaged). A density where some seed's ratio is 0 or undefined (a critic that
  found no decision turn) leaves that estimator's pooled fit out at that density.

  Raises:
    ValueError: fewer than one record, or records of different densities.
  """
  if not results:
    raise ValueError("across_seeds needs at least one study record")
  rho = np.asarray(results[0]["densities"], np.float64)
  for r in results:
    if not np.array_equal(np.asarray(r["densities"], np.float64), rho):
      raise ValueError(f"records of different densities: {r['densities']} vs {rho.tolist()}")
  pooled = {}
  for name in ESTIMATORS[1:]:
    slopes = np.asarray([np.nan if r["estimators"][name]["slope"] is None
                         else r["estimators"][name]["slope"] for r in results], np.float64)
    ratios = np.asarray([[np.nan if x is None else x for x in r["estimators"][name]["ratio"]]
                         for r in results], np.float64)
    mean, low, high = fits.mean_confidence_band(slopes[:, None])
    keep = np.all(ratios > 0, axis=0)  # NaN compares False
    fit = (fits.loglog_fit(rho[keep], np.exp(np.mean(np.log(ratios[:, keep]), axis=0)))
           if keep.sum() >= 2 else None)
    pooled[name] = {
        "slopes": slopes.tolist(), "slope_mean": float(mean[0]),
        "slope_ci": [float(low[0]), float(high[0])],
        "geometric_mean_ratio": np.exp(np.mean(np.log(np.where(ratios > 0, ratios, np.nan)),
                                               axis=0)).tolist(),
        "pooled_fit": None if fit is None else {"slope": float(fit.slope), "r2": float(fit.r2),
                                                "densities": rho[keep].tolist()}}
  return _json_ready({"seeds": [r["seed"] for r in results], "densities": rho.tolist(),
                      "predicted_ratio": (rho ** -0.5).tolist(), "estimators": pooled})
