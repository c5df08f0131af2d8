"""TextWorld-Express games (CoinCollector, CookingWorld, TextWorld-CommonSense) as a text env.

The engine is the `textworld-express` package (a Java simulator driven over py4j; it needs a Java
runtime). It is an optional dependency (the `envs` extra) and is imported only when an env is
built, so `import agentrl_jax.envs` works without it.

The reset seed picks one of the engine's valid seeds of the chosen fold (`seed % number of
seeds`), so every non-negative seed is a game and the same seed is the same game. Reward is the
change of the engine's normalised score (0 to 1), success is the engine's task success, and the
expert's path (CoinCollector: fewest moves to the coin, from the agent's room; the others: the
engine's gold action sequence) is planned when the expert is first asked.

Every env of a Python process shares one engine (one JVM): the learner builds a fresh env per
episode slot each iteration, and a JVM per env would mean hundreds of processes. The engine holds
one game state at a time, so an env whose episode is not the engine's current one restores it by
replaying its seed and commands (a reset or a step takes about a millisecond); games are
deterministic, so the replay reproduces the state exactly.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

# Names the engine knows, with friendlier aliases.
GAMES = {"coin": "coin", "coin_collector": "coin", "cookingworld": "cookingworld",
         "cooking": "cookingworld", "twc": "twc", "commonsense": "twc"}
FOLDS = ("train", "dev", "test")
# Default parameters keep the games small enough for a tiny agent's context window.
DEFAULT_PARAMS = {
    "coin": "numLocations=3,numDistractorItems=0,includeDoors=0",
    "cookingworld": "numLocations=1,numIngredients=2,numDistractorItems=0,includeDoors=0,"
                    "limitInventorySize=0",
    "twc": "numLocations=1,numItemsToPutAway=2,includeDoors=0,limitInventorySize=0",
}
MAX_ACTION_CHARS = 200
_QUOTE_CHARS = 16
_LOOK = "look around"
_TAKE_COIN = "take coin"
_MOVE = "move "
_ROOM = re.compile(r"You are in the ([^.]+)\.")
# The shared engine's own step limit; far above any env's step cap, which governs episodes.
_ENGINE_STEP_LIMIT = 100_000
# CoinCollector's furniture sentences (`brief` drops them unless they name the coin).
_FURNITURE_LEADS = ("In one part of the room you see", "In another part of the room you see",
                    "There is also", "You also see")
_SENTENCE_END = re.compile(r"(?<=\.)\s+")


def _engine_class():
  try:
    from textworld_express import TextWorldExpressEnv  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "the 'textworld_express' env needs the textworld-express package and a Java runtime: "
        "pip install 'agentrl_jax[envs]'") from e
  return TextWorldExpressEnv


class _SharedEngine:
  """The process's one engine and which episode its state currently belongs to."""

  def __init__(self):
    self.lock = threading.Lock()
    self.engine = None
    self.loaded: tuple[str, str] | None = None  # (game, params) of the loaded game generator.
    self.owner: object | None = None  # The episode token whose state the engine holds.
    self.seeds: dict[tuple[str, str, str], list[int]] = {}
    self.gold: dict[tuple[str, str, str, int], list[str]] = {}
    self.houses: dict[tuple[str, str, int], _House] = {}

  def get(self, game: str, params: str):
    if self.engine is None:
      self.engine = _engine_class()(envStepLimit=_ENGINE_STEP_LIMIT)
    if self.loaded != (game, params):
      self.engine.load(gameName=game, gameParams=params)
      self.loaded, self.owner = (game, params), None
    return self.engine

  def fold_seeds(self, game: str, params: str, fold: str) -> list[int]:
    key = (game, params, fold)
    if key not in self.seeds:
      engine = self.get(game, params)
      getter = {"train": engine.getValidSeedsTrain, "dev": engine.getValidSeedsDev,
                "test": engine.getValidSeedsTest}[fold]
      self.seeds[key] = list(getter())
    return self.seeds[key]

  def gold_path(self, game: str, params: str, fold: str, game_seed: int) -> list[str]:
    """The expert's commands for one game, planned once per process. Call with `lock` held.

    CoinCollector's own gold path is a random exploration whose generator state carries over
    from the engine's earlier games (reloading the game generator does not restart it): train
    seed 4 of 6 rooms got "west, south, west" or "west, west, south" depending on the games
    played before, so with rollout threads a seed's demonstrations, and its clone, changed from
    run to run. Its expert is therefore a breadth-first search of the rooms (a fewest-moves path,
    ties broken by command name); the other games keep the engine's planned path.
    """
    key = (game, params, fold, game_seed)
    if key not in self.gold:
      engine = self.get(game, params)
      if game == "coin":
        self.gold[key] = _fewest_moves_to_the_coin(engine, game_seed, fold)
      else:
        engine.reset(seed=game_seed, gameFold=fold, generateGoldPath=True)
        gold = list(engine.getGoldActionSequence())
        # The gold path opens with the "look around" that produced the first observation.
        self.gold[key] = gold[1:] if gold and gold[0] == _LOOK else gold
      self.owner = None  # Planning moved the engine: the next step replays its episode.
    return self.gold[key]

  def house(self, params: str, fold: str, game_seed: int) -> _House:
    """A CoinCollector game's rooms and moves, mapped once per process. Call with `lock` held."""
    key = (params, fold, game_seed)
    if key not in self.houses:
      self.houses[key] = _map_the_house(self.get("coin", params), game_seed, fold)
      self.owner = None  # Mapping moved the engine: the next step replays its episode.
    return self.houses[key]

  def shutdown(self) -> None:
    with self.lock:
      if self.engine is not None:
        self.engine.close()
      self.engine, self.loaded, self.owner = None, None, None


