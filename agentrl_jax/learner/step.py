"""The jitted update: score a batch (credit pipeline), then PPO-clip policy and value steps.

`make_update_fn` returns one function `update(state, traj) -> (state, metrics)`, jitted with the
state donated. Old log-probs and values are recomputed from the pre-update parameters (the
behaviour policy at staleness 0); the gap to the sampler's own log-probs is reported as
`logprob_drift` (TITO: it measures numerical mismatch only, since the tokens are identical).
"""

from __future__ import annotations

import dataclasses
import functools
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
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import transformer


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LossConfig:
  """Policy/value loss hyperparameters (docs/methods.md#ppo-gae, #ppo-loss)."""

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
  # Gradient accumulation: each minibatch's gradient is summed over this many slices of it,
  # one forward/backward at a time (activation memory of a slice), then applied in one step.
  # The loss is the minibatch's exactly: every slice is scaled by its share of the minibatch's
  # normaliser (its tokens, rows or non-empty rows, per agg_mode).
  micro_batches: int = 1
  # Mixture-of-experts policies: route each token to the experts the sampler used (recorded in
  # traj.extras['routing']), so training log-probs are those of the sampled policy.
  replay_routing: bool = True
  # Truncated importance sampling (None = off): each token's advantage is weighted by
  # min(π_old(a)/π_sample(a), tis_cap), correcting for a sampler that is not exactly the policy
  # the update starts from (numerical drift, or a pipelined batch one update stale).
  tis_cap: float | None = None
  # Importance ratio per 'token' (PPO), per 'turn' (the mean log-ratio of each turn's action
  # tokens, shared by them: a turn is clipped as one decision; RTPO), or per 'sequence' (GSPO).
  ratio_level: str = "token"
  # T1's critic warm-up: the first this many updates train the critic alone; the policy and its
  # optimizer state stay as they are (the update counter is `state.step`).
  critic_warmup_steps: int = 0
  # Log `credit/gradient_snr`: the policy gradient's SNR across the minibatch's micro-batches
  # (`micro_batch_snr`, cheap: one extra scalar per micro-batch). Needs micro_batches >= 2.
  gradient_snr: bool = False
  # The LM head over this many action positions at a time, each chunk recomputed in the backward
  # (None: all at once). A large vocabulary's logits at every action token are the update's
  # largest arrays (16 x 192 positions x 49k: 0.6 GB, several held by the backward).
  head_chunk: int | None = None

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
    if self.gradient_snr and self.micro_batches < 2:
      raise ValueError("LossConfig.gradient_snr compares micro-batch gradients: set "
                       f"micro_batches >= 2, got {self.micro_batches}")
    if self.critic_warmup_steps < 0:
      raise ValueError(f"LossConfig.critic_warmup_steps must be >= 0, got {self.critic_warmup_steps}")
    if self.ppo_epochs < 1 or self.num_minibatches < 1 or self.micro_batches < 1:
      raise ValueError(f"LossConfig: ppo_epochs, num_minibatches and micro_batches must be >= 1, "
                       f"got {self.ppo_epochs}, {self.num_minibatches}, {self.micro_batches}")
    if self.head_chunk is not None and self.head_chunk < 1:
      raise ValueError(f"LossConfig.head_chunk must be >= 1 (or None), got {self.head_chunk}")
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


def aggregation_normaliser(mask: jax.Array, mode: str) -> jax.Array:
  """What `losses.policy.aggregate(·, mask, mode)` divides its masked sum by, up to a constant.

  token-mean: the masked tokens (at least 1); seq-mean-token-sum: the rows; seq-mean-token-mean:
  the non-empty rows (at least 1); seq-mean-token-sum-norm: a constant (L_max), returned as 1.
  A slice of a batch contributes `aggregate(slice) · normaliser(slice) / normaliser(batch)` to
  the batch's aggregate, exactly (`micro_batch_share`).
  """
  chex.assert_rank(mask, 2)
  mask = jnp.asarray(mask).astype(jnp.float32)
  if mode == "token-mean":
    return jnp.maximum(jnp.sum(mask), 1.0)
  if mode == "seq-mean-token-sum":
    return jnp.asarray(mask.shape[0], jnp.float32)
  if mode == "seq-mean-token-mean":
    return jnp.maximum(jnp.sum(jnp.sum(mask, axis=-1) > 0).astype(jnp.float32), 1.0)
  if mode == "seq-mean-token-sum-norm":
    return jnp.ones((), jnp.float32)
  raise ValueError(f"unknown aggregation mode {mode!r}; known: {', '.join(policy_loss.AGGREGATION_MODES)}")


