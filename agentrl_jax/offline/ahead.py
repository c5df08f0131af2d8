"""AHEAD: GRPO plus step-aware self-distillation from a privileged teacher (docs/methods.md#ahead).

The teacher is the same model (a snapshot, re-synced every `sync_every` updates) reading a
privileged version of each step's context: the student's observation plus "feedback:" — the
observation the action led to — on every step, and "hint:" — a corrective sentence — on error
steps only. Its log-probs of the tokens the student actually sampled give
`δ = logp_T − sg(logp)`; the advantage of every action token becomes `A + λ·ν·clip(δ)` with
ν larger on error steps (`losses.sft.distillation_advantages`).

Pieces (the teacher itself is shared with SERL, in `rollout/strategies/teacher.py`):
  * `teacher_lib.RecordingEnv` records each step's feedback, error flag and (error steps only) hint.
  * `teacher_lib.teacher_inputs` rebuilds each conversation with the privileged text before each
    turn's action; the action tokens themselves are the sampled ones, in the same order.
  * `distillation_correction` is an ordinary credit correction `(traj, advantages) -> advantages`
    reading the teacher's log-probs from `traj.extras`, so the online update step runs unchanged.

Hints come from a hint function (`teacher_lib.HintFn`; default `teacher_lib.HINTS[env_name]`); any
callable (an LLM client, say) can be passed as `train(hint_fn=...)`.

Entry point for `experiments/run.py`: `learner.run.entry = @ahead.train`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import rollouts as rollouts_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.losses import sft
from agentrl_jax.models import transformer
from agentrl_jax.offline import common
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout.strategies import teacher as teacher_lib

TEACHER_LOGPROB = "ahead/teacher_logprob"
ERROR_STEP = "ahead/error_step"


def make_teacher_fn(setup: common.Setup):
  """`teacher_lib.teacher_logprob_fn` for a resolved run."""
  return teacher_lib.teacher_logprob_fn(setup.graphdef, setup.allowed, setup.temperature, setup.max_actions)


def distillation_correction(traj: types.Trajectories, advantages: jax.Array, *, coef: float = 0.1,
                            delta_max: float = 1.0, nu_err: float = 1.0, nu_rout: float = 0.5,
                            mode: str = "additive") -> jax.Array:
  """Credit correction: AHEAD's distillation term from `traj.extras` (see module docstring).

  The student's log-prob of each sampled token is the sampler's (`sample_logprob`): the update
  runs on-policy from the parameters that sampled, and TITO keeps the tokens identical.
  """
  if TEACHER_LOGPROB not in traj.extras or ERROR_STEP not in traj.extras:
    raise ValueError(f"distillation_correction needs traj.extras[{TEACHER_LOGPROB!r}] and "
                     f"[{ERROR_STEP!r}] (ahead.train fills them)")
  mask = jnp.asarray(traj.action_mask) & jnp.asarray(traj.valid_trajectory)[:, None]
  return sft.distillation_advantages(
      advantages, traj.extras[TEACHER_LOGPROB], traj.sample_logprob, mask,
      traj.extras[ERROR_STEP], coef=coef, delta_max=delta_max, nu_err=nu_err, nu_rout=nu_rout,
      mode=mode)


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AheadConfig:
  """AHEAD's hyperparameters (AHEAD defaults).

  Attributes:
    coef, delta_max, nu_err, nu_rout, mode: see `losses.sft.distillation_advantages`.
    sync_every: updates between teacher re-syncs to the student (N_sync).
    feedback_max_chars: the feedback text is cut to this many characters.
  """

  coef: float = 0.1
  delta_max: float = 1.0
  nu_err: float = 1.0
  nu_rout: float = 0.5
  mode: str = "additive"
  sync_every: int = 10
  feedback_max_chars: int = 200

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.mode not in ("additive", "sign_preserving"):
      raise ValueError(f"AheadConfig.mode must be 'additive' or 'sign_preserving', got {self.mode!r}")
    if self.coef < 0 or self.delta_max <= 0 or self.nu_err < 0 or self.nu_rout < 0:
      raise ValueError(f"AheadConfig: coef, nu_err, nu_rout >= 0 and delta_max > 0, got "
                       f"{self.coef}, {self.nu_err}, {self.nu_rout}, {self.delta_max}")
    if self.sync_every < 1 or self.feedback_max_chars < 1:
      raise ValueError(f"AheadConfig: sync_every and feedback_max_chars must be >= 1, got "
                       f"{self.sync_every}, {self.feedback_max_chars}")


def train(workdir: str, *, config: configs.TrainConfig = configs.TrainConfig(),
          model: transformer.TransformerConfig | None = None,
          rollout: loop_lib.RolloutConfig = loop_lib.RolloutConfig(),
          loss: step_lib.LossConfig = step_lib.LossConfig(),
          optim: configs.OptimConfig = configs.OptimConfig(),
          ahead: AheadConfig = AheadConfig(),
          warm_start: configs.WarmStartConfig = configs.WarmStartConfig(),
          evaluation: configs.EvalConfig = configs.EvalConfig(),
          hint_fn: teacher_lib.HintFn | None = None,
          corrections: Sequence[pipeline.Correction] = (),
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None) -> driver.Outcome:
  """Online GRPO (`config.estimator`) with AHEAD's distillation correction applied first.

  Args:
    hint_fn: error-step hints; default `teacher_lib.HINTS[env_name]`, else `teacher_lib.expert_hint`.
    corrections: further corrections applied after AHEAD's.
    Others: as `learner.train`.
  """
  if loss.ppo_epochs != 1 or loss.num_minibatches != 1:
    # The student log-prob in δ is the sampler's; later epochs would need a recomputed one.
    raise config_errors.ConfigError(
        "ahead.train runs one on-policy step per batch: set LossConfig.ppo_epochs = "
        f"num_minibatches = 1, got {loss.ppo_epochs}, {loss.num_minibatches}")
  hint_fn = hint_fn or teacher_lib.HINTS.get(config.env_name, teacher_lib.expert_hint)
  setup, params = common.resolve(config, model, rollout, tokenizer_path, loss)
  correction = functools.partial(distillation_correction, coef=ahead.coef,
                                 delta_max=ahead.delta_max, nu_err=ahead.nu_err,
                                 nu_rout=ahead.nu_rout, mode=ahead.mode)
  credit = assembly.credit_pipeline(config, corrections=(correction, *corrections))
  policy_opt = assembly.make_optimizer(optim, config.num_iterations)
  update = step_lib.make_update_fn(
      policy_graphdef=setup.graphdef, critic_graphdef=None, policy_optimizer=policy_opt,
      critic_optimizer=None, advantage_fn=credit, loss=loss, allowed=setup.allowed,
      temperature=setup.temperature, max_actions=setup.max_actions)
  state = common.policy_state(params, policy_opt, config.seed + 2,
                              ref_params=jax.tree.map(jnp.copy, params) if loss.kl_coef > 0 else None)
  method = AheadMethod(setup=setup, config=config, ahead=ahead, update=update,
                       teacher_fn=make_teacher_fn(setup), hint_fn=hint_fn,
                       base_key=jax.random.key(config.seed))
  return common.drive(workdir, method, state, setup=setup, config=config, warm=warm_start,
                      evaluation=evaluation, hooks=hooks)


class AheadMethod(common.PolicyMethod):
  """One AHEAD iteration: play with recording envs, score the teacher, update with distillation."""

  name = "ahead"

  def __init__(self, *, setup, config, ahead, update, teacher_fn, hint_fn, base_key):
    self._setup, self._config, self._ahead = setup, config, ahead
    self._update, self._teacher_fn, self._base_key = update, teacher_fn, base_key
    self._make_env = lambda: teacher_lib.RecordingEnv(setup.make_env(), hint_fn)
    self._teacher = None

  def restored(self, state) -> None:
    # The teacher snapshot is not saved: a resumed run re-syncs it to the restored policy.
    self._teacher = jax.tree.map(jnp.copy, state.policy_params)

  def iteration(self, state, iteration: int) -> driver.IterationResult:
    setup, ahead = self._setup, self._ahead
    if self._teacher is None or iteration % ahead.sync_every == 0:
      self._teacher = jax.tree.map(jnp.copy, state.policy_params)
    seeds, groups = rollouts_lib.task_batch(self._config, iteration)
    traj, envs, stats = common.collect(setup, state.policy_params, seeds, groups,
                                       jax.random.fold_in(self._base_key, 1000 + iteration),
                                       self._make_env)
    inputs = teacher_lib.teacher_inputs(traj, [env.records for env in envs],
                                        setup.tokenizer.encode, setup.tokenizer.act_id,
                                        ahead.feedback_max_chars)
    device = common.to_device(traj)
    t_logp = self._teacher_fn(self._teacher, device.action_mask, device.sample_logprob,
                              inputs.tokens, inputs.turn_of_token, inputs.action_mask)
    error_tok = types.broadcast_turns_to_tokens(jnp.asarray(inputs.error_turn, jnp.float32),
                                                device.turn_of_token, device.action_mask) > 0
    device = device.replace(extras={TEACHER_LOGPROB: t_logp, ERROR_STEP: error_tok})
    state, m = self._update(state, device)
    metrics = {"train/success": float(np.mean(traj.success)),
               "train/outcome": float(np.mean(traj.outcome)),
               "ahead/error_step_rate": float(inputs.error_turn.sum()
                                              / max(traj.turn_mask.sum(), 1)),
               **stats.as_metrics(), **{k: float(v) for k, v in jax.device_get(m).items()}}
    return driver.IterationResult(state, metrics, traj)
