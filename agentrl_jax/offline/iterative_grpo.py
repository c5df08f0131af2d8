"""Iterative GRPO: single-turn GRPO against a learned turn-level Q, batch-online.

Each round k alternates
  * policy evaluation: deploy π_k on a batch of tasks, log the episodes in the trajectory store
    (policy version k), and fit `Q_φ(h, a)` — a value-head transformer read at the last token of
    the agent's turn — to the Monte-Carlo returns `G_t = Σ_{j≥t} γ^{j−t} r_j` by regression;
  * policy improvement: for logged contexts `h` (everything before a turn's action), draw G
    candidate actions from π_θ, score each with `Q_φ(h, a)`, and take ordinary GRPO steps (PPO
    clip + KL to π_k) — no environment or simulator is stepped in this phase.

Candidates are sampled with one forward pass per context, so the improvement phase needs the
constrained single-token action space (`TrainConfig.restrict_to_action_words = True`).

Entry point for `experiments/run.py`: `learner.run.entry = @iterative_grpo.train`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.advantages import step as step_advantages
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import rollouts as rollouts_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer
from agentrl_jax.offline import common
from agentrl_jax.offline import store as store_lib
from agentrl_jax.rollout import loop as loop_lib


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class IterativeGRPOConfig:
  """Policy-evaluation and policy-improvement budgets of one round.

  Attributes:
    gamma: turn discount of the Monte-Carlo returns (1 = terminal outcome).
    q_steps: Q regression steps per round (full logged batch each step).
    q_learning_rate: Adam learning rate of the Q model.
    q_loss: "mse" on Q, or "bce" on σ(Q) for returns in [0, 1].
    candidates: G actions drawn per context.
    contexts_per_step: logged contexts per GRPO step (the batch is contexts × candidates rows).
    improve_steps: GRPO steps per round.
  """

  gamma: float = 1.0
  q_steps: int = 50
  q_learning_rate: float = 1e-3
  q_loss: str = "mse"
  candidates: int = 8
  contexts_per_step: int = 32
  improve_steps: int = 10

  def __post_init__(self):
    config_errors.check_field_types(self)
    if not 0 <= self.gamma <= 1:
      raise ValueError(f"IterativeGRPOConfig.gamma must be in [0, 1], got {self.gamma}")
    if self.q_loss not in ("mse", "bce"):
      raise ValueError(f"IterativeGRPOConfig.q_loss must be 'mse' or 'bce', got {self.q_loss!r}")
    for name in ("q_steps", "candidates", "contexts_per_step", "improve_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"IterativeGRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.candidates < 2:
      raise ValueError(f"IterativeGRPOConfig.candidates must be >= 2 for a group baseline, got "
                       f"{self.candidates}")
    if self.q_learning_rate <= 0:
      raise ValueError(f"IterativeGRPOConfig.q_learning_rate must be > 0, got {self.q_learning_rate}")


def monte_carlo_turn_returns(reward: jax.Array, turn_mask: jax.Array, gamma: float) -> jax.Array:
  """`G_t = r_t + γ·G_{t+1}` over existing turns, [B, N] (0 on missing turns).

  The library's return-to-go (`advantages.step.step_returns`, GAE with V ≡ 0 and λ = 1).

  Args:
    reward: [B, N] reward after the action of turn t, turns [0, N).
    turn_mask: [B, N] which turns exist (a prefix of each row).
    gamma: turn discount.
  """
  chex.assert_rank([reward, turn_mask], 2)
  returns = step_advantages.step_returns(jnp.asarray(reward, jnp.float32), turn_mask, gamma)
  return jnp.where(turn_mask, returns, 0.0)


def turn_q_values(graphdef: nnx.GraphDef, params, tokens: jax.Array, turn_of_token: jax.Array,
                  index: jax.Array) -> jax.Array:
  """`Q_φ(h, a)` [B, N]: the value head at token `index[b, t]` (the last token of the action)."""
  positions = transformer.positions_from_turns(turn_of_token)
  values, _ = transformer.apply(graphdef, params, tokens, positions)
  return jnp.take_along_axis(values.astype(jnp.float32), jnp.maximum(index, 0), axis=1)


def q_regression_loss(q: jax.Array, returns: jax.Array, mask: jax.Array, kind: str) -> jax.Array:
  """Mean over `mask` of `(Q − G)²`, or of the BCE between σ(Q) and G ∈ [0, 1]."""
  mask = mask.astype(jnp.float32)
  if kind == "mse":
    per = (q - returns) ** 2
  else:
    per = optax.sigmoid_binary_cross_entropy(q, returns)
  return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def make_q_fit_fn(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, gamma: float,
                  kind: str):
  """Jitted `fit(params, opt_state, traj) -> (params, opt_state, loss)`: one regression step."""

  def objective(params, traj):
    returns = monte_carlo_turn_returns(traj.reward, traj.turn_mask, gamma)
    mask = traj.turn_mask & (traj.turn_end > traj.turn_start) & traj.valid_trajectory[:, None]
    q = turn_q_values(graphdef, params, traj.tokens, traj.turn_of_token, traj.turn_end - 1)
    return q_regression_loss(q, returns, mask, kind)

  def fit(params, opt_state, traj):
    loss, grads = jax.value_and_grad(objective)(params, traj)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jax.jit(fit, donate_argnums=(0, 1))


class Contexts(NamedTuple):
  """Logged decision points: row of the batch, turn, and token offset of the turn's action."""

  row: np.ndarray
  turn: np.ndarray
  start: np.ndarray


