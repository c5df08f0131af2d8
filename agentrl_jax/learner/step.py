"""The jitted update: score a batch (credit pipeline), then PPO-clip policy and value steps.

`make_update_fn` returns one function `update(state, traj) -> (state, metrics)`, jitted with the
state donated. Old log-probs and values are recomputed from the pre-update parameters (the
behaviour policy at staleness 0); the gap to the sampler's own log-probs is reported as
`logprob_drift` (TITO: it measures numerical mismatch only, since the tokens are identical).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.losses import kl as kl_lib
from agentrl_jax.losses import policy as policy_loss
from agentrl_jax.losses import value as value_loss
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LossConfig:
  """Policy/value loss hyperparameters (ALGORITHMS.md A.1, A.2)."""

  clip_low: float = 0.2
  clip_high: float = 0.2
  dual_clip: float | None = 3.0
  agg_mode: str = "token-mean"
  max_len_norm: int | None = None
  entropy_coef: float = 0.0
  kl_coef: float = 0.0
  kl_kind: str = "low_var_kl"
  value_coef: float = 1.0
  value_clip: float = 0.5
  ppo_epochs: int = 1
  num_minibatches: int = 1
  # Mixture-of-experts policies: route each token to the experts the sampler used (recorded in
  # traj.extras['routing']), so training log-probs are those of the sampled policy (B.6).
  replay_routing: bool = True
  # Truncated importance sampling (None = off): each token's advantage is weighted by
  # min(π_old(a)/π_sample(a), tis_cap), correcting for a sampler that is not exactly the policy
  # the update starts from (numerical drift, or a pipelined batch one update stale).
  tis_cap: float | None = None
  # Importance ratio per 'token' (PPO), per 'turn' (the mean log-ratio of each turn's action
  # tokens, shared by them: a turn is clipped as one decision; RTPO), or per 'sequence' (GSPO).
  ratio_level: str = "token"

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.ratio_level not in ("token", "turn", "sequence"):
      raise ValueError(f"LossConfig.ratio_level must be 'token', 'turn' or 'sequence', got "
                       f"{self.ratio_level!r}")
    if self.tis_cap is not None and self.tis_cap < 1:
      raise ValueError(f"LossConfig.tis_cap must be >= 1 (or None), got {self.tis_cap}")
    if self.clip_low <= 0 or self.clip_high <= 0:
      raise ValueError(f"LossConfig: clip_low/clip_high must be > 0, got {self.clip_low}, {self.clip_high}")
    if self.dual_clip is not None and self.dual_clip <= 1:
      raise ValueError(f"LossConfig.dual_clip must be > 1 or None, got {self.dual_clip}")
    if self.ppo_epochs < 1 or self.num_minibatches < 1:
      raise ValueError(f"LossConfig: ppo_epochs and num_minibatches must be >= 1, got "
                       f"{self.ppo_epochs}, {self.num_minibatches}")
    if self.agg_mode == "seq-mean-token-sum-norm" and not self.max_len_norm:
      raise ValueError("LossConfig.agg_mode='seq-mean-token-sum-norm' needs max_len_norm (L_max)")


def truncated_importance_weights(old_logp: jax.Array, sample_logp: jax.Array, valid: jax.Array,
                                 cap: float) -> jax.Array:
  """`min(exp(old − sample), cap)` per token, without gradient; 1 where `valid` is False.

  `old` is the policy the update starts from, `sample` the one that drew the tokens: equal up
  to numerics when synchronous, one update apart when pipelined.
  """
  ratio = jnp.exp(jax.lax.stop_gradient(old_logp) - sample_logp)
  return jnp.where(valid, jnp.minimum(ratio, cap), 1.0)


def shifted_values(values: jax.Array) -> jax.Array:
  """Value of the state before token t is the critic's output at t−1 (the prefix that chose t)."""
  return jnp.concatenate([jnp.zeros_like(values[:, :1]), values[:, :-1]], axis=1)


def _tree_where(flag, new, old):
  return jax.tree.map(lambda n, o: jnp.where(flag, n, o), new, old)