_SHARED = _SharedEngine()


def shutdown_engine() -> None:
  """Stops the shared Java engine (the next reset starts a new one; it also dies with Python)."""
  _SHARED.shutdown()


def forget_expert_plans() -> None:
  """Drops the process's planned expert paths: each game's is planned again when next asked,
  after whatever games the engine has played since (what repeatability checks compare)."""
  with _SHARED.lock:
    _SHARED.gold.clear()
    _SHARED.houses.clear()


def _params_text(params: str | dict[str, Any] | None, game: str) -> str:
  if params is None:
    return DEFAULT_PARAMS[game]
  if isinstance(params, dict):
    items = sorted(params.items())
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in items)
  if isinstance(params, str):
    return params
  raise ValueError(f"game_params must be a str, a dict or None, got {params!r}")


@registry.register("textworld_express", requires=(
    registry.Requirement(module="textworld_express"),
    registry.Requirement(program="java", install="install a Java runtime (apt-get install "
                         "default-jre-headless)")))
class TextWorldExpress(base.TextEnv):
  """One TextWorld-Express game per episode.

  Info every step: `action_valid` (the command was in the engine's valid-action list), `score`.
  Final step: `success`, `sub_outcomes = {"score": final normalised score}`.
  """

  def __init__(self, game: str = "coin", game_params: str | dict[str, Any] | None = None,
               fold: str = "train", max_turns: int = 20, show_valid_actions: bool = False,
               brief: bool = False):
    """Builds the env (the shared Java engine starts lazily, on the first reset).

    Args:
      game: "coin" (CoinCollector), "cookingworld" or "twc" (TextWorld-CommonSense); aliases
        "coin_collector", "cooking", "commonsense".
      game_params: engine parameters, as "k=v,k=v" or a dict; None = small defaults.
      fold: "train", "dev" or "test" seeds of the engine.
      max_turns: step cap, >= 1.
      show_valid_actions: list the valid commands in every observation.
      brief: CoinCollector only: drop the room's furniture sentences that do not name the coin,
        keeping where the agent is, the coin and the exits. Its furniture is never part of
        the task, and it is most of every observation (~300 of ~330 tokens in the kitchen with
        the shipped tokenizer), which a tiny policy pays for at every turn.
    """
    if game not in GAMES:
      raise ValueError(f"game must be one of {sorted(GAMES)}, got {game!r}")
    if fold not in FOLDS:
      raise ValueError(f"fold must be one of {FOLDS}, got {fold!r}")
    if brief and GAMES[game] != "coin":
      raise ValueError(f"brief=True applies to the coin game only, got game={game!r}")
    super().__init__(max_turns=max_turns)
    self.game = GAMES[game]
    self.brief = bool(brief)
    self.game_params = _params_text(game_params, self.game)
    self.fold = fold
    self.show_valid_actions = bool(show_valid_actions)
    self._game_seed = 0
    self._history: list[str] = []  # Commands sent to the engine this episode.
    self._token: object | None = None  # Identifies this episode to the shared engine.
    self._gold: list[str] | None = None  # Planned when the expert is first asked.
    self._taken: list[str] = []  # The valid commands of this episode, as the engine names them.
    self._valid: list[str] = []
    self._room = ""  # CoinCollector: the room the agent is in (for the expert off its path).
    self._score = 0.0
    self._expert_step = 0

  @property
  def valid_actions(self) -> list[str]:
    """The engine's valid commands in the current state."""
    return list(self._valid)

  def close(self) -> None:
    """Releases the shared engine (which keeps running, see `shutdown_engine`)."""
    with _SHARED.lock:
      if _SHARED.owner is self._token:
        _SHARED.owner = None

  @property
  def has_random_actions(self) -> bool:
    return True  # the engine lists the valid commands of every state

  def random_action(self, rng: np.random.Generator) -> str | None:
    """A uniformly random one of the engine's valid commands (in name order, so a generator
    state draws the same command in every process)."""
    return str(rng.choice(sorted(self._valid))) if self._valid else None

  def expert_action(self) -> str:
    """The expert's next command.

    CoinCollector: the fewest moves to the coin from the room the agent is in. While the
    episode follows the path planned from the reset (as expert rollouts do) that path is kept;
    once a move leaves it (a noisy demonstration, a policy's episode taken over), the path is
    found again from the current room over the game's map of rooms. The other games: the next
    command of the engine's gold path ("look around" once it is used up), which is the expert's
    only while the episode follows it.
    """
    if self.game == "coin":
      return self._coin_expert()
    if self._gold is None:
      with _SHARED.lock:
        self._gold = _SHARED.gold_path(self.game, self.game_params, self.fold, self._game_seed)
      for command in self._taken:
        self._follow(command)
    if self._expert_step < len(self._gold):
      return self._gold[self._expert_step]
    return _LOOK

  def _coin_expert(self) -> str:
    with _SHARED.lock:
      gold = _SHARED.gold_path(self.game, self.game_params, self.fold, self._game_seed)
    # Only moves change the room: the other valid commands leave the agent on the path.
    moves = [c for c in self._taken if c.startswith(_MOVE)]
    if moves == gold[:len(moves)]:
      return gold[len(moves)]
    if _TAKE_COIN in self._valid:
      return _TAKE_COIN
    with _SHARED.lock:
      house = _SHARED.house(self.game_params, self.fold, self._game_seed)
    return house.next_move(self._room)

  def _reset(self, seed: int) -> str:
    with _SHARED.lock:
      seeds = _SHARED.fold_seeds(self.game, self.game_params, self.fold)
      self._game_seed = seeds[seed % len(seeds)]
      engine = _SHARED.get(self.game, self.game_params)
      observation, infos = engine.reset(seed=self._game_seed, gameFold=self.fold,
                                        generateGoldPath=False)
      self._token = _SHARED.owner = object()
    self._history = []
    self._gold = None
    self._taken = []
    self._expert_step = 0
    self._valid = list(infos["validActions"])
    self._room = _room_of(infos["look"])
    self._score = float(infos["score"])
    return self._render(f"{infos['taskDescription'].strip()}\n{observation.strip()}")

  def _follow(self, command: str) -> None:
    """Advances the expert past `command` when it is the gold path's next one."""
    if self._expert_step < len(self._gold) and command == self._gold[self._expert_step]:
      self._expert_step += 1

  def _engine_step(self, command: str):
    with _SHARED.lock:
      engine = _SHARED.get(self.game, self.game_params)
      if _SHARED.owner is not self._token:
        engine.reset(seed=self._game_seed, gameFold=self.fold, generateGoldPath=False)
        for previous in self._history:
          engine.step(previous)
        _SHARED.owner = self._token
      result = engine.step(command)
    self._history.append(command)
    return result

  def _step(self, action: Any) -> base.StepResult:
    problem = _malformed_reason(action)
    if problem is not None:
      observation = f"invalid action: {problem}; type a command such as '{_LOOK}'"
      return base.StepResult(self._render(observation), 0.0, False,
                             {"action_valid": False, "score": self._score})
    command = " ".join(action.split())
    canonical = {a.lower(): a for a in self._valid}.get(command.lower())
    valid = canonical is not None
    if valid:
      self._taken.append(canonical)
      if self._gold is not None:
        self._follow(canonical)
    observation, _, done, infos = self._engine_step(canonical or command)
    score = float(infos["score"])
    reward, self._score = score - self._score, score
    self._valid = list(infos["validActions"])
    self._room = _room_of(infos["look"])
    info: dict[str, Any] = {"action_valid": valid, "score": score}
    observation = observation.strip()
    if not valid:
      observation = f"invalid action '{_quote(command)}': {observation}"
    if done or infos["tasksuccess"] or infos["taskfailure"]:
      info["success"] = bool(infos["tasksuccess"])
      info["sub_outcomes"] = {"score": score}
      return base.StepResult(observation, reward, True, info)
    return base.StepResult(self._render(observation), reward, False, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False, sub_outcomes={"score": self._score})
    return result._replace(done=True, info=info)

  def _render(self, text: str) -> str:
    if self.brief:
      text = _without_furniture(text)
    if self.show_valid_actions:
      text += "\nvalid actions: " + ", ".join(sorted(self._valid))
    return text