def logged_contexts(traj: types.Trajectories) -> Contexts:
  """Every existing agent turn of a fault-free trajectory is one context `h`."""
  ok = np.asarray(traj.turn_mask) & (np.asarray(traj.turn_end) > np.asarray(traj.turn_start))
  ok &= np.asarray(traj.valid_trajectory)[:, None]
  rows, turns = np.nonzero(ok)
  return Contexts(row=rows.astype(np.int32), turn=turns.astype(np.int32),
                  start=np.asarray(traj.turn_start)[rows, turns].astype(np.int32))


def make_candidate_fn(policy_graphdef: nnx.GraphDef, q_graphdef: nnx.GraphDef,
                      allowed: jax.Array | None, temperature: float, candidates: int,
                      max_turns: int, q_loss: str):
  """Jitted `build(policy, q, tokens[C,L], turns[C,L], start[C], turn[C], key) -> Trajectories`.

  Each context becomes `candidates` single-action rows: the history before the action (earlier
  actions are context now, so `action_mask` is 0 on them), one sampled action token at `start`,
  `outcome = Q_φ(h, a)` (σ(Q) when Q was fitted with BCE) and `group_id` = the context.
  """

  def build(policy_params, q_params, tokens, turns, start, turn, key):
    c, l = tokens.shape
    col = jnp.arange(l, dtype=jnp.int32)[None]
    keep = col < start[:, None]
    tokens = jnp.where(keep, tokens, 0)
    turns = jnp.where(keep, turns, -1)
    model = nnx.merge(policy_graphdef, policy_params)
    features, _ = model.features(tokens, transformer.positions_from_turns(turns))
    prev = jnp.take_along_axis(features, (start - 1)[:, None, None], axis=1)
    logp_all = distribution.policy_log_probs(model.head_out(prev)[:, 0], allowed, temperature)
    picked = jax.random.categorical(key, logp_all, shape=(candidates, c)).T  # [C, G]
    logp = jnp.take_along_axis(logp_all, picked, axis=1)
    rep = lambda x: jnp.repeat(x, candidates, axis=0)
    tokens, turns, start_g, turn_g = rep(tokens), rep(turns), rep(start), rep(turn)
    here = col == start_g[:, None]
    tokens = jnp.where(here, picked.reshape(-1)[:, None], tokens)
    turns = jnp.where(here, turn_g[:, None], turns)
    q = turn_q_values(q_graphdef, q_params, tokens, turns, start_g[:, None])[:, 0]
    reward = jax.nn.sigmoid(q) if q_loss == "bce" else q
    one_turn = jax.nn.one_hot(turn_g, max_turns, dtype=jnp.int32)
    b, n = c * candidates, max_turns
    return types.Trajectories(
        tokens=tokens, action_mask=here, turn_of_token=turns,
        sample_logprob=jnp.where(here, logp.reshape(-1)[:, None], 0.0),
        turn_mask=one_turn.astype(bool), reward=jnp.zeros((b, n), jnp.float32),
        done=one_turn.astype(bool), obs_hash=jnp.zeros((b, n), jnp.int32),
        action_valid=one_turn.astype(bool), env_error=jnp.zeros((b, n), bool),
        turn_start=one_turn * start_g[:, None], turn_end=one_turn * (start_g[:, None] + 1),
        group_id=jnp.repeat(jnp.arange(c, dtype=jnp.int32), candidates),
        outcome=reward.astype(jnp.float32), success=jnp.zeros((b,), bool))

  return jax.jit(build)