def make_update_fn(
    *, policy_graphdef: nnx.GraphDef, critic_graphdef: nnx.GraphDef | None,
    policy_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation | None,
    advantage_fn: Callable[[types.Trajectories, jax.Array | None], Any],
    loss: LossConfig, allowed: jax.Array | None, temperature: float = 1.0,
    max_actions: int,
) -> Callable[[types.ActorCriticState, types.Trajectories], tuple[types.ActorCriticState, dict]]:
  """Builds the jitted update step.

  Args:
    policy_graphdef, critic_graphdef: module structures (critic None when unused).
    policy_optimizer, critic_optimizer: optax transformations.
    advantage_fn: (traj, token values or None) -> AdvantageOutput; the whole credit pipeline.
    loss: loss hyperparameters.
    allowed: [V] action-vocabulary mask shared with the sampler, or None.
    temperature: the sampler's temperature (the policy is the tempered distribution).
    max_actions: an upper bound on the action tokens of one trajectory (turns × per-turn cap).
  """
  use_critic = critic_graphdef is not None

  def forward_policy(params, traj, positions, view):
    routing = traj.extras.get(extra_keys.ROUTING_KEY) if loss.replay_routing else None
    return distribution.action_log_probs(policy_graphdef, params, traj.tokens, positions, view, allowed,
                            temperature, routing)

  def forward_critic(params, traj, positions):
    values, _ = transformer.apply(critic_graphdef, params, traj.tokens, positions)
    return shifted_values(values.astype(jnp.float32))

  def policy_objective(params, ref_params, traj, positions, view, old_logp, advantages, mask):
    """Everything token-level here is [B, K] over the action tokens of `view`."""
    logp, entropy = forward_policy(params, traj, positions, view)
    if old_logp is None:  # one on-policy step: the behaviour policy is these very parameters
      old_logp = jax.lax.stop_gradient(logp)
    behaviour = view.gather(traj.sample_logprob)
    drift = policy_loss.aggregate(
        jnp.abs(jax.lax.stop_gradient(logp) - behaviour), view.valid, "token-mean")
    tis, weight = {}, None
    if loss.tis_cap is not None:
      weight = truncated_importance_weights(old_logp, behaviour, view.valid, loss.tis_cap)
      tis = {"loss/tis_weight": policy_loss.aggregate(weight, view.valid, "token-mean"),
             "loss/tis_truncated": policy_loss.aggregate(
                 (weight >= loss.tis_cap).astype(jnp.float32), view.valid, "token-mean")}
    ratio_logp = logp
    if loss.ratio_level == "turn":  # each turn's tokens share the turn's mean log-ratio
      ratio_logp = jax.lax.stop_gradient(old_logp) + policy_loss.turn_mean_log_ratio(
          logp, old_logp, view.gather(traj.turn_of_token), mask, traj.turn_mask.shape[1])
    out = policy_loss.clipped_surrogate_loss(
        ratio_logp, old_logp, advantages, mask, clip_low=loss.clip_low, clip_high=loss.clip_high,
        dual_clip=loss.dual_clip, agg_mode=loss.agg_mode, max_len=loss.max_len_norm,
        is_weights=weight, ratio_level="sequence" if loss.ratio_level == "sequence" else "token")
    ent = policy_loss.aggregate(entropy, mask, "token-mean")
    total = out.loss - loss.entropy_coef * ent
    kl = jnp.zeros(())
    if loss.kl_coef > 0:
      ref_logp, _ = forward_policy(jax.lax.stop_gradient(ref_params), traj, positions, view)
      kl = policy_loss.aggregate(kl_lib.kl_penalty(logp, ref_logp, loss.kl_kind), mask, loss.agg_mode,
                                 max_len=loss.max_len_norm)
      total = total + loss.kl_coef * kl
    return total, {"loss/policy": out.loss, "loss/entropy": ent, "loss/kl": kl,
                   "rollout/logprob_drift": drift, **tis,
                   "loss/clip_fraction": out.clip_fraction, "loss/approx_kl": out.approx_kl}

  def critic_objective(params, traj, positions, old_values, returns, mask):
    values = forward_critic(params, traj, positions)
    v_loss = value_loss.clipped_value_loss(values, old_values, returns, mask,
                                           clip_eps=loss.value_clip, agg_mode=loss.agg_mode).loss
    return loss.value_coef * v_loss, {"loss/value": v_loss}

  def update(state: types.ActorCriticState, traj: types.Trajectories):
    chex.assert_rank(traj.tokens, 2)
    positions = distribution.trajectory_positions(traj)
    mask = traj.action_mask & traj.valid_trajectory[:, None]
    # With a single on-policy step the pre-update log-probs come from the same forward pass
    # as the gradient; recomputing them separately would cost a third of the update.
    view = distribution.action_view(traj.action_mask, max_actions)
    single_step = loss.ppo_epochs == 1 and loss.num_minibatches == 1
    old_logp = None if single_step else forward_policy(state.policy_params, traj, positions, view)[0]
    old_values = forward_critic(state.critic_params, traj, positions) if use_critic else None
    scored = advantage_fn(traj, old_values)
    advantages = jax.lax.stop_gradient(scored.advantages)
    metrics = {
        "credit/advantage_mean": policy_loss.aggregate(advantages, mask, "token-mean"),
        "credit/advantage_abs": policy_loss.aggregate(jnp.abs(advantages), mask, "token-mean"),
    }
    action_advantages, action_mask = view.gather(advantages), view.gather(mask)
    b = traj.tokens.shape[0]
    if b % loss.num_minibatches:
      raise ValueError(f"batch of {b} trajectories is not divisible into "
                       f"{loss.num_minibatches} minibatches")
    mb = b // loss.num_minibatches

    def minibatch_step(state, idx):
      sub = lambda x: jnp.take(x, idx, axis=0)
      traj_mb = jax.tree.map(sub, traj)
      pos_mb = jax.tree.map(sub, positions)
      view_mb = jax.tree.map(sub, view)
      (p_loss, p_metrics), p_grads = jax.value_and_grad(policy_objective, has_aux=True)(
          state.policy_params, state.ref_params, traj_mb, pos_mb, view_mb,
          None if old_logp is None else sub(old_logp), sub(action_advantages), sub(action_mask))
      grads_finite = jnp.isfinite(optax.global_norm(p_grads)) & jnp.isfinite(p_loss)
      updates, new_opt = policy_optimizer.update(p_grads, state.policy_opt_state, state.policy_params)
      new_params = optax.apply_updates(state.policy_params, updates)
      step_metrics = dict(p_metrics, **{"loss/grad_norm": optax.global_norm(p_grads)})
      new_critic, new_critic_opt = state.critic_params, state.critic_opt_state
      if use_critic:
        (_, c_metrics), c_grads = jax.value_and_grad(critic_objective, has_aux=True)(
            state.critic_params, traj_mb, pos_mb, sub(old_values), sub(scored.returns), sub(mask))
        grads_finite &= jnp.isfinite(optax.global_norm(c_grads))
        c_updates, new_critic_opt = critic_optimizer.update(
            c_grads, state.critic_opt_state, state.critic_params)
        new_critic = optax.apply_updates(state.critic_params, c_updates)
        step_metrics.update(c_metrics)
      # A non-finite loss or gradient skips the whole step; it never reaches the parameters.
      new_state = state.replace(
          policy_params=_tree_where(grads_finite, new_params, state.policy_params),
          policy_opt_state=_tree_where(grads_finite, new_opt, state.policy_opt_state),
          critic_params=_tree_where(grads_finite, new_critic, state.critic_params),
          critic_opt_state=_tree_where(grads_finite, new_critic_opt, state.critic_opt_state))
      step_metrics["loss/skipped_nonfinite"] = 1.0 - grads_finite.astype(jnp.float32)
      return new_state, step_metrics

    def epoch(state, key):
      perm = jax.random.permutation(key, b).reshape(loss.num_minibatches, mb)
      return jax.lax.scan(minibatch_step, state, perm)

    rng, key = jax.random.split(state.rng)
    keys = jax.random.split(key, loss.ppo_epochs)
    state, step_metrics = jax.lax.scan(epoch, state, keys)
    metrics.update(jax.tree.map(jnp.mean, step_metrics))
    metrics["loss/skipped_nonfinite"] = jnp.sum(step_metrics["loss/skipped_nonfinite"])
    return state.replace(step=state.step + 1, rng=rng), metrics

  return jax.jit(update, donate_argnums=(0,))


def make_sft_fn(*, policy_graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                allowed: jax.Array | None, temperature: float = 1.0, max_actions: int):
  """Jitted behaviour-cloning step on action tokens (warm start from scripted demonstrations).

  Returns `sft(params, opt_state, traj) -> (params, opt_state, metrics)`; the loss is the
  token-mean negative log-likelihood of the demonstrated action tokens under the same
  restricted policy the sampler uses.
  """

  def nll(params, traj):
    positions = distribution.trajectory_positions(traj)
    view = distribution.action_view(traj.action_mask, max_actions)
    logp, _ = distribution.action_log_probs(policy_graphdef, params, traj.tokens, positions, view, allowed,
                               temperature)
    return -policy_loss.aggregate(logp, view.valid, "token-mean")

  def sft(params, opt_state, traj):
    value, grads = jax.value_and_grad(nll)(params, traj)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"sft/nll": value}

  return jax.jit(sft, donate_argnums=(0, 1))
