"""TextWorld games (Microsoft TextWorld), generated offline from a seed, as a text env.

The engine is the `textworld` package (its game generator and Inform 7 compiler run locally); it
is an optional dependency (the `envs` extra) and is imported only when an env is built, so
`import agentrl_jax.envs` works without it. The module is not called `textworld.py` so it does not
shadow that package.

A game is one of TextWorld's challenge generators (`tw-coin_collector`, `tw-treasure_hunter`,
`tw-cooking`, ...) with its settings (e.g. `{"level": 5}`) and the reset seed. Compiling a game
takes seconds, so compiled games are cached under `cache_dir` (default
`~/.cache/agentrl_jax/textworld`, or `$AGENTRL_TEXTWORLD_CACHE`), one file per challenge +
settings + seed; a later reset with the same key only loads the file.

Reward is the change of the engine's score, success is the engine's `won`, and the expert plays
the engine's `policy_commands` (the optimal remaining commands from the current state).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import re
import tempfile
from typing import Any
import warnings

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

DEFAULT_CACHE_DIR = "~/.cache/agentrl_jax/textworld"
CACHE_ENV_VAR = "AGENTRL_TEXTWORLD_CACHE"
MAX_ACTION_CHARS = 200
_QUOTE_CHARS = 16
_LOOK = "look"
# The engine's end-of-game trailer and banner lines carry no information for the policy.
_END_MARKER = "*** The End ***"
# Interpreter meta-commands that would quit, restart or rewind the game behind the env's back.
META_COMMANDS = ("quit", "q", "restart", "restore", "save", "undo", "script", "unscript",
                 "transcript")
_ART_LINE = re.compile(r"^[\s$\\|_/<>()*\-=~^]*$")


def _textworld():
  try:
    import textworld  # pylint: disable=g-import-not-at-top
    import textworld.challenges  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("the 'textworld' env needs the textworld package: "
                      "pip install 'agentrl_jax[envs]'") from e
  return textworld


def clean_feedback(text: str) -> str:
  """Drops the engine's ASCII-art banner, prompts, blank runs and end-of-game trailer."""
  if _END_MARKER in text:
    text = text[: text.index(_END_MARKER)]
  lines = []
  for line in text.splitlines():
    line = line.strip()
    if line.startswith(">"):
      line = line[1:].strip()
    if not line or _ART_LINE.match(line) or "$$" in line:
      continue
    lines.append(line)
  return "\n".join(lines)