def _without_furniture(text: str) -> str:
  """`text` without the sentences that describe furniture and do not mention the coin."""
  lines = []
  for line in text.split("\n"):
    kept = [s for s in _SENTENCE_END.split(line.strip())
            if "coin" in s or not s.startswith(_FURNITURE_LEADS)]
    lines.append(" ".join(kept))
  return "\n".join(lines)


def _replay(engine, game_seed: int, fold: str, path) -> dict[str, Any]:
  """The engine's infos after `path` from the reset of game `game_seed` (the engine cannot copy
  a state, so a searched state is reached again from the start)."""
  infos = engine.reset(seed=game_seed, gameFold=fold, generateGoldPath=False)[1]
  for action in path:
    infos = engine.step(action)[3]
  return infos


def _room_of(look: str) -> str:
  """The room's name from the engine's "look" text ("You are in the kitchen. ..."); the whole
  text where it does not say."""
  found = _ROOM.match(look)
  return found.group(1) if found else look


class _House:
  """A CoinCollector game's map: each room's moves and where they lead, and the coin's rooms."""

  def __init__(self, moves: dict[str, dict[str, str]], coin_rooms: set[str]):
    self.moves = moves
    self.coin_rooms = coin_rooms

  def next_move(self, room: str) -> str:
    """The first move of a fewest-moves path from `room` to a room where the coin lies
    (breadth-first, moves in name order); "take coin" in such a room, "look around" from a room
    the map does not know or with no way to the coin."""
    if room in self.coin_rooms:
      return _TAKE_COIN
    first = {room: None}
    frontier = [room]
    while frontier:
      following = []
      for here in frontier:
        for move, there in sorted(self.moves.get(here, {}).items()):
          if there in first:
            continue
          first[there] = first[here] or move
          if there in self.coin_rooms:
            return first[there]
          following.append(there)
      frontier = following
    return _LOOK


