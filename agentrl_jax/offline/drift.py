"""DRIFT: decoupled offline rollouts from a fixed reference policy + importance-weighted SFT.

The optimum of KL-regularised RL is `π*(τ) ∝ π_ref(τ)·exp(R(τ)/β)`, so RL can be done as
supervised learning on reference samples weighted by `exp(R/β)`, self-normalised within each
prompt's group. The reference policy plays every task `group_size` times once, up front; the
episodes go to the trajectory store (policy version 0); training then reads them back and never
touches an environment again (evaluation aside).

Differences from the source: an agent's "answers" are its observations, so the repetition penalty
counts distinct observations, the format penalty is charged per invalid action, and the loss
covers every action token of the episode rather than only the last assistant turn.

Entry point for `experiments/run.py`: `learner.run.entry = @drift.train`.
"""

from __future__ import annotations

import dataclasses
import os

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import rollouts as rollouts_lib
from agentrl_jax.losses import sft
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer
from agentrl_jax.offline import common
from agentrl_jax.offline import store as store_lib
from agentrl_jax.rollout import loop as loop_lib

REFERENCES = ("policy", "noisy_expert")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DriftConfig:
  """DRIFT's data collection and weighting (defaults: the shipped script of DRIFT).

  Attributes:
    reference: who samples the offline data: "policy" (the initial, warm-started policy, frozen)
      or "noisy_expert" (the env's scripted expert with random actions mixed in).
    expert_noise: random-action probability of the "noisy_expert" reference.
    num_batches: offline batches collected up front, each `tasks_per_iteration` tasks ×
      `group_size` episodes.
    gamma: turn discount γ of the return.
    beta: temperature β of the weights (large = plain SFT, small = best-of-group).
    repetition_coef: λ_rep of the repetition penalty.
    format_penalty: added to the return per invalid action (negative).
    normalize_by_weight_sum: loss Σ w ℓ / Σ w instead of mean(w ℓ).
  """

  reference: str = "policy"
  expert_noise: float = 0.5
  num_batches: int = 4
  gamma: float = 0.9
  beta: float = 0.1
  repetition_coef: float = 0.5
  format_penalty: float = -0.1
  normalize_by_weight_sum: bool = False

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.reference not in REFERENCES:
      raise ValueError(f"DriftConfig.reference must be one of {REFERENCES}, got {self.reference!r}")
    if not 0 <= self.expert_noise <= 1:
      raise ValueError(f"DriftConfig.expert_noise must be in [0, 1], got {self.expert_noise}")
    if self.num_batches < 1:
      raise ValueError(f"DriftConfig.num_batches must be >= 1, got {self.num_batches}")
    if not 0 <= self.gamma <= 1:
      raise ValueError(f"DriftConfig.gamma must be in [0, 1], got {self.gamma}")
    if self.beta <= 0:
      raise ValueError(f"DriftConfig.beta must be > 0, got {self.beta}")
    if self.repetition_coef < 0:
      raise ValueError(f"DriftConfig.repetition_coef must be >= 0, got {self.repetition_coef}")


def trajectory_returns(traj: types.Trajectories, config: DriftConfig) -> jax.Array:
  """`R_b = G_b + format_penalty·n_invalid_b − P^rep_b` (docs/methods.md#drift), [B]."""
  turn_mask = jnp.asarray(traj.turn_mask)
  g = sft.discounted_turn_return(jnp.asarray(traj.reward), turn_mask, config.gamma)
  n_invalid = jnp.sum(turn_mask & ~jnp.asarray(traj.action_valid), axis=1)
  rep = sft.repetition_penalty(jnp.asarray(traj.obs_hash), turn_mask, config.repetition_coef)
  return g + config.format_penalty * n_invalid - rep


def make_weighted_sft_fn(setup: common.Setup, optimizer: optax.GradientTransformation,
                         normalize_by_weight_sum: bool):
  """Jitted `step(params, opt_state, traj, weights[B]) -> (params, opt_state, metrics)`."""

  def objective(params, traj, weights):
    positions = transformer.positions_from_turns(traj.turn_of_token)
    view = distribution.action_view(traj.action_mask, setup.max_actions)
    logp, _ = distribution.action_log_probs(setup.graphdef, params, traj.tokens, positions, view,
                                        setup.allowed, setup.temperature)
    mask = view.valid & traj.valid_trajectory[:, None]
    loss = sft.weighted_sft_loss(logp, mask, weights,
                                 normalize_by_weight_sum=normalize_by_weight_sum)
    return loss, {"sft/weighted_nll": loss, "sft/nll": jnp.mean(sft.sequence_nll(logp, mask))}

  def step(params, opt_state, traj, weights):
    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, traj, weights)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["loss/grad_norm"] = optax.global_norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  return jax.jit(step, donate_argnums=(0, 1))