def train(workdir: str, *, config: configs.TrainConfig = configs.TrainConfig(),
          model: transformer.TransformerConfig | None = None,
          q_model: transformer.TransformerConfig | None = None,
          rollout: loop_lib.RolloutConfig = loop_lib.RolloutConfig(),
          loss: step_lib.LossConfig = step_lib.LossConfig(kl_coef=0.01),
          optim: configs.OptimConfig = configs.OptimConfig(),
          iterative: IterativeGRPOConfig = IterativeGRPOConfig(),
          warm_start: configs.WarmStartConfig = configs.WarmStartConfig(),
          evaluation: configs.EvalConfig = configs.EvalConfig(),
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None) -> driver.Outcome:
  """Runs `config.num_iterations` rounds of (deploy + log, fit Q, GRPO against Q).

  Args:
    workdir: store (`trajectories/`, one policy version per round), checkpoints, metrics.
    q_model: the Q model's architecture (default: the policy's), with a value head.
    loss: PPO-clip settings of the improvement steps; `kl_coef` is β_kl toward π_k.
    iterative: see `IterativeGRPOConfig`.
    Others: as `learner.train`.
  """
  if not config.restrict_to_action_words:
    raise config_errors.ConfigError(
        "iterative_grpo.train samples candidates with one forward pass per context and needs "
        "TrainConfig.restrict_to_action_words = True")
  setup, params = common.resolve(config, model, rollout, tokenizer_path)
  q_cfg = dataclasses.replace(q_model or setup.model, vocab_size=setup.model.vocab_size, head="value")
  q_graphdef, q_params = transformer.create(q_cfg, config.seed + 1)

  rows = iterative.contexts_per_step * iterative.candidates
  if rows % loss.num_minibatches:
    raise config_errors.ConfigError(f"{rows} candidate rows per step are not divisible into "
                                    f"LossConfig.num_minibatches={loss.num_minibatches}")
  policy_opt = assembly.make_optimizer(optim, config.num_iterations * iterative.improve_steps
                                     * loss.ppo_epochs * loss.num_minibatches)
  q_opt = optax.adam(iterative.q_learning_rate)
  state = types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(config.seed + 2)),
      policy_params=params,
      policy_opt_state=policy_opt.init(params), critic_params=q_params,
      critic_opt_state=q_opt.init(q_params), ref_params=_copy(params))
  grpo = functools.partial(estimators.get_estimator("grpo"), num_groups=iterative.contexts_per_step)
  update = step_lib.make_update_fn(
      policy_graphdef=setup.graphdef, critic_graphdef=None, policy_optimizer=policy_opt,
      critic_optimizer=None, advantage_fn=pipeline.CreditPipeline(estimator=grpo), loss=loss,
      allowed=setup.allowed, temperature=setup.temperature, max_actions=1)
  method = IterativeGRPOMethod(
      setup=setup, config=config, iterative=iterative, update=update,
      fit_q=make_q_fit_fn(q_graphdef, q_opt, iterative.gamma, iterative.q_loss),
      build=make_candidate_fn(setup.graphdef, q_graphdef, setup.allowed, setup.temperature,
                              iterative.candidates, setup.rollout.max_turns, iterative.q_loss),
      store=store_lib.TrajectoryStore(os.path.join(workdir, "trajectories")),
      base_key=jax.random.key(config.seed))
  return common.drive(workdir, method, state, setup=setup, config=config, warm=warm_start,
                      evaluation=evaluation, hooks=hooks)


