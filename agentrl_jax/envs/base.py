"""The host-side text-environment protocol.

An environment speaks text: `reset(seed)` returns the first observation, `step(action)` takes the
policy's decoded action text and returns the next observation, the turn reward, termination and an
`info` dict. Environments run on the host, one Python object per episode slot; the rollout loop
tokenizes each observation once, when it arrives.

Contract every environment keeps (the base class enforces the parts it can):
  * A malformed action (unknown word, empty, very long, not a string) never raises: it returns an
    observation naming the problem and the valid actions, `info["action_valid"] = False`, reward 0,
    and it counts as a turn. A policy in early training emits garbage; a crash would kill the batch.
  * The environment itself ends the episode (`done=True`) at `max_turns` steps.
  * `info` always carries `action_valid`; the last step also carries `success`; envs with verifiable
    partial results add `sub_outcomes: dict[str, float]`.
  * Stepping before `reset` or after `done` raises `RuntimeError`: that is a rollout-loop bug.
"""

from __future__ import annotations

import abc
import operator
import re
import zlib
from typing import Any, NamedTuple

import numpy as np

# Quoted invalid actions are cut to this many characters so a 10k-character generation cannot blow
# up the next observation (and the context window).
_MAX_QUOTED_ACTION_CHARS = 16
# A reply longer than this is not read for an action word: a short reply names its move, and
# scanning a runaway generation for one would reward rambling.
_MAX_FREE_TEXT_ACTION_CHARS = 200
_WORD = re.compile(r"\w+")


class StepResult(NamedTuple):
  """What `TextEnv.step` returns.

  Attributes:
    observation: text shown to the policy next.
    reward: reward for this turn.
    done: the episode ended with this turn.
    info: `action_valid: bool` always; `success: bool` when `done`; optionally
      `sub_outcomes: dict[str, float]`.
  """

  observation: str
  reward: float
  done: bool
  info: dict[str, Any]


class TextEnv(abc.ABC):
  """Base class of every text environment.

  Subclasses implement `_reset`, `_step` and `expert_action`; the public `reset`/`step` wrap them
  with the lifecycle checks, the turn counter and the step cap, so every env behaves the same at
  the edges.

  Attributes:
    name: registry name, set by `registry.register`.
    max_turns: step cap; the env returns `done=True` at this many steps.
    action_words: the finite action set when there is one, else None.
  """

  name: str = ""
  max_turns: int
  action_words: tuple[str, ...] | None = None

  def __init__(self, max_turns: int):
    if not is_int(max_turns) or max_turns < 1:
      raise ValueError(f"max_turns must be a positive int, got {max_turns!r}")
    self.max_turns = max_turns
    self._turn = 0
    self._done = True
    self._started = False

  @property
  def has_random_actions(self) -> bool:
    """Whether `random_action` can draw one (known before any episode: a warm start's
    `expert_noise` is refused where it cannot)."""
    return bool(self.action_words)

  def random_action(self, rng: np.random.Generator) -> str | None:
    """A uniformly random valid action of the current state, the noise of noisy demonstrations:
    one of `action_words` here; an env of free-text actions whose state lists its valid ones
    (e.g. a game engine's commands) overrides it. None where there is nothing to draw from."""
    return str(rng.choice(self.action_words)) if self.action_words else None

  @property
  def instructions(self) -> str:
    """The task's rules and the exact reply format, for a chat model's system message.

    "" when the env has none: the first observation is then all the policy is told (enough for a
    policy trained from scratch on the env's own framing, which never reads this).
    """
    return ""

  @property
  def turn(self) -> int:
    """Number of steps taken in the current episode."""
    return self._turn

  @property
  def done(self) -> bool:
    """Whether the current episode has ended (also True before the first reset)."""
    return self._done

  def reset(self, seed: int) -> str:
    """Starts a new episode, fully determined by `seed` and the env's config.

    Args:
      seed: non-negative int (NumPy integers are accepted).

    Returns:
      The first observation.
    """
    seed = _as_seed(seed, self._label())
    self._turn = 0
    self._done = False
    self._started = True
    return self._reset(seed)

  def step(self, action: Any) -> StepResult:
    """Applies one action; never raises on a malformed action.

    Args:
      action: the policy's action text. Anything else (None, numbers, ...) is an invalid action.

    Returns:
      The `StepResult` of this turn.

    Raises:
      RuntimeError: if called before `reset` or after the episode ended.
    """
    if not self._started:
      raise RuntimeError(f"{self._label()}: step() called before reset()")
    if self._done:
      raise RuntimeError(
          f"{self._label()}: step() called after the episode ended (turn {self._turn}); "
          "call reset() first")
    self._turn += 1
    result = self._step(action)
    if not result.done and self._turn >= self.max_turns:
      result = self._on_step_cap(result)
    self._done = result.done
    self._check_info(result)
    return result

  @abc.abstractmethod
  def expert_action(self) -> str:
    """A scripted expert's action for the current state (tests, warm starts, upper bounds)."""

  @abc.abstractmethod
  def _reset(self, seed: int) -> str:
    """Env-specific reset; returns the first observation."""

  @abc.abstractmethod
  def _step(self, action: Any) -> StepResult:
    """Env-specific transition; `self.turn` already counts this step."""

  def _on_step_cap(self, result: StepResult) -> StepResult:
    """Ends an episode that hit `max_turns` without ending on its own; envs may reword it."""
    info = dict(result.info, success=False)
    return result._replace(done=True, info=info)

  def _label(self) -> str:
    return f"env {self.name or type(self).__name__!r}"

  def _check_info(self, result: StepResult) -> None:
    # Catches a subclass breaking the contract at the step that breaks it, not downstream in the
    # rollout where the missing key would surface as an unrelated KeyError.
    if "action_valid" not in result.info:
      raise AssertionError(f"{self._label()}: info lacks 'action_valid'")
    if result.done and "success" not in result.info:
      raise AssertionError(f"{self._label()}: final info lacks 'success'")


