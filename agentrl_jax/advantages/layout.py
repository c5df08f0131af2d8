"""The step-row layout (verl-agent) and converters to and from the concatenated layout.

The rollout produces the *concatenated* layout: one row per episode, `[B, L]` tokens holding every
turn's observation and action side by side (`types.Trajectories`). verl-agent trains on *step rows*
instead: one row per turn, whose prompt is the last few turns of history followed by the turn's own
observation, and whose response is the turn's action. This module defines that layout as a
`Trajectories` too, so losses and estimators read it through the same contract.

Step-row format, for a concatenated batch of B episodes, N turns and `history_turns = h`:

* R = B·N rows, row `r = b·N + k` holds turn `k` of episode `b`; rows of missing turns exist (static
  shapes) with `turn_mask` False and no tokens.
* Tokens `[R, row_length]`: the concatenated tokens of turns `max(0, k − h) … k` (observation and
  action of each), copied as one contiguous window and left-aligned, then padding. When the window
  is longer than `row_length`, its oldest tokens are cut (left truncation, as a prompt would be).
* `action_mask` is True only on turn `k`'s own action tokens; `sample_logprob` carries their
  log-probs and is 0 elsewhere (history actions are context in this row, not samples).
* `turn_of_token` is 0 on every token of the window and −1 on padding: a step row is a one-turn
  episode whose observation is the history plus the current observation.
* Turn level `[R, 1]`: the fields of turn `k` (`reward`, `done`, `obs_hash`, …); `turn_start`/
  `turn_end` are the action span's offsets inside the row.
* Trajectory level `[R]`: `group_id`, `outcome` (the episode reward every step row carries, as in
  verl-agent), `success` and `sub_outcomes` of episode `b`.
* `extras`: the layout's own bookkeeping under `STEP_*` keys (below), every per-turn extra of the
  concatenated batch (leading shape `[B, N]`) reshaped to `[R, …]` under its own name, and every
  per-episode extra (leading shape `[B]`) repeated per row under `EPISODE_EXTRA_PREFIX + name`.

Bookkeeping extras, all `[R]`:
  `step.episode` (int32 b), `step.turn` (int32 k), `step.exists` (bool, `turn_mask[b, k]`),
  `step.window_start` (int32 position in the concatenated row of the row's first token),
  `step.context_length` (int32 tokens of earlier turns before turn `k`'s own observation),
  `step.truncated` (bool, the history window was cut to fit `row_length`).

The concatenated layout must follow the contract of `types.py`: each turn's tokens are contiguous
and turns come in order. Then `steps_to_flatten(flatten_to_steps(traj, h, W), …)` returns `traj`
exactly (padding as zeros) whenever `W ≥ required_row_length(traj, h)`, and exactly on every action
token, log-prob and turn-level field whenever each action fits in `W` (checked on host inputs).
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax import types
from agentrl_jax.advantages import estimators

Array = jax.Array

STEP_EPISODE = "step.episode"
STEP_TURN = "step.turn"
STEP_EXISTS = "step.exists"
STEP_WINDOW_START = "step.window_start"
STEP_CONTEXT_LENGTH = "step.context_length"
STEP_TRUNCATED = "step.truncated"
STEP_KEYS = (STEP_EPISODE, STEP_TURN, STEP_EXISTS, STEP_WINDOW_START, STEP_CONTEXT_LENGTH,
             STEP_TRUNCATED)
EPISODE_EXTRA_PREFIX = "episode."

_TURN_FIELDS = ("turn_mask", "reward", "done", "obs_hash", "action_valid", "env_error")
_EPISODE_FIELDS = ("group_id", "outcome", "success")


def _is_traced(*xs) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(xs))


def _check_layout_args(history_turns: int, row_length: int) -> None:
  if not isinstance(history_turns, (int, np.integer)) or history_turns < 0:
    raise ValueError(f"history_turns must be an int >= 0, got {history_turns!r}")
  if not isinstance(row_length, (int, np.integer)) or row_length < 1:
    raise ValueError(f"row_length must be an int >= 1, got {row_length!r}")


def _turn_token_spans(turn_of_token: Array, max_turns: int) -> tuple[Array, Array]:
  """`[B, N]` first token and one-past-last token of every turn (`L`, 0 for a turn with none)."""
  b, length = turn_of_token.shape
  position = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  # Segment b·N + k; padding (-1) goes to segment B·N, which is dropped.
  in_turn = (turn_of_token >= 0) & (turn_of_token < max_turns)
  segment = jnp.where(in_turn, jnp.arange(b, dtype=jnp.int32)[:, None] * max_turns + turn_of_token,
                      b * max_turns)
  num = b * max_turns
  begin = jax.ops.segment_min(position.reshape(-1), segment.reshape(-1), num + 1)[:num]
  stop = jax.ops.segment_max(position.reshape(-1) + 1, segment.reshape(-1), num + 1)[:num]
  begin = jnp.minimum(begin, length).reshape(b, max_turns)
  stop = jnp.maximum(stop, 0).reshape(b, max_turns)
  return begin, stop


def _history_begin(begin: Array, history_turns: int) -> Array:
  """`[B, N]` first token of turns `max(0, k − h) … k`: a sliding minimum over `h + 1` turns."""
  n = begin.shape[1]
  out = begin
  for shift in range(1, min(history_turns, n - 1) + 1):
    before_first = jnp.full(begin.shape[:1] + (shift,), np.iinfo(np.int32).max, jnp.int32)
    shifted = jnp.concatenate([before_first, begin[:, :-shift]], axis=1)
    out = jnp.minimum(out, shifted)
  return out


def required_row_length(traj: types.Trajectories, history_turns: int) -> int:
  """The smallest `row_length` that holds every existing turn with its full history (host side)."""
  _check_layout_args(history_turns, 1)
  turn_of_token = jnp.asarray(traj.turn_of_token)
  begin, stop = _turn_token_spans(turn_of_token, traj.max_turns)
  window = stop - _history_begin(begin, history_turns)
  window = jnp.where(jnp.asarray(traj.turn_mask).astype(bool), window, 0)
  return max(int(jnp.max(window, initial=0)), 1)


def check_actions_fit(traj: types.Trajectories, row_length: int) -> None:
  """Raises a ValueError naming the first existing turn whose action span is longer than a row.

  Such a turn could not keep its own action tokens in the step-row layout (host inputs only).
  """
  span = np.asarray(traj.turn_end) - np.asarray(traj.turn_start)
  too_long = np.asarray(traj.turn_mask).astype(bool) & (span > row_length)
  if too_long.any():
    b, k = (int(i) for i in np.argwhere(too_long)[0])
    raise ValueError(
        f"trajectory {b} turn {k} has an action of {int(span[b, k])} tokens "
        f"(turn_start={int(np.asarray(traj.turn_start)[b, k])}, "
        f"turn_end={int(np.asarray(traj.turn_end)[b, k])}), longer than row_length={row_length}")


def check_layout_contract(traj: types.Trajectories) -> None:
  """Raises a ValueError naming the first row that breaks the token layout the converters assume.

  Each row must hold its turns in order, each turn's tokens side by side, turn ids in `[0, N)`,
  and padding (−1) only after the last turn (host inputs only).
  """
  turn_of_token = np.asarray(traj.turn_of_token)
  n = traj.max_turns
  bad_id = (turn_of_token < -1) | (turn_of_token >= n)
  if bad_id.any():
    b, pos = (int(i) for i in np.argwhere(bad_id)[0])
    raise ValueError(f"trajectory {b}: turn_of_token[{pos}] = {int(turn_of_token[b, pos])} is "
                     f"outside [-1, {n})")
  # With padding read as N, a valid row is non-decreasing.
  ordered = np.where(turn_of_token >= 0, turn_of_token, n)
  backwards = np.diff(ordered, axis=1) < 0
  if backwards.any():
    b, pos = (int(i) for i in np.argwhere(backwards)[0])
    before = int(turn_of_token[b, pos])
    raise ValueError(
        f"trajectory {b}: token {pos + 1} belongs to turn {int(turn_of_token[b, pos + 1])} after "
        f"a token of {'padding' if before < 0 else f'turn {before}'}; the step-row layout needs "
        f"turns in order, each contiguous, padding only at the end")


def _split_extras(extras: dict[str, Array], b: int, n: int) -> tuple[dict, dict]:
  per_turn, per_episode = {}, {}
  for name, value in extras.items():
    if name.startswith("step.") or name.startswith(EPISODE_EXTRA_PREFIX):
      raise ValueError(f"traj.extras[{name!r}]: names starting with 'step.' or "
                       f"{EPISODE_EXTRA_PREFIX!r} are reserved for the step-row layout")
    shape = tuple(np.shape(value))
    if shape[:2] == (b, n):
      per_turn[name] = value
    elif shape[:1] == (b,):
      per_episode[name] = value
    else:
      raise ValueError(f"traj.extras[{name!r}] has shape {list(shape)}; the step-row layout needs "
                       f"a leading [B, N] = [{b}, {n}] (per turn) or [B] = [{b}] (per episode)")
  return per_turn, per_episode


def flatten_to_steps(traj: types.Trajectories, history_turns: int,
                     row_length: int) -> types.Trajectories:
  """Converts a concatenated batch `[B, L]` into step rows `[B·N, row_length]` (module docstring).

  Jittable with `history_turns` and `row_length` static. On host (non-traced) inputs it first checks
  the token layout (`check_layout_contract`) and that every action fits in a row
  (`check_actions_fit`); under jit a turn whose history was cut is reported in
  `extras["step.truncated"]`, and an action longer than a row loses its oldest tokens.

  Args:
    traj: the concatenated batch.
    history_turns: h ≥ 0, the number of earlier turns kept as context (verl-agent's
      `history_length`); h ≥ N − 1 keeps the whole episode prefix.
    row_length: W, the static token length of a step row.

  Returns:
    A `Trajectories` with `batch_size = B·N`, `max_len = W`, `max_turns = 1`.
  """
  _check_layout_args(history_turns, row_length)
  b, length, n = traj.batch_size, traj.max_len, traj.max_turns
  per_turn_extras, per_episode_extras = _split_extras(traj.extras, b, n)
  if not _is_traced(traj):
    check_layout_contract(traj)
    check_actions_fit(traj, row_length)
  rows = b * n
  turn_of_token = jnp.asarray(traj.turn_of_token)
  turn_mask = jnp.asarray(traj.turn_mask).astype(bool)
  begin, stop = _turn_token_spans(turn_of_token, n)
  history_begin = _history_begin(begin, history_turns)
  # Left truncation: the window ends at the turn's last token and holds at most `row_length`.
  window_start = jnp.where(turn_mask, jnp.maximum(history_begin, stop - row_length), 0)
  window_length = jnp.where(turn_mask, jnp.maximum(stop - window_start, 0), 0)
  context_length = jnp.clip(begin - window_start, 0, window_length)
  truncated = turn_mask & (window_start > history_begin)

  episode = jnp.repeat(jnp.arange(b, dtype=jnp.int32), n)
  turn = jnp.tile(jnp.arange(n, dtype=jnp.int32), b)
  offset = jnp.arange(row_length, dtype=jnp.int32)[None, :]
  source = window_start.reshape(rows, 1) + offset  # [R, W] position in the concatenated row
  in_window = offset < window_length.reshape(rows, 1)
  safe_source = jnp.clip(source, 0, length - 1)

  def gather(x):
    return jnp.asarray(x)[episode[:, None], safe_source]

  own_action = (in_window & gather(traj.action_mask).astype(bool)
                & (gather(turn_of_token) == turn[:, None]))
  step_turn_start = jnp.asarray(traj.turn_start) - window_start
  step_turn_end = jnp.asarray(traj.turn_end) - window_start

  def per_row(x):  # [B, N, ...] -> [R, ...]
    x = jnp.asarray(x)
    return x.reshape((rows,) + x.shape[2:])

  def repeat(x):  # [B, ...] -> [R, ...]
    return jnp.repeat(jnp.asarray(x), n, axis=0)

  turn_fields = {name: per_row(getattr(traj, name))[:, None] for name in _TURN_FIELDS}
  extras = {name: per_row(value) for name, value in per_turn_extras.items()}
  extras.update({EPISODE_EXTRA_PREFIX + name: repeat(value)
                 for name, value in per_episode_extras.items()})
  extras.update({
      STEP_EPISODE: episode,
      STEP_TURN: turn,
      STEP_EXISTS: turn_mask.reshape(rows),
      STEP_WINDOW_START: window_start.reshape(rows).astype(jnp.int32),
      STEP_CONTEXT_LENGTH: context_length.reshape(rows).astype(jnp.int32),
      STEP_TRUNCATED: truncated.reshape(rows),
  })
  return types.Trajectories(
      tokens=jnp.where(in_window, gather(traj.tokens), 0).astype(jnp.int32),
      action_mask=own_action,
      turn_of_token=jnp.where(in_window, 0, -1).astype(jnp.int32),
      sample_logprob=jnp.where(own_action, gather(traj.sample_logprob), 0.0).astype(jnp.float32),
      turn_start=per_row(step_turn_start)[:, None].astype(jnp.int32),
      turn_end=per_row(step_turn_end)[:, None].astype(jnp.int32),
      sub_outcomes={name: repeat(value) for name, value in traj.sub_outcomes.items()},
      extras=extras,
      **turn_fields,
      **{name: repeat(getattr(traj, name)) for name in _EPISODE_FIELDS},
  )


def _check_step_rows(step_traj: types.Trajectories, max_turns: int) -> None:
  missing = [key for key in STEP_KEYS if key not in step_traj.extras]
  if missing:
    raise ValueError(f"not a step-row batch: traj.extras lacks {missing} "
                     f"(build it with layout.flatten_to_steps)")
  if step_traj.max_turns != 1:
    raise ValueError(f"step rows have one turn each, got max_turns={step_traj.max_turns}")
  if not isinstance(max_turns, (int, np.integer)) or max_turns < 1:
    raise ValueError(f"max_turns must be an int >= 1, got {max_turns!r}")
  if step_traj.batch_size % max_turns:
    raise ValueError(f"{step_traj.batch_size} step rows are not a whole number of episodes of "
                     f"max_turns={max_turns} rows")


def _own_turn_targets(step_traj: types.Trajectories, max_len: int) -> tuple[Array, Array, Array]:
  """Per step-row token: its episode, its position in the concatenated row (`max_len` = none), and
  whether it is one of the row's own-turn tokens (those are written back; history is a copy)."""
  width = step_traj.max_len
  extras = step_traj.extras
  offset = jnp.arange(width, dtype=jnp.int32)[None, :]
  own = (jnp.asarray(step_traj.turn_of_token) >= 0) & (
      offset >= jnp.asarray(extras[STEP_CONTEXT_LENGTH])[:, None]) & jnp.asarray(
          extras[STEP_EXISTS]).astype(bool)[:, None]
  target = jnp.asarray(extras[STEP_WINDOW_START])[:, None] + offset
  own = own & (target < max_len)
  target = jnp.where(own, target, max_len)  # out of bounds: dropped by the scatter
  return jnp.asarray(extras[STEP_EPISODE]), target, own