def _map_the_house(engine, game_seed: int, fold: str) -> _House:
  """Every room reachable from the start and where each of its moves leads, by replaying a path
  to the room and then each move (the engine cannot copy a state): rooms x (1 + moves) replays,
  about 20 for 6 rooms."""
  replay = functools.partial(_replay, engine, game_seed, fold)
  start = _room_of(replay([])["look"])
  paths = {start: []}  # A way to each room found so far.
  moves: dict[str, dict[str, str]] = {}
  coin_rooms: set[str] = set()
  frontier = [start]
  while frontier:
    following = []
    for room in frontier:
      valid = replay(paths[room])["validActions"]
      if _TAKE_COIN in valid:
        coin_rooms.add(room)
      moves[room] = {}
      for move in sorted(a for a in valid if a.startswith(_MOVE)):
        there = _room_of(replay([*paths[room], move])["look"])
        moves[room][move] = there
        if there not in paths:
          paths[there] = [*paths[room], move]
          following.append(there)
    frontier = following
  return _House(moves, coin_rooms)


def _fewest_moves_to_the_coin(engine, game_seed: int, fold: str) -> list[str]:
  """Breadth-first search over the rooms (the room text is the state; each path is replayed
  from the reset, as the engine cannot copy a state): the moves to the nearest room where
  "take coin" is valid, then "take coin". Moves are tried in name order, so ties break the same
  way in every process."""
  replay = functools.partial(_replay, engine, game_seed, fold)
  frontier, seen = [[]], set()
  while frontier:
    following = []
    for path in frontier:
      infos = replay(path)
      if _TAKE_COIN in infos["validActions"]:
        return [*path, _TAKE_COIN]
      if infos["look"] in seen:
        continue
      seen.add(infos["look"])
      following += [[*path, a] for a in sorted(infos["validActions"]) if a.startswith(_MOVE)]
    frontier = following
  raise RuntimeError(f"CoinCollector game {game_seed} ({fold}): no room holds a coin to take")


def _malformed_reason(action: Any) -> str | None:
  return base.text_action_problem(action, MAX_ACTION_CHARS)


def _quote(text: str) -> str:
  return base.quote_action(text, _QUOTE_CHARS)
