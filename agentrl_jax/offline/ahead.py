"""AHEAD: GRPO plus step-aware self-distillation from a privileged teacher (ALGORITHMS.md B.8).

The teacher is the same model (a snapshot, re-synced every `sync_every` updates) reading a
privileged version of each step's context: the student's observation plus "feedback:" — the
observation the action led to — on every step, and "hint:" — a corrective sentence — on error
steps only. Its log-probs of the tokens the student actually sampled give
`δ = logp_T − sg(logp)`; the advantage of every action token becomes `A + λ·ν·clip(δ)` with
ν larger on error steps (`losses.sft.distillation_advantages`).

Pieces:
  * `RecordingEnv` wraps any `TextEnv` and records, per step, the next observation, whether the
    step was an error and the hint for it (the hint function is only called on error steps).
  * `teacher_inputs` rebuilds each conversation with the privileged text inserted before each
    turn's action; the action tokens themselves are the sampled ones, in the same order.
  * `distillation_correction` is an ordinary credit correction `(traj, advantages) -> advantages`
    reading the teacher's log-probs from `traj.extras`, so the online update step runs unchanged.

Hints come from a hint function `(HintContext) -> str`: `HINTS` holds a rule-based one per env;
any callable (an LLM client, say) can be passed as `train(hint_fn=...)`.

Entry point for `experiments/run.py`: `learner.run.entry = @ahead.train`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import base as envs_base
from agentrl_jax.learner import checkpoint as checkpoint_lib
from agentrl_jax.learner import configs
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import step as step_lib
from agentrl_jax.losses import sft
from agentrl_jax.models import transformer
from agentrl_jax.offline import common
from agentrl_jax.rollout import loop as loop_lib

TEACHER_LOGPROB = "ahead/teacher_logprob"
ERROR_STEP = "ahead/error_step"


class HintContext(NamedTuple):
  """What a hint function sees about one error step."""

  env_name: str
  observation: str
  action: str
  feedback: str
  action_valid: bool
  expert_action: str | None


HintFn = Callable[[HintContext], str]


def expert_hint(ctx: HintContext) -> str:
  """Generic rule: name the env's scripted expert action (or the valid-action list)."""
  if ctx.expert_action is None:
    return "try another action"
  return f"try {ctx.expert_action}"


def frozenlake_hint(ctx: HintContext) -> str:
  """FrozenLake: an invalid word gets the action list, a bad move the shortest-path move."""
  if not ctx.action_valid:
    return "use left, down, right or up"
  return f"avoid H, move {ctx.expert_action}" if ctx.expert_action else "avoid H"


HINTS: dict[str, HintFn] = {"frozenlake": frozenlake_hint}


@dataclasses.dataclass
class StepRecord:
  """One recorded step: the action, the observation it led to, whether it was an error, the hint."""

  action: str
  feedback: str
  error: bool
  hint: str


class RecordingEnv(envs_base.TextEnv):
  """Wraps an env and records each step's feedback, error flag and (error steps only) hint.

  An error step (B.8's default detector) is an invalid action, an action after which the state
  did not change (the observation below its feedback line), or one that ended the episode in
  failure before the step cap.
  """

  def __init__(self, inner: envs_base.TextEnv, hint_fn: HintFn):
    super().__init__(inner.max_turns)
    self.inner = inner
    self.hint_fn = hint_fn
    self.action_words = inner.action_words
    self.name = inner.name
    self.records: list[StepRecord] = []
    self._observation = ""

  def expert_action(self) -> str:
    return self.inner.expert_action()

  def _reset(self, seed: int) -> str:
    self.records = []
    self._observation = self.inner.reset(seed)
    return self._observation

  def _step(self, action: Any) -> envs_base.StepResult:
    try:
      expert = self.inner.expert_action()
    except Exception:  # pylint: disable=broad-except
      expert = None  # an env without an expert in this state still gets generic hints
    result = self.inner.step(action)
    valid = bool(result.info.get("action_valid", True))
    unchanged = _state_text(result.observation) == _state_text(self._observation)
    failed_early = (result.done and not result.info.get("success", False)
                    and self.inner.turn < self.inner.max_turns)
    error = (not valid) or unchanged or failed_early
    hint = ""
    if error:
      hint = self.hint_fn(HintContext(env_name=self.name, observation=self._observation,
                                      action=str(action), feedback=result.observation,
                                      action_valid=valid, expert_action=expert))
    self.records.append(StepRecord(action=str(action), feedback=result.observation, error=error,
                                   hint=hint))
    self._observation = result.observation
    return result

  def _on_step_cap(self, result: envs_base.StepResult) -> envs_base.StepResult:
    return result  # the inner env applies its own cap


def _state_text(observation: str) -> str:
  """The state part of an observation: text envs put a feedback line first ("hit wall", "moved
  right") above the state, so a step that changed nothing differs from the last one only there."""
  lines = observation.strip().splitlines()
  return envs_base.normalize_observation("\n".join(lines[1:] if len(lines) > 1 else lines))