def step_rows_to_tokens(step_values: Array, step_traj: types.Trajectories, *, max_turns: int,
                        max_len: int, fill: Any = 0) -> Array:
  """Writes a per-token quantity of step rows `[R, W]` back to the concatenated layout `[B, L]`.

  Each row contributes its own turn's tokens (the history is a copy of earlier rows' own tokens);
  positions no row owns get `fill`.
  """
  _check_step_rows(step_traj, max_turns)
  episode, target, own = _own_turn_targets(step_traj, max_len)
  step_values = jnp.asarray(step_values)
  b = step_traj.batch_size // max_turns
  out = jnp.full((b, max_len), fill, step_values.dtype)
  return out.at[episode[:, None], target].set(step_values, mode="drop")


def tokens_to_step_rows(values: Array, step_traj: types.Trajectories, *, fill: Any = 0) -> Array:
  """Reads a per-token quantity of the concatenated layout `[B, L]` into step rows `[R, W]`.

  Every token of a row's window (history included) gets the value of its source token.
  """
  values = jnp.asarray(values)
  chex.assert_rank(values, 2)
  extras = step_traj.extras
  width = step_traj.max_len
  offset = jnp.arange(width, dtype=jnp.int32)[None, :]
  source = jnp.asarray(extras[STEP_WINDOW_START])[:, None] + offset
  in_window = jnp.asarray(step_traj.turn_of_token) >= 0
  gathered = values[jnp.asarray(extras[STEP_EPISODE])[:, None],
                    jnp.clip(source, 0, values.shape[1] - 1)]
  return jnp.where(in_window, gathered, jnp.asarray(fill, values.dtype))