class IterativeGRPOMethod(common.PolicyMethod):
  """One round k as a driver iteration: deploy π_k and log it, fit Q, GRPO against Q."""

  name = "iterative_grpo"

  def __init__(self, *, setup, config, iterative, update, fit_q, build, store, base_key):
    self._setup, self._config, self._iterative = setup, config, iterative
    self._update, self._fit_q, self._build, self._store = update, fit_q, build, store
    self._base_key = base_key

  def iteration(self, state, iteration: int) -> driver.IterationResult:
    round_key = jax.random.fold_in(self._base_key, 1000 + iteration)
    data, metrics = _deploy(self._setup, state.policy_params, self._config, self._store,
                            iteration, jax.random.fold_in(round_key, 0))
    state, q_metrics = _evaluate_policy(state, self._fit_q, data, self._iterative)
    metrics.update(q_metrics)
    state, improve_metrics = _improve_policy(state, self._update, self._build, data,
                                             self._iterative, jax.random.fold_in(round_key, 1))
    metrics.update(improve_metrics)
    return driver.IterationResult(state, metrics, data)

  def progress(self, metrics) -> dict[str, float]:
    return {"success": metrics["train/success"], "q_loss": metrics["q/loss"]}


def _deploy(setup, params, config, store, k, key):
  """Plays π_k on round k's tasks and logs them as policy version k (reused when already logged)."""
  if 0 not in store.parts(k):
    seeds, groups = rollouts_lib.task_batch(config, k)
    traj, _, _ = common.collect(setup, params, seeds, groups, key)
    # The rollout's extras (e.g. initial_obs_hash) are derived data the store does not keep.
    store.write(store_lib.replayable(traj), seeds=seeds, policy_version=k)
  data, _ = store.read(k, part=0)
  return data, {"train/success": float(np.mean(data.success)),
                "train/outcome": float(np.mean(data.outcome))}


def _evaluate_policy(state, fit_q, data, iterative):
  """Policy evaluation: `q_steps` regression steps of Q_φ on the logged returns."""
  q_params, q_opt_state = state.critic_params, state.critic_opt_state
  device_data = common.to_device(data)
  first = last = None
  for _ in range(iterative.q_steps):
    q_params, q_opt_state, loss = fit_q(q_params, q_opt_state, device_data)
    first = loss if first is None else first
    last = loss
  return (state.replace(critic_params=q_params, critic_opt_state=q_opt_state),
          {"q/loss": float(last), "q/loss_first_step": float(first)})


def _improve_policy(state, update, build, data, iterative, key):
  """Policy improvement: GRPO steps on logged contexts, rewards from Q_φ; no env is stepped."""
  contexts = logged_contexts(data)
  if len(contexts.row) == 0:
    return state, {}
  # KL anchor: π_k, copied because the update donates the policy's buffers.
  state = state.replace(ref_params=_copy(state.policy_params))
  tokens, turns = jnp.asarray(data.tokens), jnp.asarray(data.turn_of_token)
  rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())
  sums: dict[str, float] = {}
  for i in range(iterative.improve_steps):
    pick = rng.choice(len(contexts.row), size=iterative.contexts_per_step,
                      replace=len(contexts.row) < iterative.contexts_per_step)
    row = contexts.row[pick]
    batch = build(state.policy_params, state.critic_params, tokens[row], turns[row],
                  jnp.asarray(contexts.start[pick]), jnp.asarray(contexts.turn[pick]),
                  jax.random.fold_in(key, i))
    state, m = update(state, batch)
    m = dict(jax.device_get(m), **{"improve/q_reward": jnp.mean(batch.outcome)})
    for name, value in m.items():
      sums[name] = sums.get(name, 0.0) + float(value) / iterative.improve_steps
  return state, sums


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)
