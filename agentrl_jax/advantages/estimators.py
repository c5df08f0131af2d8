"""Pipeline-facing advantage estimators and their registry.

Every estimator has the signature `fn(traj, values, **hyperparams) -> AdvantageOutput` with
`advantages`/`returns` `[B, L]` float32, zero outside `traj.action_mask`, and zero on trajectories
with an env fault (`traj.valid_trajectory` False); faulted trajectories also stay out of every
group statistic. `values` is the critic's `[B, L]` output, or None for critic-free estimators.
Hyperparameters are plain keyword arguments. A run names its estimator as a function, with the
hyperparameters bound on it (`configs.TrainConfig.estimator = @estimators.gigpo` and
`estimators.gigpo.step_weight = 0.5` in gin, or `functools.partial` in Python), or by its registry
name for the defaults; `resolve` turns either into an `Estimator`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import trajectory as trajectory_lib
from agentrl_jax import types
from agentrl_jax.advantages import gae as gae_lib
from agentrl_jax.advantages import group
from agentrl_jax.advantages import similarity
from agentrl_jax.advantages import step
from agentrl_jax.advantages import turn
from agentrl_jax.advantages import whiten as whiten_lib

Array = jax.Array


class AdvantageOutput(NamedTuple):
  """Token advantages and value targets, each `[B, L]` float32, zero outside `action_mask`."""

  advantages: Array
  returns: Array


@dataclasses.dataclass(frozen=True, kw_only=True)  # no slots: jax.jit needs a weakref
class Estimator:
  """A registered estimator: the function and whether it consumes critic values."""

  name: str
  fn: Callable[..., AdvantageOutput]
  needs_critic: bool
  description: str = ""

  def __call__(self, traj: types.Trajectories, values: Array | None = None,
               **hyperparams: Any) -> AdvantageOutput:
    if self.needs_critic and values is None:
      raise ValueError(f"estimator {self.name!r} needs critic values, got values=None")
    return self.fn(traj, values, **hyperparams)


def _valid_tokens(traj: types.Trajectories) -> Array:
  """[B, L] bool: action tokens of trajectories without env faults."""
  return jnp.asarray(traj.action_mask).astype(bool) & jnp.asarray(traj.valid_trajectory)[:, None]


def _trajectory_output(traj: types.Trajectories, advantages: Array) -> AdvantageOutput:
  """Broadcasts `[B]` advantages to the valid action tokens; returns = advantages (verl GRPO)."""
  token_advantages = types.broadcast_trajectories_to_tokens(
      advantages.astype(jnp.float32), _valid_tokens(traj))
  return AdvantageOutput(advantages=token_advantages, returns=token_advantages)


def _turn_output(traj: types.Trajectories, turn_advantages: Array) -> AdvantageOutput:
  """Broadcasts `[B, N]` turn advantages over `turn_of_token`; returns = advantages."""
  token_advantages = types.broadcast_turns_to_tokens(
      turn_advantages.astype(jnp.float32), jnp.asarray(traj.turn_of_token), _valid_tokens(traj))
  return AdvantageOutput(advantages=token_advantages, returns=token_advantages)


def grpo(traj: types.Trajectories, values: Array | None = None, *,
         normalize_by_std: bool = True, eps: float = 1e-6, stats_over: str = "trajectories",
         num_groups: int | None = None) -> AdvantageOutput:
  """GRPO: `traj.outcome` normalised within its `group_id`, on every action token.

  `values` is ignored. `num_groups` (static) defaults to B. `stats_over="trajectories"` counts
  each trajectory once in its group's mean and std; `"step_rows"` counts it once per existing turn,
  as verl-agent's step-row layout does (longer episodes weigh more). See
  `group.group_relative_advantages`.
  """
  del values  # critic-free
  if stats_over not in ("trajectories", "step_rows"):
    raise ValueError(f"stats_over must be 'trajectories' or 'step_rows', got {stats_over!r}")
  # Host (NumPy) inputs pass through unconverted so that group.check_* can name bad values.
  weights = traj.valid_trajectory
  if stats_over == "step_rows":
    weights = weights * traj.turn_mask.sum(axis=1).astype(np.float32)
  advantages = group.group_relative_advantages(
      traj.outcome, traj.group_id, num_groups, normalize_by_std=normalize_by_std, eps=eps,
      weights=weights)
  return _trajectory_output(traj, advantages)


def dr_grpo(traj: types.Trajectories, values: Array | None = None, *,
            num_groups: int | None = None) -> AdvantageOutput:
  """Dr.GRPO (docs/methods.md#dr-grpo): GRPO without the std division, `A_b = s_b − mean_g`.

  Pair it with the `seq-mean-token-sum-norm` aggregation in the loss.
  """
  return grpo(traj, values, normalize_by_std=False, num_groups=num_groups)


def rloo(traj: types.Trajectories, values: Array | None = None, *,
         num_groups: int | None = None) -> AdvantageOutput:
  """RLOO (docs/methods.md#rloo): `traj.outcome` minus the leave-one-out mean of its group."""
  del values  # critic-free
  advantages = group.leave_one_out_advantages(
      traj.outcome, traj.group_id, num_groups, weights=traj.valid_trajectory)
  return _trajectory_output(traj, advantages)


def gae(traj: types.Trajectories, values: Array | None, *,
        discount: float = 1.0, lambda_: float = 1.0, whiten: bool = True) -> AdvantageOutput:
  """Token-level GAE over the interleaved sequence (docs/methods.md#ppo-gae, StarPO's PPO variant).

  Turn rewards `traj.reward` are placed on the last action token of each turn
  (`gae.token_rewards`); observation tokens are transparent. Defaults γ = λ = 1 and whitening
  on, as in verl.

  Args:
    traj: the batch.
    values: `[B, L]` critic values `V_t` at every token (only action tokens are read).
    discount: γ.
    lambda_: λ.
    whiten: whiten the advantages over the batch's valid action tokens (masked mean 0,
      unbiased variance 1, eps 1e-8; `whiten.masked_whiten`). The returns `A + V` are formed
      before and stay unwhitened: they are the critic's targets.
  """
  if values is None:
    raise ValueError("estimator 'gae' needs critic values, got values=None")
  mask = jnp.asarray(traj.action_mask).astype(bool)
  # Each turn's reward sits on its last sampled token (not on a token the sampler forced).
  rewards = gae_lib.token_rewards(
      jnp.asarray(traj.reward), gae_lib.last_action_ends(jnp.asarray(traj.turn_end), mask),
      jnp.asarray(traj.turn_mask), traj.max_len)
  out = gae_lib.generalized_advantage_estimation(
      rewards, jnp.asarray(values, jnp.float32), mask, discount, lambda_)
  valid = _valid_tokens(traj)
  advantages = out.advantages
  if whiten:
    advantages = whiten_lib.masked_whiten(advantages, valid)
  return AdvantageOutput(
      advantages=jnp.where(valid, advantages, 0.0).astype(jnp.float32),
      returns=jnp.where(valid, out.returns, 0.0).astype(jnp.float32))


def turn_gae(traj: types.Trajectories, values: Array | None, *,
             discount: float = 1.0, lambda_: float = 1.0, whiten: bool = True) -> AdvantageOutput:
  """Turn-level GAE with a learned critic (docs/methods.md#turn-gae): one advantage per turn.

  The state value of turn k, `V_k`, is the mean of the critic's values over the turn's action
  tokens — the tokens it is trained on, all toward the same target, the turn's return. Over the
  turns: `δ_k = r_k + γ·V_{k+1} − V_k` (`V` = 0 after the last turn), `A_k = δ_k + γλ·A_{k+1}`,
  (`gae.turn_generalized_advantage_estimation`); the critic's targets are `A_k + V_k` on the turn's tokens.
  Unlike token-level `gae`, the bootstrap skips a whole reply at once, so a λ < 1 trades variance
  per decision, not per token.

  Args:
    traj: the batch.
    values: `[B, L]` critic values at every token (action tokens are read).
    discount: γ per turn.
    lambda_: λ per turn.
    whiten: whiten the advantages over the batch's valid action tokens, as `gae` does.
  """
  if values is None:
    raise ValueError("estimator 'turn_gae' needs critic values, got values=None")
  turn_mask = jnp.asarray(traj.turn_mask).astype(bool)
  turn_values = trajectory_lib.turn_mean(jnp.asarray(values, jnp.float32), traj)
  out = gae_lib.turn_generalized_advantage_estimation(
      jnp.asarray(traj.reward, jnp.float32), turn_values, turn_mask, discount, lambda_)
  valid = _valid_tokens(traj)
  to_tokens = lambda x: types.broadcast_turns_to_tokens(
      jnp.where(turn_mask, x, 0.0).astype(jnp.float32), jnp.asarray(traj.turn_of_token), valid)
  advantages = to_tokens(out.advantages)
  if whiten:
    advantages = whiten_lib.masked_whiten(advantages, valid)
  return AdvantageOutput(advantages=jnp.where(valid, advantages, 0.0).astype(jnp.float32),
                         returns=to_tokens(out.returns))


def gigpo(traj: types.Trajectories, values: Array | None = None, *,
          discount: float = 0.95, step_weight: float = 1.0, mode: str = "mean_norm",
          eps: float = 1e-6, episode_stats_over: str = "step_rows",
          num_groups: int | None = None, anchor_key: str | None = None,
          invalid_action_penalty: float = 0.1) -> AdvantageOutput:
  """GiGPO: episode advantage of `traj.outcome` plus anchor-state step advantages.

  Step rewards are `traj.reward`; anchors come from `traj.obs_hash` shifted by one turn, with
  `traj.extras["initial_obs_hash"]` (or a shared constant) for the first turn (see `step`), or
  from `traj.extras[anchor_key]` when given (e.g. SLEA's 'anchor_state_key' clusters).
  `invalid_action_penalty · 1[not traj.action_valid]` is charged to each turn's step row, in its
  episode score and in the return its step group normalises (`step.gigpo_advantages`'
  `step_penalty`); 0 turns it off. Hyperparameters as in `step.gigpo_advantages`; defaults follow
  verl-agent (penalty 0.1).
  """
  del values  # critic-free
  invalid = jnp.asarray(traj.turn_mask).astype(bool) & ~jnp.asarray(traj.action_valid).astype(bool)
  out = step.gigpo_advantages(
      jnp.asarray(traj.outcome), jnp.asarray(traj.reward),
      step.trajectory_anchor_hashes(traj, anchor_key),
      jnp.asarray(traj.turn_mask), jnp.asarray(traj.group_id), num_groups, discount=discount,
      step_weight=step_weight, mode=mode, eps=eps, episode_stats_over=episode_stats_over,
      weights=jnp.asarray(traj.valid_trajectory),
      step_penalty=invalid_action_penalty * invalid.astype(jnp.float32))
  return _turn_output(traj, out.advantages)


def gagpo(traj: types.Trajectories, values: Array | None = None, *,
          discount: float = 0.95, lambda_: float = 0.95, eps: float = 1e-6,
          singleton: str = "time_baseline", anchor_key: str | None = None) -> AdvantageOutput:
  """GAGPO (docs/methods.md#gagpo): turn-level GAE on the grouped value proxy, normalised per group.

  Pair it with the action-level ratio `losses.policy.turn_mean_log_ratio` in the loss.
  """
  del values  # critic-free
  out = step.gagpo_advantages(
      jnp.asarray(traj.reward), step.trajectory_anchor_hashes(traj, anchor_key),
      jnp.asarray(traj.turn_mask),
      jnp.asarray(traj.group_id), discount=discount, lambda_=lambda_, eps=eps,
      singleton=singleton, weights=jnp.asarray(traj.valid_trajectory))
  return _turn_output(traj, out.advantages)


def _turn_rewards(traj: types.Trajectories, turn_reward_key: str | None) -> Array:
  if turn_reward_key is None:
    return jnp.asarray(traj.reward)
  if turn_reward_key not in traj.extras:
    raise ValueError(f"turn_reward_key {turn_reward_key!r} not in traj.extras "
                     f"(has: {', '.join(sorted(traj.extras)) or 'nothing'})")
  return jnp.asarray(traj.extras[turn_reward_key])


def mt_grpo(traj: types.Trajectories, values: Array | None = None, *,
            turn_coef: float = 1.0, eps: float = 1e-4, turn_reward_key: str | None = None,
            num_groups: int | None = None) -> AdvantageOutput:
  """MT-GRPO (docs/methods.md#mt-grpo, K-turn form): `Â^O(traj.outcome) + λ·Â^{T,k}` per turn.

  Turn rewards are `traj.reward`, or `traj.extras[turn_reward_key]` (`[B, N]`) when the turn-level
  reward functions are kept apart from the env reward.
  """
  del values  # critic-free
  out = turn.mt_grpo_advantages(
      jnp.asarray(traj.outcome), _turn_rewards(traj, turn_reward_key),
      jnp.asarray(traj.turn_mask), jnp.asarray(traj.group_id), num_groups, turn_coef=turn_coef,
      eps=eps, weights=jnp.asarray(traj.valid_trajectory))
  return _turn_output(traj, out.advantages)


def gtpo(traj: types.Trajectories, values: Array | None = None, *,
         discount: float = 0.9, eps: float = 1e-6,
         num_groups: int | None = None) -> AdvantageOutput:
  """GTPO: discounted returns of `traj.reward`, normalised per (group, turn index)."""
  del values  # critic-free
  out = turn.gtpo_advantages(
      jnp.asarray(traj.reward), jnp.asarray(traj.turn_mask), jnp.asarray(traj.group_id),
      num_groups, discount=discount, eps=eps, weights=jnp.asarray(traj.valid_trajectory))
  return _turn_output(traj, out.advantages)


def gtpo_hybrid(traj: types.Trajectories, values: Array | None = None, *,
                discount: float = 0.9, outcome_coef: float = 0.5, alignment_guard: bool = True,
                eps: float = 1e-6, num_groups: int | None = None,
                turn_reward_key: str | None = None) -> AdvantageOutput:
  """GTPO returns plus a dampened GRPO outcome advantage with a sign guard.

  Turn rewards are `traj.reward`, or `traj.extras[turn_reward_key]` (`[B, N]`), e.g. the
  calibrated reward of `rewards.calibration.IterativeRewardCalibration` ('irc_turn_reward'),
  which keeps the outcome out of the turn returns.
  """
  del values  # critic-free
  out = turn.gtpo_hybrid_advantages(
      _turn_rewards(traj, turn_reward_key), jnp.asarray(traj.outcome), jnp.asarray(traj.turn_mask),
      jnp.asarray(traj.group_id), num_groups, discount=discount, outcome_coef=outcome_coef,
      alignment_guard=alignment_guard, eps=eps, weights=jnp.asarray(traj.valid_trajectory))
  return _turn_output(traj, out.advantages)


def spo(traj: types.Trajectories, values: Array | None = None, *,
        temperature: float = 0.1, normalize_by_std: bool = True, eps: float = 1e-6,
        embedding_key: str = "prefix_embedding") -> AdvantageOutput:
  """SPO: `traj.outcome` against a similarity-weighted baseline of the group, per turn.

  Needs `traj.extras[embedding_key]`, a `[B, N, d]` float prefix representation per turn.
  """
  del values  # critic-free
  if embedding_key not in traj.extras:
    raise ValueError(f"estimator 'spo' needs traj.extras[{embedding_key!r}] ([B, N, d] prefix "
                     f"embeddings); has: {', '.join(sorted(traj.extras)) or 'nothing'}")
  out = similarity.similarity_advantages(
      jnp.asarray(traj.outcome), jnp.asarray(traj.extras[embedding_key]),
      jnp.asarray(traj.turn_mask), traj.group_id, temperature=temperature,
      normalize_by_std=normalize_by_std, eps=eps, weights=jnp.asarray(traj.valid_trajectory))
  return _turn_output(traj, out.advantages)


ESTIMATORS: dict[str, Estimator] = {
    "grpo": Estimator(name="grpo", fn=grpo, needs_critic=False,
                      description="group-normalised outcome (GRPO, docs/methods.md#grpo)"),
    "dr_grpo": Estimator(name="dr_grpo", fn=dr_grpo, needs_critic=False,
                         description="group-centred outcome, no std (Dr.GRPO)"),
    "rloo": Estimator(name="rloo", fn=rloo, needs_critic=False,
                      description="leave-one-out baseline (RLOO, docs/methods.md#rloo)"),
    "gae": Estimator(name="gae", fn=gae, needs_critic=True,
                     description="token-level GAE with observation skipping (PPO)"),
    "turn_gae": Estimator(name="turn_gae", fn=turn_gae, needs_critic=True,
                          description="turn-level GAE on the critic's per-turn values (PPO)"),
    "gigpo": Estimator(name="gigpo", fn=gigpo, needs_critic=False,
                       description="episode + anchor-state step groups (GiGPO)"),
    "gagpo": Estimator(name="gagpo", fn=gagpo, needs_critic=False,
                       description="GAE on a grouped state-value proxy (GAGPO)"),
    "mt_grpo": Estimator(name="mt_grpo", fn=mt_grpo, needs_critic=False,
                         description="outcome + per-turn group advantages (MT-GRPO)"),
    "gtpo": Estimator(name="gtpo", fn=gtpo, needs_critic=False,
                      description="turn returns normalised per turn index (GTPO)"),
    "gtpo_hybrid": Estimator(name="gtpo_hybrid", fn=gtpo_hybrid, needs_critic=False,
                             description="GTPO + dampened outcome with sign guard"),
    "spo": Estimator(name="spo", fn=spo, needs_critic=False,
                     description="similarity-weighted leave-one-out baseline per turn (SPO)"),
}


def get_estimator(name: str) -> Estimator:
  """Looks up an estimator by name; raises a ValueError listing the known names."""
  try:
    return ESTIMATORS[name]
  except KeyError:
    raise ValueError(
        f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))}") from None


def _base_function(fn: Callable[..., Any]) -> Callable[..., Any]:
  """The estimator function under `functools.partial` layers and decorator wrappers (gin's)."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return inspect.unwrap(fn)


def resolve(estimator: str | Callable[..., AdvantageOutput]) -> Estimator:
  """The `Estimator` for a registry name or an estimator function (bound or wrapped).

  A registered function keeps its registry entry's name and critic flag, with `fn` the caller's
  bound version; another function is an estimator of the caller's own, critic-free unless it
  carries `needs_critic = True`.
  """
  if isinstance(estimator, str):
    return get_estimator(estimator)
  if not callable(estimator):
    raise ValueError(f"an estimator is a function or a registry name, got {estimator!r}; "
                     f"known: {', '.join(sorted(ESTIMATORS))}")
  base = _base_function(estimator)
  for spec in ESTIMATORS.values():
    if spec.fn is base:
      return dataclasses.replace(spec, fn=estimator)
  return Estimator(name=getattr(base, "__name__", type(base).__name__), fn=estimator,
                   needs_critic=bool(getattr(base, "needs_critic", False)))