def privileged_text(record: StepRecord, feedback_max_chars: int) -> str:
  """The text the teacher reads after the student's observation: feedback, then a hint on errors."""
  text = "\nfeedback: " + " ".join(record.feedback.split())[:feedback_max_chars]
  if record.error and record.hint:
    text += "\nhint: " + record.hint
  return text


class TeacherInputs(NamedTuple):
  """Teacher conversations [B, L_T] and the error flag of each student turn [B, N]."""

  tokens: np.ndarray
  turn_of_token: np.ndarray
  action_mask: np.ndarray
  error_turn: np.ndarray


def teacher_inputs(traj: types.Trajectories, records: Sequence[Sequence[StepRecord]],
                   encode: Callable[[str], list[int]], act_id: int, feedback_max_chars: int,
                   pad_to: int = 64) -> TeacherInputs:
  """Rebuilds every conversation with the privileged text before each turn's `<|act|>` marker.

  The student's observation chunk of turn k is `[<|obs|> text <|act|>]`; the teacher's is
  `[<|obs|> text, privileged tokens, <|act|>]`, then the same sampled action tokens. Rows keep the
  order of their action tokens, so the k-th action token of a row is the same token for both.
  """
  tokens = np.asarray(traj.tokens)
  starts, ends, turn_mask = (np.asarray(traj.turn_start), np.asarray(traj.turn_end),
                             np.asarray(traj.turn_mask))
  b, n = turn_mask.shape
  rows, error = [], np.zeros((b, n), bool)
  for i in range(b):
    out_tok, out_turn, out_act = [], [], []
    cursor = 0
    for k in range(n):
      if not turn_mask[i, k] or k >= len(records[i]):
        break
      chunk = list(tokens[i, cursor:starts[i, k]])
      if not chunk or chunk[-1] != act_id:
        raise ValueError(f"teacher_inputs: row {i} turn {k} has no <|act|> before its action")
      extra = encode(privileged_text(records[i][k], feedback_max_chars))
      error[i, k] = records[i][k].error
      obs = chunk[:-1] + extra + [act_id]
      act = list(tokens[i, starts[i, k]:ends[i, k]])
      out_tok += obs + act
      out_turn += [k] * (len(obs) + len(act))
      out_act += [False] * len(obs) + [True] * len(act)
      cursor = ends[i, k]
    rows.append((out_tok, out_turn, out_act))
  width = max(1, max(len(r[0]) for r in rows))
  width = -(-width // pad_to) * pad_to  # few distinct shapes, few compiles
  t_tok = np.zeros((b, width), np.int32)
  t_turn = np.full((b, width), -1, np.int32)
  t_act = np.zeros((b, width), bool)
  for i, (tok, trn, act) in enumerate(rows):
    t_tok[i, :len(tok)], t_turn[i, :len(trn)], t_act[i, :len(act)] = tok, trn, act
  return TeacherInputs(tokens=t_tok, turn_of_token=t_turn, action_mask=t_act, error_turn=error)


def make_teacher_fn(setup: common.Setup):
  """`teacher_logprob_fn` for a resolved run."""
  return teacher_logprob_fn(setup.graphdef, setup.allowed, setup.temperature, setup.max_actions)


def teacher_logprob_fn(graphdef, allowed, temperature: float, max_actions: int):
  """Jitted `(teacher_params, student mask and log-probs [B, L], teacher inputs) -> [B, L]`.

  The teacher's log-prob of the k-th action token of a row is written at the position of the
  student's k-th action token. A student token the teacher has no counterpart for (its env
  faulted before recording the step) keeps the student's own log-prob, so its δ is 0.
  """

  def teacher_logprob(params, student_action_mask, student_logprob, t_tokens, t_turns,
                      t_action_mask):
    t_view = step_lib.action_view(t_action_mask, max_actions)
    logp, _ = step_lib.action_log_probs(graphdef, params, t_tokens,
                                        transformer.positions_from_turns(t_turns), t_view,
                                        allowed, temperature)
    s_view = step_lib.action_view(student_action_mask, max_actions)
    rows = jnp.arange(student_logprob.shape[0])[:, None]
    both = s_view.valid & t_view.valid
    return student_logprob.at[rows, s_view.index].set(
        jnp.where(both, logp, s_view.gather(student_logprob)))

  return jax.jit(teacher_logprob)


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


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AheadConfig:
  """AHEAD's hyperparameters (B.8 defaults).

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
          hint_fn: HintFn | None = None,
          corrections: Sequence[pipeline.Correction] = (),
          tokenizer_path: str | None = None) -> common.Summary:
  """Online GRPO (`config.estimator`) with AHEAD's distillation correction applied first.

  Args:
    hint_fn: error-step hints; default `HINTS[env_name]`, else `expert_hint`.
    corrections: further corrections applied after AHEAD's.
    Others: as `learner.train`.
  """
  if loss.ppo_epochs != 1 or loss.num_minibatches != 1:
    # The student log-prob in δ is the sampler's; later epochs would need a recomputed one.
    raise config_errors.ConfigError(
        "ahead.train runs one on-policy step per batch: set LossConfig.ppo_epochs = "
        f"num_minibatches = 1, got {loss.ppo_epochs}, {loss.num_minibatches}")
  hint_fn = hint_fn or HINTS.get(config.env_name, expert_hint)
  setup, params, writer, base_key, before = common.start(
      workdir, config, model, rollout, warm_start, evaluation, tokenizer_path)

  estimator = estimators.get_estimator(config.estimator)
  kwargs = dict(config.estimator_kwargs)
  kwargs.setdefault("num_groups", config.batch_size)
  correction = functools.partial(distillation_correction, coef=ahead.coef,
                                 delta_max=ahead.delta_max, nu_err=ahead.nu_err,
                                 nu_rout=ahead.nu_rout, mode=ahead.mode)
  credit = pipeline.CreditPipeline(estimator=functools.partial(estimator, **kwargs),
                                   corrections=(correction, *corrections))
  policy_opt = common.make_optimizer(optim, config.num_iterations)
  update = step_lib.make_update_fn(
      policy_graphdef=setup.graphdef, critic_graphdef=None, policy_optimizer=policy_opt,
      critic_optimizer=None, advantage_fn=credit, loss=loss, allowed=setup.allowed,
      temperature=setup.temperature, max_actions=setup.max_actions)
  teacher_fn = make_teacher_fn(setup)
  state = types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(config.seed + 2)),
      policy_params=params, policy_opt_state=policy_opt.init(params),
      ref_params=jax.tree.map(jnp.copy, params) if loss.kl_coef > 0 else None)
  teacher = jax.tree.map(jnp.copy, params)
  ckpt = checkpoint_lib.Checkpointer(workdir)
  extra = {"iteration": 0}
  if ckpt.latest_step() is not None:
    state, extra = ckpt.restore(target=state)
    # The teacher snapshot is not saved: a resumed run re-syncs it to the restored policy.
    teacher = jax.tree.map(jnp.copy, state.policy_params)
  make_env = lambda: RecordingEnv(setup.make_env(), hint_fn)
  progress = metrics_lib.ProgressBar(total=config.num_iterations, initial=extra["iteration"],
                                     enabled=jax.process_index() == 0)
  metrics: dict[str, float] = {}
  for iteration in range(extra["iteration"], config.num_iterations):
    start = time.perf_counter()
    if iteration % ahead.sync_every == 0:
      teacher = jax.tree.map(jnp.copy, state.policy_params)
    seeds, groups = common.task_batch(config, iteration)
    traj, envs, stats = common.collect(setup, state.policy_params, seeds, groups,
                                       jax.random.fold_in(base_key, 1000 + iteration), make_env)
    inputs = teacher_inputs(traj, [env.records for env in envs], setup.tokenizer.encode,
                            setup.tokenizer.act_id, ahead.feedback_max_chars)
    device = common.to_device(traj)
    t_logp = teacher_fn(teacher, device.action_mask, device.sample_logprob, inputs.tokens,
                        inputs.turn_of_token, inputs.action_mask)
    error_tok = types.broadcast_turns_to_tokens(jnp.asarray(inputs.error_turn, jnp.float32),
                                                device.turn_of_token, device.action_mask) > 0
    device = device.replace(extras={TEACHER_LOGPROB: t_logp, ERROR_STEP: error_tok})
    state, m = update(state, device)
    metrics = {"train/success": float(np.mean(traj.success)),
               "train/outcome": float(np.mean(traj.outcome)),
               "ahead/error_step_rate": float(inputs.error_turn.sum() / max(traj.turn_mask.sum(), 1)),
               **stats.as_metrics(), **{k: float(v) for k, v in jax.device_get(m).items()}}
    metrics["time/iteration_s"] = time.perf_counter() - start
    done = extra["iteration"] = iteration + 1
    if iteration == 0:
      metrics_lib.write_operative_config(workdir, process_index=jax.process_index())
    if done % evaluation.every == 0 or done == config.num_iterations:
      metrics.update(common.evaluate(setup, state.policy_params, evaluation,
                                     jax.random.fold_in(base_key, done)))
    if done % config.log_every == 0 or done == config.num_iterations:
      writer.write(done, metrics)
    progress.update(done, {"success": metrics["train/success"],
                           "loss": metrics.get("loss/policy", float("nan"))})
    if done % config.checkpoint_every == 0 or done == config.num_iterations:
      ckpt.save(done, state, extra)
  progress.close()
  return common.finish("ahead", setup, state.policy_params, metrics, before, extra["iteration"],
                       evaluation, base_key, writer)