def collect_offline(setup: common.Setup, params, config: configs.TrainConfig, drift: DriftConfig,
                    store: store_lib.TrajectoryStore) -> None:
  """Samples `num_batches` batches from the fixed reference into the store (version 0).

  Parts already on disk are kept, so an interrupted collection resumes where it stopped.
  """
  done = set(store.parts(0))
  actor_rng = np.random.default_rng(config.seed)
  for part in range(drift.num_batches):
    seeds, groups = rollouts_lib.task_batch(config, part)
    # Group ids are global over the whole offline set, so weights normalise per task.
    groups = [part * config.tasks_per_iteration + g for g in groups]
    if part in done:
      continue
    envs = [setup.make_env() for _ in seeds]
    if drift.reference == "noisy_expert":
      traj, _ = setup.runner.collect(envs, seeds, groups, actor=loop_lib.noisy_expert(
          drift.expert_noise), actor_rng=actor_rng)
    else:
      traj, _ = setup.runner.collect(envs, seeds, groups, params=params,
                                     rng=jax.random.fold_in(jax.random.key(config.seed), part))
    # The rollout's extras (e.g. initial_obs_hash) are derived data the store does not keep.
    store.write(store_lib.replayable(traj), seeds=seeds, policy_version=0, part=part)


class DriftMethod(common.PolicyMethod):
  """DRIFT as a driver method: weighted SFT on minibatches of the offline set."""

  name = "drift"

  def __init__(self, setup: common.Setup, config: configs.TrainConfig, drift: DriftConfig,
               store: store_lib.TrajectoryStore, step):
    self._setup, self._config, self._drift, self._store, self._step = (
        setup, config, drift, store, step)
    self._data = self._weights = None

  def prepare(self, state: types.ActorCriticState) -> dict[str, float]:
    """Collects the offline set with the reference (resumably) and weights it."""
    collect_offline(self._setup, state.policy_params, self._config, self._drift, self._store)
    data, _ = self._store.read(0)
    self._weights = sft.importance_weights(
        trajectory_returns(data, self._drift), jnp.asarray(data.group_id),
        self._drift.num_batches * self._config.tasks_per_iteration, self._drift.beta).weights
    self._data = common.to_device(data)
    return {"drift/offline_success": float(np.mean(data.success)),
            "drift/max_weight": float(jnp.max(self._weights)), "drift/episodes": data.batch_size}

  def iteration(self, state, iteration: int) -> driver.IterationResult:
    n = self._data.batch_size
    mb = min(self._config.batch_size, n)
    epoch, offset = divmod(iteration * mb, n)
    perm = np.random.default_rng([self._config.seed, epoch]).permutation(n)
    idx = jnp.asarray(np.resize(np.roll(perm, -offset), mb))
    batch = jax.tree.map(lambda x: jnp.take(x, idx, axis=0), self._data)
    params, opt_state, m = self._step(state.policy_params, state.policy_opt_state, batch,
                                      jnp.take(self._weights, idx))
    state = state.replace(policy_params=params, policy_opt_state=opt_state,
                          step=jnp.asarray(iteration + 1, jnp.int32))
    return driver.IterationResult(state, {k: float(v) for k, v in jax.device_get(m).items()}, batch)

  def progress(self, metrics) -> dict[str, float]:
    return {"nll": metrics["sft/nll"]}


def train(workdir: str, *, config: configs.TrainConfig = configs.TrainConfig(),
          model: transformer.TransformerConfig | None = None,
          rollout: loop_lib.RolloutConfig = loop_lib.RolloutConfig(),
          optim: configs.OptimConfig = configs.OptimConfig(),
          drift: DriftConfig = DriftConfig(),
          warm_start: configs.WarmStartConfig = configs.WarmStartConfig(),
          evaluation: configs.EvalConfig = configs.EvalConfig(),
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None) -> driver.Outcome:
  """Collects offline data from the reference once, then runs `num_iterations` weighted-SFT steps.

  Each step trains on one minibatch of `batch_size` stored episodes drawn without replacement
  within an epoch. The workdir holds the store (`trajectories/`), checkpoints and metrics; a
  rerun resumes both the collection and the training. The reference is the policy after the
  warm start (checkpointed at step 0), so a resumed collection uses the same one.
  """
  setup, params = common.resolve(config, model, rollout, tokenizer_path)
  optimizer = assembly.make_optimizer(optim, config.num_iterations)
  state = common.policy_state(params, optimizer, config.seed)
  store = store_lib.TrajectoryStore(os.path.join(workdir, "trajectories"))
  method = DriftMethod(setup, config, drift, store,
                       make_weighted_sft_fn(setup, optimizer, drift.normalize_by_weight_sum))
  return common.drive(workdir, method, state, setup=setup, config=config, warm=warm_start,
                      evaluation=evaluation, prepare=method.prepare, hooks=hooks)
