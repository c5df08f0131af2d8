"""SERL — selective environment-reweighted learning (docs/methods.md#serl).

The task reward fixes the *direction* of every update; environment feedback decides *where and
how much*. A teacher (a synced snapshot of the student) re-scores the student's sampled action
tokens under a privileged hindsight context; the teacher/student log-prob gap becomes a bounded,
sign-aligned multiplicative weight on the advantage:

  λ_eff = λ·max(0, 1 − step/T_decay)                 (λ if T_decay = 0)
  Δ_t   = sg(logp_T(t) − logp_S(t))
  w_t   = clip(exp(clip(sign(A_t)·Δ_t, −20, 20)), 1 − c, 1 + c)
  A'_t  = A_t·[(1 − λ_eff) + λ_eff·w_t]   on Sel = policy ∧ serl_mask ∧ action span;  A_t elsewhere

With `c < 1` every factor is positive, so the sign of the advantage never changes and
`|A'/A − 1| ≤ λ_eff·c`.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array

_EXP_CLIP = 20.0


def effective_mixing(step: Array, *, mixing_lambda: float, decay_steps: int) -> Array:
  """`λ_eff = λ·max(0, 1 − step/T_decay)`, or `λ` when `decay_steps == 0`."""
  if decay_steps == 0:
    return jnp.asarray(mixing_lambda, jnp.float32)
  return mixing_lambda * jnp.maximum(0.0, 1.0 - jnp.asarray(step, jnp.float32) / decay_steps)


def environment_reweighting(advantages: Array, teacher_logprob: Array, student_logprob: Array,
                            selected: Array, mixing: Array, *, weight_clip: float = 0.2) -> Array:
  """The SERL kernel (see the module docstring).

  Args:
    advantages: `[B, L]` token advantages from any estimator.
    teacher_logprob: `[B, L]` teacher log-probs of the sampled tokens under privileged context.
    student_logprob: `[B, L]` student log-probs of the same tokens (detached here).
    selected: `[B, L]` bool, the set `Sel`.
    mixing: scalar λ_eff in [0, 1].
    weight_clip: c in [0, 1).
  """
  chex.assert_rank([advantages, teacher_logprob, student_logprob, selected], 2)
  chex.assert_equal_shape([advantages, teacher_logprob, student_logprob, selected])
  base = advantages.astype(jnp.float32)
  gap = jax.lax.stop_gradient(teacher_logprob.astype(jnp.float32) - student_logprob.astype(jnp.float32))
  aligned = jnp.clip(jnp.sign(base) * gap, -_EXP_CLIP, _EXP_CLIP)
  weight = jnp.clip(jnp.exp(aligned), 1.0 - weight_clip, 1.0 + weight_clip)
  factor = (1.0 - mixing) + mixing * weight
  return jnp.where(selected, (base * factor).astype(advantages.dtype), advantages)


def environment_reweighted_credit(traj: types.Trajectories, advantages: Array, *,
                                  mixing_lambda: float = 0.5, decay_steps: int = 50,
                                  weight_clip: float = 0.2,
                                  success_threshold: float = 1.0,
                                  reprompt_successes: bool = False) -> Array:
  """Correction: SERL (docs/methods.md#serl) after any estimator (GRPO in the paper).

  Needs `traj.extras["teacher_logprob"]` (`[B, L]` float32, the teacher's log-probs of the sampled
  ids under the privileged prompt) and, when `decay_steps > 0`, `traj.extras["update_step"]`
  (int, the policy update counter: a scalar, or the same value for each of the B rows).
  Optional: `extras["student_logprob"]` (`[B, L]`; default `traj.sample_logprob`), `extras["serl_mask"]` (`[B]` bool, the sample got privileged
  context; default: every sample whose outcome is below `success_threshold`, or every sample when
  `reprompt_successes`), `extras["action_span"]` (`[B, L]` bool, tokens of the parsed action;
  default every policy token).

  Args:
    traj: the batch.
    advantages: `[B, L]` token advantages.
    mixing_lambda: λ in [0, 1] (default 0.5).
    decay_steps: T_decay ≥ 0 (default 50; 0 = no decay).
    weight_clip: c in [0, 1) (default 0.2).
    success_threshold: outcome at or above which a sample counts as a success (default 1.0).
    reprompt_successes: give successes privileged context too (default False, as in SERL).
  """
  if not 0.0 <= mixing_lambda <= 1.0:
    raise ValueError(f"serl mixing_lambda must be in [0, 1], got {mixing_lambda!r}")
  if not 0.0 <= weight_clip < 1.0:
    raise ValueError(f"serl weight_clip must be in [0, 1) so that no sign flips, got {weight_clip!r}")
  if not (isinstance(decay_steps, int) and decay_steps >= 0):
    raise ValueError(f"serl decay_steps must be an int >= 0, got {decay_steps!r}")
  method = "environment_reweighted_credit (SERL)"
  teacher = trajectory.require(traj.extras, extra_keys.TEACHER_LOGPROB_KEY, where="extras", method=method,
                          meaning="[B, L] teacher log-probs of the sampled ids")
  student = jnp.asarray(traj.extras.get(extra_keys.STUDENT_LOGPROB_KEY, traj.sample_logprob))
  step = (trajectory.require(traj.extras, extra_keys.UPDATE_STEP_KEY, where="extras", method=method,
                        meaning="policy update counter, for the λ decay")
          if decay_steps > 0 else jnp.zeros((), jnp.int32))
  # A scalar, or one copy per row (batch-major, so it shards with the batch): all rows agree.
  step = jnp.max(jnp.asarray(step))
  mixing = effective_mixing(step, mixing_lambda=mixing_lambda, decay_steps=decay_steps)
  if extra_keys.SERL_MASK_KEY in traj.extras:
    reprompted = jnp.asarray(traj.extras[extra_keys.SERL_MASK_KEY]).astype(bool)
  elif reprompt_successes:
    reprompted = jnp.ones(advantages.shape[:1], bool)
  else:
    reprompted = jnp.asarray(traj.outcome) < success_threshold
  policy = jnp.asarray(traj.action_mask, bool)
  span = jnp.asarray(traj.extras[extra_keys.ACTION_SPAN_KEY]).astype(bool) if extra_keys.ACTION_SPAN_KEY in traj.extras else policy
  selected = policy & span & reprompted[:, None]
  return environment_reweighting(advantages, teacher, student, selected, mixing,
                                 weight_clip=weight_clip)