def micro_batch_share(micro_mask: jax.Array, batch_mask: jax.Array, mode: str) -> jax.Array:
  """The weight that turns a slice's `aggregate` into its exact part of the batch's aggregate."""
  return aggregation_normaliser(micro_mask, mode) / aggregation_normaliser(batch_mask, mode)


def _scaled(x, share):
  return x if share is None else x * share


def _summed_value_and_grad(objective, params, micro_args, micro_batches: int):
  """`value_and_grad(objective, has_aux=True)` summed over micro-batches, one at a time.

  `micro_args(j)` gives the objective's arguments after `params` for micro-batch j (an int32
  scalar under the scan); the objective weighs its outputs by the micro-batch's share, so the
  sums are the whole minibatch's values. Also returns `Σ_j ‖g_j‖²` over the micro-batch
  gradients (a scalar; what `micro_batch_snr` needs beside the sum).
  """
  grad_fn = jax.value_and_grad(objective, has_aux=True)

  def micro(acc, j):
    (value, aux), grads = grad_fn(params, *micro_args(j))
    summed, square = acc
    return (jax.tree.map(jnp.add, summed, grads), square + optax.global_norm(grads) ** 2), (value, aux)

  zeros = jax.tree.map(jnp.zeros_like, params)
  (grads, square), (values, aux) = jax.lax.scan(micro, (zeros, jnp.zeros((), jnp.float32)),
                                                jnp.arange(micro_batches))
  return (jnp.sum(values), jax.tree.map(lambda x: jnp.sum(x, axis=0), aux)), grads, square


def micro_batch_snr(summed_grads, square_norms: jax.Array, micro_batches: int) -> jax.Array:
  """Gradient SNR of one micro-batch's estimate, from the micro-batch gradients' sum and Σ‖g_j‖².

  Each micro-batch holds an equal share of the minibatch, so `M·g_j` is an estimate of the
  minibatch gradient `G = Σ_j g_j`; as `density.gradient_snr` over those M samples, without
  holding them: v = (Σ_j ‖M·g_j‖² − M‖G‖²)/(M − 1), SNR = sqrt(max(‖G‖² − v/M, tiny)/v).
  """
  m = micro_batches
  mean_sq = optax.global_norm(summed_grads) ** 2
  noise = jnp.maximum((m * m * square_norms - m * mean_sq) / (m - 1), jnp.finfo(jnp.float32).tiny)
  signal = jnp.maximum(mean_sq - noise / m, jnp.finfo(jnp.float32).tiny)
  return jnp.sqrt(signal) / jnp.sqrt(noise)


def _in_chunks(fn, chunks: int, *args):
  """`fn(*args)` on `chunks` consecutive row slices of batch-major args, one after another."""
  if chunks == 1:
    return fn(*args)
  split = lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:])
  out = jax.lax.map(lambda a: fn(*a), jax.tree.map(split, args))
  return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)


