"""SERL's teacher pass (ALGORITHMS.md B.13): a synced snapshot of the student re-scores the
student's sampled action tokens under a privileged hindsight context.

`PrivilegedTeacher` is a rollout strategy for `learner.train`: it plays the batch with every env
recording each step's feedback (the observation the action led to), rebuilds each conversation
with "feedback: ..." inserted before every action (the student's own sampled ids, unchanged), and
puts the teacher's log-probs of those ids in `traj.extras["teacher_logprob"]` together with the
update counter `extras["update_step"]`. The correction `serl.environment_reweighted_credit` then
reads them after whatever estimator the run uses:

  learner.train.strategy = @serl_teacher.PrivilegedTeacher()
  learner.train.corrections = [@serl.environment_reweighted_credit]

The teacher is re-synced to the student every `sync_every` batches (SERL's
`teacher_sync_interval`). Its snapshot is not checkpointed: a resumed run re-syncs it to the
restored policy at its first batch, as AHEAD's does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.credit import serl
from agentrl_jax.offline import ahead


def _no_hint(ctx: ahead.HintContext) -> str:
  del ctx
  return ""  # SERL's immediate-feedback mode: the feedback alone, never a corrective hint


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
    self._score = ahead.teacher_logprob_fn(graphdef, allowed, temperature, max_actions)
    return self

  def collect(self, runner, make_env, seeds, group_ids, *, params, rng, row_ids):
    if self._score is None:
      raise ValueError("PrivilegedTeacher.collect before bind(): the learner binds the policy")
    envs = [ahead.RecordingEnv(make_env(), _no_hint) for _ in seeds]
    traj, stats = runner.collect(envs, seeds, group_ids, params=params, rng=rng, row_ids=row_ids)
    if self._teacher is None or self._batches % self.sync_every == 0:
      self._teacher = jax.tree.map(jnp.copy, params)
    tok = runner.tokenizer
    inputs = ahead.teacher_inputs(traj, [env.records for env in envs], tok.encode, tok.act_id,
                                  self.feedback_max_chars)
    teacher = self._score(self._teacher, traj.action_mask, traj.sample_logprob, inputs.tokens,
                          inputs.turn_of_token, inputs.action_mask)
    traj.extras[serl.TEACHER_LOGPROB_KEY] = np.asarray(teacher, np.float32)
    traj.extras[serl.UPDATE_STEP_KEY] = np.full((len(seeds),), self._batches, np.int32)
    self._batches += 1
    return traj, stats

  def state_dict(self) -> dict[str, Any]:
    return {"batches": self._batches}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self._batches = int(state["batches"])
    self._teacher = None  # re-synced to the restored policy at the next batch
