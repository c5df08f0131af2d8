"""The privileged teacher that AHEAD and SERL share: a snapshot of the student re-scoring the
student's own sampled action tokens under a hindsight context.

  * `RecordingEnv` wraps any `TextEnv` and records, per step, the observation the action led to
    (its feedback), whether the step was an error, and (error steps only) a corrective hint.
  * `teacher_inputs` rebuilds each conversation with that privileged text before each turn's
    action; the action tokens themselves are the sampled ones, in the same order.
  * `teacher_logprob_fn` scores those tokens under the teacher (the policy's own distribution).
  * `PrivilegedTeacher` is the rollout strategy SERL's correction reads: it plays the batch with
    recording envs and puts the teacher's log-probs in `traj.extras[TEACHER_LOGPROB_KEY]` with the
    update counter in `extras[UPDATE_STEP_KEY]`:

      learner.train.strategy = @teacher.PrivilegedTeacher()
      learner.train.corrections = [@serl.environment_reweighted_credit]

    The teacher is re-synced to the student every `sync_every` batches (SERL's
    `teacher_sync_interval`). Its snapshot is not checkpointed: a resumed run re-syncs it to the
    restored policy at its first batch, as AHEAD's does.

Hints come from a hint function `(HintContext) -> str`: `HINTS` holds a rule-based one per env;
any callable (an LLM client, say) can be passed instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.envs import base as envs_base
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer


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

  An error step (AHEAD's default detector) is an invalid action, an action after which the state
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


def teacher_logprob_fn(graphdef, allowed, temperature: float, max_actions: int):
  """Jitted `(teacher_params, student mask and log-probs [B, L], teacher inputs) -> [B, L]`.

  The teacher's log-prob of the k-th action token of a row is written at the position of the
  student's k-th action token. A student token the teacher has no counterpart for (its env
  faulted before recording the step) keeps the student's own log-prob, so its δ is 0.
  """

  def teacher_logprob(params, student_action_mask, student_logprob, t_tokens, t_turns,
                      t_action_mask):
    t_view = distribution.action_view(t_action_mask, max_actions)
    logp, _ = distribution.action_log_probs(graphdef, params, t_tokens,
                                        transformer.positions_from_turns(t_turns), t_view,
                                        allowed, temperature)
    s_view = distribution.action_view(student_action_mask, max_actions)
    rows = jnp.arange(student_logprob.shape[0])[:, None]
    both = s_view.valid & t_view.valid
    return student_logprob.at[rows, s_view.index].set(
        jnp.where(both, logp, s_view.gather(student_logprob)))

  return jax.jit(teacher_logprob)


def _no_hint(ctx: HintContext) -> str:
  del ctx
  return ""  # SERL's immediate-feedback mode: the feedback alone, never a corrective hint


@config_errors.config_class
@dataclasses.dataclass(eq=False, kw_only=True)
class PrivilegedTeacher:
  """Rollout strategy adding the teacher's log-probs (see the module docstring).

  Attributes:
    sync_every: batches between teacher re-syncs to the student (SERL default 10).
    feedback_max_chars: the feedback text is cut to this many characters.
  """

  sync_every: int = 10
  feedback_max_chars: int = 200
  _teacher: Any = dataclasses.field(default=None, repr=False)
  _batches: int = 0
  _score: Any = dataclasses.field(default=None, repr=False)

  def __post_init__(self):
    if self.sync_every < 1 or self.feedback_max_chars < 1:
      raise ValueError(f"PrivilegedTeacher: sync_every and feedback_max_chars must be >= 1, got "
                       f"{self.sync_every}, {self.feedback_max_chars}")

  def bind(self, *, graphdef, allowed, temperature: float, max_actions: int) -> PrivilegedTeacher:
    """Called by the learner once the policy's structure is known."""
    # Each student action token gets the teacher's log-prob of the same id (a token whose env
    # faulted before the step was recorded keeps the student's, so SERL leaves it unchanged).
    self._score = teacher_logprob_fn(graphdef, allowed, temperature, max_actions)
    return self

  def collect(self, runner, make_env, seeds, group_ids, *, params, rng, row_ids):
    if self._score is None:
      raise ValueError("PrivilegedTeacher.collect before bind(): the learner binds the policy")
    envs = [RecordingEnv(make_env(), _no_hint) for _ in seeds]
    traj, stats = runner.collect(envs, seeds, group_ids, params=params, rng=rng, row_ids=row_ids)
    if self._teacher is None or self._batches % self.sync_every == 0:
      self._teacher = jax.tree.map(jnp.copy, params)
    tok = runner.tokenizer
    inputs = teacher_inputs(traj, [env.records for env in envs], tok.encode, tok.act_id,
                                  self.feedback_max_chars)
    teacher = self._score(self._teacher, traj.action_mask, traj.sample_logprob, inputs.tokens,
                          inputs.turn_of_token, inputs.action_mask)
    traj.extras[extra_keys.TEACHER_LOGPROB_KEY] = np.asarray(teacher, np.float32)
    traj.extras[extra_keys.UPDATE_STEP_KEY] = np.full((len(seeds),), self._batches, np.int32)
    self._batches += 1
    return traj, stats

  def state_dict(self) -> dict[str, Any]:
    return {"batches": self._batches}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self._batches = int(state["batches"])
    self._teacher = None  # re-synced to the restored policy at the next batch
