"""C³ — Confidence-guided credit correction on flagged behaviour spans (docs/methods.md#c3).

Outcome-only RL reinforces everything in a successful trajectory, bad local habits included
(invalid calls, repeated actions, redundant tool calls). After advantage estimation, C³ shrinks
only the *positive* credit on flagged spans, more where the behaviour policy was confident —
confident bad habits are the ones that get entrenched:

  conf_s = exp( Σ_{t∈s} logp_old(t) / |s| )                       geometric-mean probability
  φ_s    = clip(1 − α·conf_s^κ, φ_min, 1)                         ("high_conf_stronger")
           clip(1 − α·(1 − conf_s)^κ, φ_min, 1)                   ("low_conf_stronger", an ablation)
  A'_t   = A_t·φ_{s(t)}  if t ∈ s and A_t > 0;   A_t otherwise.

A span is the flagged action tokens of one turn. Rewards and the upstream advantages are untouched.
"""

from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array

DIRECTIONS = ("high_conf_stronger", "low_conf_stronger")
DETECTORS = ("invalid_action", "repeat_action", "redundant_tool_call", "format_error")


def span_confidence(logprob: Array, span_tokens: Array) -> Array:
  """`[B, N]` geometric-mean token probability of each turn's span (1 for empty spans).

  Args:
    logprob: `[B, L]` behaviour-policy log-probs of the sampled tokens.
    span_tokens: `[B, L, N]` bool, token l belongs to turn n's span.
  """
  chex.assert_rank([logprob, span_tokens], [2, 3])
  weight = span_tokens.astype(jnp.float32)
  total = jnp.einsum("bl,bln->bn", logprob.astype(jnp.float32), weight)
  count = jnp.sum(weight, axis=1)
  return jnp.exp(jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0))


def correction_factor(confidence: Array, *, alpha: float = 1.0, kappa: float = 1.0,
                      min_factor: float = 0.0, direction: str = "high_conf_stronger") -> Array:
  """`φ = clip(1 − α·g(conf)^κ, φ_min, 1)`, `g(c) = c` or `1 − c` (see the module docstring)."""
  _check(alpha, kappa, min_factor, direction)
  driver = confidence if direction == "high_conf_stronger" else 1.0 - confidence
  return jnp.clip(1.0 - alpha * jnp.power(jnp.clip(driver, 0.0, 1.0), kappa), min_factor, 1.0)


def flagged_turns(traj: types.Trajectories, detectors: Sequence[str]) -> Array:
  """`[B, N]` bool: turns whose action a detector flags.

  * `invalid_action`: the env rejected the action (`~action_valid`).
  * `repeat_action`: the same action ids as an earlier turn, taken from the same state (equal
    anchor hashes: the observation had not changed). Turn 0's state is known only when
    `extras["initial_obs_hash"]` is recorded.
  * `redundant_tool_call`: a tool call (`extras["tool_call"]`, `[B, N]` bool) with the same ids as
    an earlier tool call.
  * `format_error`: `extras["format_error"]` (`[B, N]` bool), the action did not parse.
  """
  unknown = sorted(set(detectors) - set(DETECTORS))
  if unknown:
    raise ValueError(f"c3 detectors {unknown} are unknown; known: {DETECTORS}")
  turn_mask = jnp.asarray(traj.turn_mask, bool)
  flags = jnp.zeros_like(turn_mask)
  method = "c3 (C³)"
  earlier = trajectory.earlier_turn_matrix(turn_mask)
  same_action = None
  if "repeat_action" in detectors or "redundant_tool_call" in detectors:
    fingerprint = trajectory.action_fingerprints(traj)
    same_action = fingerprint[:, :, None] == fingerprint[:, None, :]
  if "invalid_action" in detectors:
    flags |= ~jnp.asarray(traj.action_valid, bool)
  if "repeat_action" in detectors:
    anchor, known = trajectory.anchor_hashes(traj)
    same_state = (anchor[:, :, None] == anchor[:, None, :]) & known[:, None, :] & known[:, :, None]
    flags |= jnp.any(same_action & same_state & earlier, axis=2)
  if "redundant_tool_call" in detectors:
    tool = trajectory.require(traj.extras, extra_keys.TOOL_CALL_KEY, where="extras", method=method,
                         meaning="[B, N] bool, the turn's action is a tool call").astype(bool)
    tool_pair = tool[:, :, None] & tool[:, None, :]
    flags |= jnp.any(same_action & tool_pair & earlier, axis=2)
  if "format_error" in detectors:
    flags |= trajectory.require(traj.extras, extra_keys.FORMAT_ERROR_KEY, where="extras", method=method,
                           meaning="[B, N] bool, the action did not parse").astype(bool)
  return flags & turn_mask