def steps_to_flatten(step_traj: types.Trajectories, *, max_turns: int,
                     max_len: int) -> types.Trajectories:
  """Converts step rows back to the concatenated layout `[B, max_len]` with `B = R / max_turns`.

  The inverse of `flatten_to_steps` (see the module docstring for when it is exact). Every row
  writes its own turn's tokens back to their positions; history copies are not read. Jittable with
  `max_turns` and `max_len` static.

  Args:
    step_traj: a step-row batch from `flatten_to_steps` (rows may carry new values, e.g. log-probs,
      but keep the `step.*` extras).
    max_turns: N of the concatenated batch.
    max_len: L of the concatenated batch.
  """
  _check_step_rows(step_traj, max_turns)
  rows = step_traj.batch_size
  b, n = rows // max_turns, max_turns
  episode, target, own = _own_turn_targets(step_traj, max_len)
  turn = jnp.asarray(step_traj.extras[STEP_TURN])
  window_start = jnp.asarray(step_traj.extras[STEP_WINDOW_START])

  def scatter(x, fill, mask=None):
    x = jnp.asarray(x)
    if mask is not None:
      x = jnp.where(mask, x, fill)
    return jnp.full((b, max_len), fill, x.dtype).at[episode[:, None], target].set(x, mode="drop")

  action_mask = jnp.asarray(step_traj.action_mask).astype(bool) & own
  turn_of_token = jnp.broadcast_to(turn[:, None], target.shape)

  def per_turn(x):  # [R, 1] or [R, ...] -> [B, N, ...]
    x = jnp.asarray(x)
    return x.reshape((b, n) + x.shape[1:])

  def per_episode(x):  # [R, ...] -> [B, ...], read from each episode's row k = 0
    return jnp.asarray(x)[::n]

  extras = {}
  for name, value in step_traj.extras.items():
    if name.startswith("step."):
      continue
    if name.startswith(EPISODE_EXTRA_PREFIX):
      extras[name[len(EPISODE_EXTRA_PREFIX):]] = per_episode(value)
    else:
      extras[name] = per_turn(value)
  return types.Trajectories(
      tokens=scatter(step_traj.tokens, 0).astype(jnp.int32),
      action_mask=scatter(action_mask, False),
      turn_of_token=scatter(turn_of_token.astype(jnp.int32), -1),
      sample_logprob=scatter(step_traj.sample_logprob, 0.0, action_mask).astype(jnp.float32),
      turn_start=(per_turn(step_traj.turn_start[:, 0]) + per_turn(window_start)).astype(jnp.int32),
      turn_end=(per_turn(step_traj.turn_end[:, 0]) + per_turn(window_start)).astype(jnp.int32),
      sub_outcomes={name: per_episode(v) for name, v in step_traj.sub_outcomes.items()},
      extras=extras,
      **{name: per_turn(getattr(step_traj, name)[:, 0]) for name in _TURN_FIELDS},
      **{name: per_episode(getattr(step_traj, name)) for name in _EPISODE_FIELDS},
  )