@registry.register("textworld", requires=(registry.Requirement(module="textworld"),))
class TextWorld(base.TextEnv):
  """One generated TextWorld game per episode.

  Info every step: `action_valid` (the command was admissible), `score`. Final step: `success`
  (the game is won), `sub_outcomes = {"score_fraction": score / max score}`.
  """

  def __init__(self, challenge: str = "tw-cooking",
               settings: dict[str, Any] | None = None, max_turns: int = 30,
               cache_dir: str | None = None, show_admissible: bool = False,
               num_games: int | None = None):
    """Builds the env (games are generated lazily, on reset).

    Args:
      challenge: a TextWorld challenge name (see `textworld.challenges.CHALLENGES`).
      settings: the challenge's settings; None = `{"level": 1}` for the level-based challenges
        and a one-ingredient, one-room, open-the-fridge recipe for `tw-cooking`. For
        `tw-cooking` without a `recipe_seed`, the recipe is drawn by the reset seed too.
      max_turns: step cap, >= 1.
      cache_dir: where compiled games are kept; None = `$AGENTRL_TEXTWORLD_CACHE` or
        `~/.cache/agentrl_jax/textworld`.
      show_admissible: list the admissible commands in every observation.
      num_games: None = every reset seed is its own game; an int N = the seed plays game
        `seed % N`, a fixed pool of N games. Compiling takes seconds a game, so a training run
        that draws a fresh seed every episode needs the pool; held-out evaluation then sets
        `EvalConfig.env_kwargs = {'num_games': None}` so its seeds are games never trained on.
    """
    if not isinstance(challenge, str) or not challenge.startswith("tw-"):
      raise ValueError(f"challenge must be a TextWorld challenge name like 'tw-cooking', "
                       f"got {challenge!r}")
    if settings is not None and not isinstance(settings, dict):
      raise ValueError(f"settings must be a dict or None, got {settings!r}")
    if num_games is not None and not (base.is_int(num_games) and num_games >= 1):
      raise ValueError(f"num_games must be None or an int >= 1, got {num_games!r}")
    super().__init__(max_turns=max_turns)
    self.num_games = None if num_games is None else int(num_games)
    self.challenge = challenge
    self.settings = dict(settings) if settings is not None else _default_settings(challenge)
    self.cache_dir = pathlib.Path(
        cache_dir or os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_DIR).expanduser()
    self.show_admissible = bool(show_admissible)
    self._env = None
    self._game_path: pathlib.Path | None = None
    self._state = None
    self._score = 0

  @property
  def admissible_commands(self) -> list[str]:
    """The engine's admissible commands in the current state."""
    return list(self._state["admissible_commands"] or [])

  @property
  def has_random_actions(self) -> bool:
    return True  # the engine lists the admissible commands of every state

  def random_action(self, rng: np.random.Generator) -> str | None:
    """A uniformly random admissible command (in name order, so a generator state draws the
    same command in every process). The expert plans from the current state
    (`policy_commands`), so it recovers from wherever the command leads."""
    commands = sorted(self.admissible_commands)
    return str(rng.choice(commands)) if commands else None

  def close(self) -> None:
    """Closes the engine of the current game."""
    if self._env is not None:
      self._env.close()
      self._env = None
      self._game_path = None

  def game_path(self, seed: int) -> pathlib.Path:
    """Where the compiled game of `seed` is cached (keyed by challenge, settings and seed)."""
    key = json.dumps({"challenge": self.challenge, "settings": self.settings, "seed": seed},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return self.cache_dir / f"{self.challenge}-s{seed}-{digest}.z8"

  def game_file(self, seed: int) -> pathlib.Path:
    """The compiled game for `seed`, generated (and cached) on first use."""
    path = self.game_path(seed)
    if not path.exists():
      self._generate(seed, path)
    return path

  def expert_action(self) -> str:
    """The first of the engine's optimal remaining commands ("look" when none is left)."""
    commands = self._state["policy_commands"] or []
    return commands[0] if commands else _LOOK

  def _generate(self, seed: int, path: pathlib.Path) -> None:
    textworld = _textworld()
    if self.challenge not in textworld.challenges.CHALLENGES:
      raise ValueError(f"unknown TextWorld challenge {self.challenge!r}; known: "
                       f"{sorted(textworld.challenges.CHALLENGES)}")
    make = textworld.challenges.CHALLENGES[self.challenge][1]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Compiled into a private folder and renamed into place, so concurrent resets of the same
    # seed (rollout workers) never load a half-written file.
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
      options = textworld.GameOptions()
      options.seeds = seed
      options.path = os.path.join(tmp, path.name)
      options.force_recompile = True
      with _quiet_jericho():
        game = make(self._settings_for(seed), options)
        compiled = pathlib.Path(textworld.generator.compile_game(game, options))
      # The game's metadata (walkthrough, policy) sits in a .json beside the story file; it moves
      # first because the story file's presence is what marks the cache entry complete.
      os.replace(compiled.with_suffix(".json"), path.with_suffix(".json"))
      os.replace(compiled, path)

  def _settings_for(self, seed: int) -> dict[str, Any]:
    settings = dict(self.settings)
    if self.challenge == "tw-cooking" and "recipe_seed" not in settings:
      settings["recipe_seed"] = seed
    return settings

  def game_of(self, seed: int) -> int:
    """The game a reset seed plays: itself, or its place in the pool of `num_games`."""
    return seed if self.num_games is None else seed % self.num_games

  def _reset(self, seed: int) -> str:
    textworld = _textworld()
    path = self.game_file(self.game_of(seed))
    if self._env is None or self._game_path != path:
      self.close()
      infos = textworld.EnvInfos(admissible_commands=True, policy_commands=True, score=True,
                                 max_score=True, won=True, lost=True, description=True,
                                 objective=True)
      self._env = textworld.start(str(path), request_infos=infos)
      self._game_path = path
    with _quiet_jericho():
      self._state = self._env.reset()
    self._score = self._state["score"] or 0
    first = f"{self._state['objective'].strip()}\n{clean_feedback(self._state['description'])}"
    return self._render(first)

  def _step(self, action: Any) -> base.StepResult:
    problem = _malformed_reason(action)
    if problem is not None:
      observation = f"invalid action: {problem}; type a command such as '{_LOOK}'"
      return base.StepResult(self._render(observation), 0.0, False,
                             {"action_valid": False, "score": self._score})
    command = " ".join(action.split()).lower()
    valid = command in {c.lower() for c in self.admissible_commands}
    with _quiet_jericho():
      self._state, _, done = self._env.step(command)
    score = self._state["score"] or 0
    reward, self._score = float(score - self._score), score
    observation = clean_feedback(self._state.feedback) or "nothing happens"
    if not valid:
      observation = f"invalid action '{_quote(command)}': {observation}"
    info: dict[str, Any] = {"action_valid": valid, "score": score}
    if done:
      info["success"] = bool(self._state["won"])
      info["sub_outcomes"] = {"score_fraction": self._score_fraction()}
      return base.StepResult(observation, reward, True, info)
    return base.StepResult(self._render(observation), reward, False, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False,
                sub_outcomes={"score_fraction": self._score_fraction()})
    return result._replace(done=True, info=info)

  def _score_fraction(self) -> float:
    max_score = self._state["max_score"] or 0
    return float(self._score) / max_score if max_score else 0.0

  def _render(self, text: str) -> str:
    if self.show_admissible:
      text += "\nadmissible: " + ", ".join(sorted(self.admissible_commands))
    return text


@contextlib.contextmanager
def _quiet_jericho():
  # jericho (the Z-machine interpreter under TextWorld) warns on every generated game that it has
  # no hand-written score and valid-action tables for it; TextWorld supplies both itself.
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", module="jericho")
    yield


def _default_settings(challenge: str) -> dict[str, Any]:
  if challenge == "tw-cooking":
    return {"recipe": 1, "take": 1, "go": 1, "open": True, "cook": False, "cut": False,
            "drop": False, "split": "train"}
  return {"level": 1}


def _malformed_reason(action: Any) -> str | None:
  problem = base.text_action_problem(action, MAX_ACTION_CHARS)
  if problem:
    return problem
  text = action.strip()
  if not text.isprintable() and "\n" not in text:
    return "action has control characters"
  if "\n" in text:
    return "one command per turn (no newlines)"
  # The Z-machine interpreter under TextWorld reads a line that starts with a backslash as one of
  # its own settings, and an unknown one makes it re-read that line forever (the step never
  # returns); no game command has a backslash, so none reaches the engine.
  if "\\" in text:
    return "no backslashes (the interpreter would take the line as its own setting)"
  if text.split()[0].lower() in META_COMMANDS:
    return f"'{text.split()[0].lower()}' is not allowed"
  return None


def _quote(text: str) -> str:
  return base.quote_action(text, _QUOTE_CHARS)