def is_int(value: Any) -> bool:
  """True for Python and NumPy integers, False for bools (a config typo, not a count)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
  """True for real Python and NumPy numbers other than bools."""
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _as_seed(seed: Any, label: str) -> int:
  if isinstance(seed, bool):
    raise ValueError(f"{label}: seed must be a non-negative int, got {seed!r}")
  try:
    seed = operator.index(seed)  # Accepts NumPy integers from vectorised rollouts.
  except TypeError:
    raise ValueError(f"{label}: seed must be a non-negative int, got {seed!r}") from None
  if seed < 0:
    raise ValueError(f"{label}: seed must be a non-negative int, got {seed!r}")
  return seed


def parse_action(action: Any, action_words: tuple[str, ...], *,
                 free_text: bool = False) -> str | None:
  """Returns the action word `action` names, or None when it names none (or, free, several).

  Matching ignores case and surrounding whitespace, so "  Left\n" is "left". With `free_text`
  (a pretrained chat model's replies) a reply also counts when exactly one of its words is an
  action word: "I move right." is "right", while "left or right", "up up" and "jump" name several
  or none. Off by default: a policy trained on the env's own framing answers with the word, and
  the shipped tokenizer was trained on the feedback of exactly that rule.
  """
  if not isinstance(action, str):
    return None
  word = action.strip().lower()
  if word in action_words:
    return word
  if not free_text or len(action) > _MAX_FREE_TEXT_ACTION_CHARS:
    return None
  named = [w for w in _WORD.findall(word) if w in action_words]
  return named[0] if len(named) == 1 else None


def invalid_action_message(action: Any, action_words: tuple[str, ...]) -> str:
  """One short line naming what was wrong with `action` and listing the valid actions.

  Example: "invalid action 'jump': use left, down, right or up".
  """
  valid = _or_list(action_words)
  if not isinstance(action, str):
    return f"invalid action of type {type(action).__name__}: use {valid}"
  text = action.strip()
  if not text:
    return f"empty action: use {valid}"
  if len(text) > _MAX_QUOTED_ACTION_CHARS:
    text = text[:_MAX_QUOTED_ACTION_CHARS] + "..."
  # Collapse newlines so the feedback stays one line above the board.
  text = " ".join(text.split())
  return f"invalid action '{text}': use {valid}"


def text_action_problem(action: Any, max_chars: int) -> str | None:
  """What makes `action` unusable as free text (not a string, empty, too long), or None.

  The checks every free-text env starts with; each env then parses the text its own way. The
  wording is part of the shipped tokenizer's corpus (experiments/build_tokenizer.py plays the
  envs with malformed actions), so changing it means rebuilding the tokenizer.
  """
  if not isinstance(action, str):
    return f"action of type {type(action).__name__}"
  text = action.strip()
  if not text:
    return "empty action"
  if len(text) > max_chars:
    return f"action of {len(text)} characters is longer than {max_chars}"
  return None


def quote_action(text: Any, max_chars: int) -> str:
  """`text` on one line, cut to `max_chars` characters with "..." when longer (for feedback)."""
  text = " ".join(str(text).split())
  return text if len(text) <= max_chars else text[:max_chars] + "..."


def _or_list(words: tuple[str, ...]) -> str:
  if len(words) == 1:
    return words[0]
  return ", ".join(words[:-1]) + " or " + words[-1]


# A leading "Step 3 of 10." / "step 3/10:" counter. Only the word "step" is stripped: envs whose
# state *is* the time index (DD-Chain's "turn 3 of 16") must keep it in the fingerprint.
_STEP_COUNTER = re.compile(r"^step\s*\d+\s*(?:of|/)\s*\d+\s*[.:,;]?\s*")


def normalize_observation(text: str) -> str:
  """Lowercases, collapses whitespace and drops a leading step counter."""
  text = " ".join(text.lower().split())
  return _STEP_COUNTER.sub("", text)


def observation_hash(text: str) -> int:
  """Stable int32 fingerprint of an observation, equal for equal normalised text.

  Uses CRC-32 rather than `hash()`, which is salted per process: hashes must agree across rollout
  workers and hosts. Two observations that differ only in case, whitespace or a leading
  "Step k of n." counter get the same hash.

  Args:
    text: observation text.

  Returns:
    A Python int in [-2**31, 2**31).
  """
  value = zlib.crc32(normalize_observation(text).encode("utf-8"))
  return value - (1 << 32) if value >= (1 << 31) else value