def make_update_fn(
    *, policy_graphdef: nnx.GraphDef, critic_graphdef: nnx.GraphDef | None,
    policy_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation | None,
    advantage_fn: Callable[[types.Trajectories, jax.Array | None], Any],
    loss: LossConfig, allowed: jax.Array | None, temperature: float = 1.0,
    max_actions: int, lora: lora_lib.LoRAConfig | None = None,
) -> Callable[..., tuple[types.ActorCriticState, dict]]:
  """Builds the jitted update step, `update(state, traj[, base]) -> (state, metrics)`.

  Args:
    policy_graphdef, critic_graphdef: module structures (critic None when unused).
    policy_optimizer, critic_optimizer: optax transformations.
    advantage_fn: (traj, token values or None) -> AdvantageOutput; the whole credit pipeline.
    loss: loss hyperparameters.
    allowed: [V] action-vocabulary mask shared with the sampler, or None.
    temperature: the sampler's temperature (the policy is the tempered distribution).
    max_actions: an upper bound on the action tokens of one trajectory (turns × per-turn cap).
    lora: None: `state.policy_params` are the policy's parameters. A LoRA config:
      `state.policy_params` are the adapters (`lora.init_adapters`) and `update` takes the frozen
      base as a third argument; the forward passes read `lora.merged({"base", "lora"})`, only the
      adapters get gradients and optimizer state, and the KL reference is the base (the policy
      the adapters start from), so `state.ref_params` is unused. The base is an argument, not
      part of the donated state: it is never copied, updated or checkpointed with the state.
  """
  use_critic = critic_graphdef is not None
  micro_batches = loss.micro_batches

  def model_params(params, base):
    if lora is None:
      return params
    return lora_lib.merged(lora_lib.trainable(base, params), lora)

  def forward_policy(params, traj, positions, view):
    """`params` are plain model parameters (already merged for LoRA)."""
    routing = traj.extras.get(extra_keys.ROUTING_KEY) if loss.replay_routing else None
    return distribution.action_log_probs(policy_graphdef, params, traj.tokens, positions, view, allowed,
                            temperature, routing, loss.head_chunk)

  def forward_critic(params, traj, positions):
    values, _ = transformer.apply(critic_graphdef, params, traj.tokens, positions)
    return shifted_values(values.astype(jnp.float32))

  def policy_objective(params, ref_params, base, traj, positions, view, old_logp, advantages, mask,
                       shares):
    """Everything token-level here is [B, K] over the action tokens of `view`.

    `shares` (None: the whole minibatch) weigh a micro-batch's terms by its part of the
    minibatch's normalisers: 'agg' (agg_mode over `mask`), 'mask' and 'valid' (token means over
    `mask` and over `view.valid`).
    """
    share = (lambda _: None) if shares is None else shares.__getitem__
    logp, entropy = forward_policy(model_params(params, base), traj, positions, view)
    if old_logp is None:  # one on-policy step: the behaviour policy is these very parameters
      old_logp = jax.lax.stop_gradient(logp)
    behaviour = view.gather(traj.sample_logprob)
    drift = policy_loss.aggregate(
        jnp.abs(jax.lax.stop_gradient(logp) - behaviour), view.valid, "token-mean")
    tis, weight = {}, None
    if loss.tis_cap is not None:
      weight = truncated_importance_weights(old_logp, behaviour, view.valid, loss.tis_cap)
      tis = {"loss/tis_weight": _scaled(policy_loss.aggregate(weight, view.valid, "token-mean"),
                                        share("valid")),
             "loss/tis_truncated": _scaled(policy_loss.aggregate(
                 (weight >= loss.tis_cap).astype(jnp.float32), view.valid, "token-mean"),
                 share("valid"))}
    ratio_logp = logp
    if loss.ratio_level == "turn":  # each turn's tokens share the turn's mean log-ratio
      ratio_logp = jax.lax.stop_gradient(old_logp) + policy_loss.turn_mean_log_ratio(
          logp, old_logp, view.gather(traj.turn_of_token), mask, traj.turn_mask.shape[1])
    out = policy_loss.clipped_surrogate_loss(
        ratio_logp, old_logp, advantages, mask, clip_low=loss.clip_low, clip_high=loss.clip_high,
        dual_clip=loss.dual_clip, agg_mode=loss.agg_mode, max_len=loss.max_len_norm,
        is_weights=weight, ratio_level="sequence" if loss.ratio_level == "sequence" else "token")
    surrogate = _scaled(out.loss, share("agg"))
    ent = _scaled(policy_loss.aggregate(entropy, mask, "token-mean"), share("mask"))
    total = surrogate - loss.entropy_coef * ent
    kl = jnp.zeros(())
    if loss.kl_coef > 0:
      reference = base if lora is not None else ref_params
      ref_logp, _ = forward_policy(jax.lax.stop_gradient(reference), traj, positions, view)
      kl = _scaled(policy_loss.aggregate(kl_lib.kl_penalty(logp, ref_logp, loss.kl_kind), mask,
                                         loss.agg_mode, max_len=loss.max_len_norm), share("agg"))
      total = total + loss.kl_coef * kl
    return total, {"loss/policy": surrogate, "loss/entropy": ent, "loss/kl": kl,
                   "rollout/logprob_drift": _scaled(drift, share("valid")), **tis,
                   "loss/clip_fraction": _scaled(out.clip_fraction, share("mask")),
                   "loss/approx_kl": _scaled(out.approx_kl, share("mask"))}

  def critic_objective(params, traj, positions, old_values, returns, mask, share):
    values = forward_critic(params, traj, positions)
    v_loss = _scaled(value_loss.clipped_value_loss(
        values, old_values, returns, mask, clip_eps=loss.value_clip, agg_mode=loss.agg_mode).loss,
        share)
    return loss.value_coef * v_loss, {"loss/value": v_loss}

  def update(state: types.ActorCriticState, traj: types.Trajectories, base=None):
    chex.assert_rank(traj.tokens, 2)
    if (lora is None) != (base is None):
      raise ValueError("a LoRA update takes the frozen base as its third argument; "
                       "a plain update takes none")
    positions = distribution.trajectory_positions(traj)
    mask = traj.action_mask & traj.valid_trajectory[:, None]
    # With a single on-policy step the pre-update log-probs come from the same forward pass
    # as the gradient; recomputing them separately would cost a third of the update.
    view = distribution.action_view(traj.action_mask, max_actions)
    single_step = loss.ppo_epochs == 1 and loss.num_minibatches == 1
    b = traj.tokens.shape[0]
    if b % loss.num_minibatches:
      raise ValueError(f"batch of {b} trajectories is not divisible into "
                       f"{loss.num_minibatches} minibatches")
    mb = b // loss.num_minibatches
    if mb % micro_batches:
      raise ValueError(f"minibatch of {mb} trajectories is not divisible into "
                       f"LossConfig.micro_batches={micro_batches}")
    micro = mb // micro_batches
    # The no-gradient passes over the whole batch go a micro-batch of rows at a time too, so
    # none of them holds more activations than one training slice.
    chunks = b // micro
    old_logp = None
    if not single_step:
      merged = model_params(state.policy_params, base)
      old_logp = _in_chunks(lambda t, p, v: forward_policy(merged, t, p, v)[0], chunks,
                            traj, positions, view)
    old_values = (_in_chunks(functools.partial(forward_critic, state.critic_params), chunks,
                             traj, positions) if use_critic else None)
    scored = advantage_fn(traj, old_values)
    advantages = jax.lax.stop_gradient(scored.advantages)
    metrics = {
        "credit/advantage_mean": policy_loss.aggregate(advantages, mask, "token-mean"),
        "credit/advantage_abs": policy_loss.aggregate(jnp.abs(advantages), mask, "token-mean"),
    }
    action_advantages, action_mask = view.gather(advantages), view.gather(mask)

    def policy_args(idx, shares):
      sub = lambda x: jnp.take(x, idx, axis=0)
      return (state.ref_params, base, jax.tree.map(sub, traj), jax.tree.map(sub, positions),
              jax.tree.map(sub, view), None if old_logp is None else sub(old_logp),
              sub(action_advantages), sub(action_mask), shares)

    def critic_args(idx, share):
      sub = lambda x: jnp.take(x, idx, axis=0)
      return (jax.tree.map(sub, traj), jax.tree.map(sub, positions), sub(old_values),
              sub(scored.returns), sub(mask), share)

    def gradients(objective, params, args, shares_of, idx):
      """The minibatch `idx`'s (loss, metrics) and gradient, summed over its micro-batches."""
      if micro_batches == 1:
        return (*jax.value_and_grad(objective, has_aux=True)(params, *args(idx, None)), None)
      slices = idx.reshape(micro_batches, micro)
      return _summed_value_and_grad(
          objective, params, lambda j: args(slices[j], shares_of(slices[j], idx)), micro_batches)

    def policy_shares(part, whole):
      rows = lambda x, i: jnp.take(x, i, axis=0)
      return {"agg": micro_batch_share(rows(action_mask, part), rows(action_mask, whole),
                                       loss.agg_mode),
              "mask": micro_batch_share(rows(action_mask, part), rows(action_mask, whole),
                                        "token-mean"),
              "valid": micro_batch_share(rows(view.valid, part), rows(view.valid, whole),
                                         "token-mean")}

    def critic_share(part, whole):
      return micro_batch_share(jnp.take(mask, part, axis=0), jnp.take(mask, whole, axis=0),
                               loss.agg_mode)

    def minibatch_step(state, idx):
      (p_loss, p_metrics), p_grads, p_square = gradients(
          policy_objective, state.policy_params, policy_args, policy_shares, idx)
      grads_finite = jnp.isfinite(optax.global_norm(p_grads)) & jnp.isfinite(p_loss)
      updates, new_opt = policy_optimizer.update(p_grads, state.policy_opt_state, state.policy_params)
      new_params = optax.apply_updates(state.policy_params, updates)
      step_metrics = dict(p_metrics, **{"loss/grad_norm": optax.global_norm(p_grads)})
      if loss.gradient_snr:
        step_metrics["credit/gradient_snr"] = micro_batch_snr(p_grads, p_square, micro_batches)
      new_critic, new_critic_opt = state.critic_params, state.critic_opt_state
      if use_critic:
        (_, c_metrics), c_grads, _ = gradients(
            critic_objective, state.critic_params, critic_args, critic_share, idx)
        grads_finite &= jnp.isfinite(optax.global_norm(c_grads))
        c_updates, new_critic_opt = critic_optimizer.update(
            c_grads, state.critic_opt_state, state.critic_params)
        new_critic = optax.apply_updates(state.critic_params, c_updates)
        step_metrics.update(c_metrics)
      # A non-finite loss or gradient skips the whole step; it never reaches the parameters.
      policy_on = grads_finite & (state.step >= loss.critic_warmup_steps)
      new_state = state.replace(
          policy_params=_tree_where(policy_on, new_params, state.policy_params),
          policy_opt_state=_tree_where(policy_on, new_opt, state.policy_opt_state),
          critic_params=_tree_where(grads_finite, new_critic, state.critic_params),
          critic_opt_state=_tree_where(grads_finite, new_critic_opt, state.critic_opt_state))
      step_metrics["loss/skipped_nonfinite"] = 1.0 - grads_finite.astype(jnp.float32)
      step_metrics["loss/policy_frozen"] = 1.0 - policy_on.astype(jnp.float32)
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
                allowed: jax.Array | None, temperature: float = 1.0, max_actions: int,
                micro_batches: int = 1):
  """Jitted behaviour-cloning step on action tokens (warm start from scripted demonstrations).

  Returns `sft(params, opt_state, traj) -> (params, opt_state, metrics)`; the loss is the
  token-mean negative log-likelihood of the demonstrated action tokens under the same
  restricted policy the sampler uses. With `micro_batches > 1` the gradient is accumulated
  over that many equal slices of rows, each weighed by its share of the batch's action tokens,
  so the step is the whole batch's step while only one slice's activations are alive.
  """

  def nll(params, traj, positions, view, share):
    logp, _ = distribution.action_log_probs(policy_graphdef, params, traj.tokens, positions, view,
                                            allowed, temperature)
    return _scaled(-policy_loss.aggregate(logp, view.valid, "token-mean"), share), {}

  def sft(params, opt_state, traj):
    chex.assert_rank(traj.tokens, 2)
    b = traj.tokens.shape[0]
    if b % micro_batches:
      raise ValueError(f"behaviour cloning: a batch of {b} demonstrations is not divisible into "
                       f"WarmStartConfig.micro_batches={micro_batches}")
    positions = distribution.trajectory_positions(traj)
    view = distribution.action_view(traj.action_mask, max_actions)
    if micro_batches == 1:
      (value, _), grads = jax.value_and_grad(nll, has_aux=True)(params, traj, positions, view, None)
    else:
      rows = b // micro_batches

      def micro_args(j):
        sub = lambda x: jax.lax.dynamic_slice_in_dim(x, j * rows, rows, axis=0)
        sub_view = jax.tree.map(sub, view)
        return (jax.tree.map(sub, traj), jax.tree.map(sub, positions), sub_view,
                micro_batch_share(sub_view.valid, view.valid, "token-mean"))

      (value, _), grads, _ = _summed_value_and_grad(nll, params, micro_args, micro_batches)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"sft/nll": value}

  return jax.jit(sft, donate_argnums=(0, 1))