def confidence_correction(advantages: Array, logprob: Array, span_tokens: Array, *,
                          alpha: float = 1.0, kappa: float = 1.0, min_factor: float = 0.0,
                          direction: str = "high_conf_stronger") -> Array:
  """The C³ kernel: shrinks positive advantages on flagged spans by their confidence factor.

  Args:
    advantages: `[B, L]` token advantages from any estimator.
    logprob: `[B, L]` behaviour-policy log-probs.
    span_tokens: `[B, L, N]` bool, the flagged tokens of each turn's span.
    alpha, kappa, min_factor, direction: see `correction_factor`.
  """
  chex.assert_rank([advantages, logprob, span_tokens], [2, 2, 3])
  factor = correction_factor(span_confidence(logprob, span_tokens), alpha=alpha, kappa=kappa,
                             min_factor=min_factor, direction=direction)
  # A token belongs to at most one turn, so the sum picks its span's factor.
  in_span = jnp.any(span_tokens, axis=2)
  token_factor = jnp.sum(jnp.where(span_tokens, factor[:, None, :], 0.0), axis=2)
  shrink = in_span & (advantages > 0)
  corrected = advantages.astype(jnp.float32) * token_factor
  return jnp.where(shrink, corrected.astype(advantages.dtype), advantages)


def c3(traj: types.Trajectories, advantages: Array, *, alpha: float = 1.0, kappa: float = 1.0,
       min_factor: float = 0.0, direction: str = "high_conf_stronger",
       detectors: Sequence[str] = ("invalid_action", "repeat_action")) -> Array:
  """Correction: C³ (docs/methods.md#c3) after any estimator; confidence from `traj.sample_logprob`.

  Flags come from `traj.extras["behaviour_flag"]` (`[B, L]` bool, token level) when present,
  otherwise from `detectors` over the turns (see `flagged_turns`). Two detectors read extras:
  `redundant_tool_call` needs `extras["tool_call"]` and `format_error` needs
  `extras["format_error"]`, so the default runs the two that need only the data contract
  (the formalisation in docs/methods.md#c3 turns all four on; add the others where the env records
  their keys).

  Args:
    traj: the batch.
    advantages: `[B, L]` token advantages.
    alpha: α ≥ 0 (default 1).
    kappa: κ > 0 (default 1).
    min_factor: φ_min in [0, 1] (default 0: positive credit may vanish but never turns negative).
    direction: "high_conf_stronger" (default) or "low_conf_stronger".
    detectors: subset of `DETECTORS`, used when there is no `behaviour_flag`.
  """
  _check(alpha, kappa, min_factor, direction)
  turn_tokens = trajectory.turn_one_hot(traj)
  if extra_keys.BEHAVIOUR_FLAG_KEY in traj.extras:
    flag = jnp.asarray(traj.extras[extra_keys.BEHAVIOUR_FLAG_KEY]).astype(bool)
    chex.assert_equal_shape([flag, advantages])
    span_tokens = turn_tokens & flag[:, :, None]
  else:
    span_tokens = turn_tokens & flagged_turns(traj, tuple(detectors))[:, None, :]
  return confidence_correction(advantages, jnp.asarray(traj.sample_logprob), span_tokens,
                               alpha=alpha, kappa=kappa, min_factor=min_factor, direction=direction)


def _check(alpha: float, kappa: float, min_factor: float, direction: str) -> None:
  if not alpha >= 0.0:
    raise ValueError(f"c3 alpha must be >= 0, got {alpha!r}")
  if not kappa > 0:
    raise ValueError(f"c3 kappa must be > 0, got {kappa!r}")
  if not 0.0 <= min_factor <= 1.0:
    raise ValueError(f"c3 min_factor must be in [0, 1] (a negative floor would flip signs), got "
                     f"{min_factor!r}")
  if direction not in DIRECTIONS:
    raise ValueError(f"c3 direction must be one of {DIRECTIONS}, got {direction!r}")