def on_step_rows(estimator: Callable[..., Any] | str, step_traj: types.Trajectories,
                 values: Array | None = None, *, max_turns: int, max_len: int,
                 **hyperparams: Any):
  """Runs a concatenated-layout estimator on step rows; returns its output in step rows `[R, W]`.

  The batch is rebuilt episode by episode (`steps_to_flatten`), so episode- and group-level
  statistics are exactly those of the concatenated layout; then every token advantage goes to the
  same action token of its step row (history tokens carry no advantage: they are not actions of
  that row). Critic `values` `[R, W]`, when given, are read at each row's own tokens, i.e. with the
  row's own context.

  Args:
    estimator: an `estimators.Estimator`, a registered name, or any `fn(traj, values, **kw)`
      returning a NamedTuple of `[B, L]` arrays.
    step_traj: the step rows.
    values: `[R, W]` critic values, or None.
    max_turns: N of the concatenated batch.
    max_len: L of the concatenated batch.
    **hyperparams: passed to the estimator.

  Returns:
    The estimator's output type with every `[B, L]` field mapped to `[R, W]`.
  """
  if isinstance(estimator, str):
    estimator = estimators.get_estimator(estimator)
  flat = steps_to_flatten(step_traj, max_turns=max_turns, max_len=max_len)
  flat_values = None
  if values is not None:
    chex.assert_shape(values, step_traj.tokens.shape)
    flat_values = step_rows_to_tokens(values, step_traj, max_turns=max_turns, max_len=max_len)
  out = estimator(flat, flat_values, **hyperparams)
  action_mask = jnp.asarray(step_traj.action_mask).astype(bool)

  def to_rows(x):
    return jnp.where(action_mask, tokens_to_step_rows(x, step_traj), 0).astype(x.dtype)

  return type(out)(*(to_rows(x) for x in out))
