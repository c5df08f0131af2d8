"""FrozenLake as a compact text grid world.

The board is drawn one letter per cell, cells separated by spaces, one row per line:

    P F F F
    F H F H
    F F F H
    H F F G

P = player, F = frozen (safe), H = hole (episode ends, failure), G = goal (reward 1, success).
The format is chosen for a tiny policy with a short context: with the shipped tokenizer every cell
costs one token (the letter with its leading space) and every row break one more.

The first observation is one instruction line and the board; every later one is a short feedback
line ("moved right", "hit wall", "slipped up", "invalid action 'jump': use ...") and the board.

With `describe_moves=True` every observation ends with one more line that says, in words, where
each move leads: "left: wall, down: ice, right: hole, up: wall". A small pretrained chat model
does not read a letter grid in two dimensions (SmolLM2-135M answers the same move on every board);
the line states the one-step consequences the grid implies, and nothing the grid does not hold.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

ACTIONS = ("left", "down", "right", "up")
INSTRUCTION = "reach G, avoid H. moves: " + " ".join(ACTIONS)

_DELTAS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_PERPENDICULAR = {
    "left": ("down", "up"),
    "right": ("down", "up"),
    "down": ("left", "right"),
    "up": ("left", "right"),
}
# Rejection sampling normally accepts within a few draws; the cap only turns a near-impossible
# config (hole_prob close to 1) into an error instead of a hang.
_MAX_MAP_ATTEMPTS = 10_000


@registry.register("frozenlake")
class FrozenLake(base.TextEnv):
  """Grid world: walk from the top-left start to the bottom-right goal without falling in a hole.

  The map is drawn by `reset(seed)`: each cell other than start and goal is a hole with
  probability `hole_prob`, redrawn until the shortest path is at most `max_turns` moves, so every
  episode is solvable within the step cap. The same Generator then draws the slips, so an episode
  is a deterministic function of the seed and the action sequence.

  Rewards: 1 on reaching the goal, else 0. The episode ends at the goal, in a hole, or after
  `max_turns` steps (invalid actions count as steps).
  """

  action_words = ACTIONS

  def __init__(self, size: int = 4, hole_prob: float = 0.2, max_turns: int = 10,
               slippery: float = 0.0, free_text_actions: bool = False,
               describe_moves: bool = False, report_potential: bool = False):
    """Builds the env; the map itself is drawn at `reset`.

    Args:
      size: side of the square board, >= 2.
      hole_prob: probability that a cell other than start and goal is a hole, in [0, 1).
      max_turns: step cap, at least the 2*(size-1) moves of the shortest possible path.
      slippery: probability that a move goes in a random perpendicular direction, in [0, 1].
      free_text_actions: also accept a reply that names exactly one move ("I move right."), for
        a pretrained chat policy (`base.parse_action`).
      describe_moves: end every observation with a line naming what each move reaches (wall,
        ice, hole or goal), see the module docstring.
      report_potential: put the progress potential of the cell before and after each step in
        the step's info (`potential`), for `rewards.potential.potential_based_shaping`.
    """
    if not base.is_int(size) or size < 2:
      raise ValueError(f"size must be an int >= 2, got {size!r}")
    if not base.is_number(hole_prob) or not 0.0 <= hole_prob < 1.0:
      raise ValueError(f"hole_prob must be a number in [0, 1), got {hole_prob!r}")
    if not base.is_number(slippery) or not 0.0 <= slippery <= 1.0:
      raise ValueError(f"slippery must be a number in [0, 1], got {slippery!r}")
    super().__init__(max_turns)
    if max_turns < 2 * (size - 1):
      raise ValueError(
          f"max_turns={max_turns} is below the {2 * (size - 1)} moves any path on a "
          f"size={size} board needs")
    self.size = size
    self.hole_prob = float(hole_prob)
    self.slippery = float(slippery)
    self.free_text_actions = bool(free_text_actions)
    self.describe_moves = bool(describe_moves)
    self.report_potential = bool(report_potential)
    self._holes = np.zeros((size, size), dtype=bool)
    self._pos = (0, 0)
    self._rng = np.random.default_rng(0)

  @property
  def instructions(self) -> str:
    """The rules and the reply format, for a chat model's system message."""
    n = self.size
    moves = (" The last line says where each move leads." if self.describe_moves else "")
    return (f"You play FrozenLake on a {n}x{n} grid shown one row per line: P is you, F is safe "
            "ice, H is a hole, G is the goal. You start at the top left; the goal is at the "
            f"bottom right.{moves} Each turn, move one cell toward G without stepping on H. Reply "
            "with one word: left, down, right or up.")

  @property
  def goal(self) -> tuple[int, int]:
    """The goal's (row, column): the bottom-right corner."""
    return (self.size - 1, self.size - 1)

  @property
  def position(self) -> tuple[int, int]:
    """The player's (row, column)."""
    return self._pos

  @property
  def holes(self) -> np.ndarray:
    """Bool [size, size] hole map of the current episode (a copy)."""
    return self._holes.copy()

  @property
  def shortest_path_length(self) -> int | None:
    """Moves from the player's position to the goal ignoring slips; None when unreachable."""
    distance = int(_distances_to(self._holes, self.goal)[self._pos])
    return None if distance < 0 else distance

  def board_text(self) -> str:
    """The board, one letter per cell: P player, F frozen, H hole, G goal."""
    rows = []
    for r in range(self.size):
      cells = []
      for c in range(self.size):
        if (r, c) == self._pos:
          cells.append("P")
        elif (r, c) == self.goal:
          cells.append("G")
        else:
          cells.append("H" if self._holes[r, c] else "F")
      rows.append(" ".join(cells))
    return "\n".join(rows)

  def moves_text(self) -> str:
    """Where each move leads from the player's cell: "left: wall, down: ice, right: hole, ..."."""
    parts = []
    for word in ACTIONS:
      target = self._target(self._pos, word)
      if target == self._pos:
        what = "wall"
      elif target == self.goal:
        what = "goal"
      else:
        what = "hole" if self._holes[target] else "ice"
      parts.append(f"{word}: {what}")
    return ", ".join(parts)

  def _view(self) -> str:
    """The board, and the moves line when `describe_moves` is set."""
    board = self.board_text()
    return f"{board}\n{self.moves_text()}" if self.describe_moves else board

  def expert_action(self) -> str:
    """A move along a shortest path to the goal (slips ignored)."""
    distances = _distances_to(self._holes, self.goal)
    here = distances[self._pos]
    for word in ACTIONS:
      nxt = self._target(self._pos, word)
      if nxt != self._pos and distances[nxt] >= 0 and (here < 0 or distances[nxt] < here):
        return word
    return ACTIONS[0]  # At the goal or cut off: any move is as good as another.

  def _reset(self, seed: int) -> str:
    self._rng = np.random.default_rng(seed)
    self._holes = _sample_holes(self._rng, self.size, self.hole_prob, self.max_turns)
    self._pos = (0, 0)
    return f"{INSTRUCTION}\n{self._view()}"

  def potential(self) -> float:
    """Progress potential of the player's cell: minus the moves left to the goal over size², so
    in (−1, 0]; −1 in a hole or where the goal cannot be reached (worse than any open cell).
    With `report_potential`, every step's info holds it before and after the step."""
    distance = self.shortest_path_length
    if self._holes[self._pos] or distance is None:
      return -1.0
    return -distance / self.size ** 2

  def _step(self, action: Any) -> base.StepResult:
    if not self.report_potential:
      return self._move(action)
    before = self.potential()
    result = self._move(action)
    info = dict(result.info, potential_before=before, potential=self.potential())
    return result._replace(info=info)

  def _move(self, action: Any) -> base.StepResult:
    word = base.parse_action(action, ACTIONS, free_text=self.free_text_actions)
    if word is None:
      feedback = base.invalid_action_message(action, ACTIONS)
      return self._result(feedback, 0.0, False, {"action_valid": False})

    direction = word
    # Only draw when slippery so slippery=0 consumes no randomness (and stays trivially exact).
    if self.slippery > 0.0 and self._rng.random() < self.slippery:
      direction = _PERPENDICULAR[word][int(self._rng.integers(2))]
    verb = "moved" if direction == word else "slipped"
    target = self._target(self._pos, direction)
    if target == self._pos:
      feedback = "hit wall" if verb == "moved" else f"slipped {direction}, hit wall"
    else:
      feedback = f"{verb} {direction}"
    self._pos = target

    info: dict[str, Any] = {"action_valid": True}
    if self._pos == self.goal:
      return self._result(f"{feedback}, reached goal", 1.0, True, dict(info, success=True))
    if self._holes[self._pos]:
      return self._result(f"{feedback}, fell in hole", 0.0, True, dict(info, success=False))
    return self._result(feedback, 0.0, False, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    feedback, board = result.observation.split("\n", 1)
    return result._replace(
        observation=f"{feedback}; out of turns\n{board}", done=True,
        info=dict(result.info, success=False))

  def _result(self, feedback: str, reward: float, done: bool,
              info: dict[str, Any]) -> base.StepResult:
    return base.StepResult(f"{feedback}\n{self._view()}", reward, done, info)

  def _target(self, pos: tuple[int, int], direction: str) -> tuple[int, int]:
    dr, dc = _DELTAS[direction]
    r, c = pos[0] + dr, pos[1] + dc
    if 0 <= r < self.size and 0 <= c < self.size:
      return (r, c)
    return pos


def _sample_holes(rng: np.random.Generator, size: int, hole_prob: float,
                  max_turns: int) -> np.ndarray:
  """Draws hole maps until the start reaches the goal in at most `max_turns` moves."""
  goal = (size - 1, size - 1)
  for _ in range(_MAX_MAP_ATTEMPTS):
    holes = rng.random((size, size)) < hole_prob
    holes[0, 0] = holes[goal] = False
    distance = _distances_to(holes, goal)[0, 0]
    if 0 <= distance <= max_turns:
      return holes
  raise RuntimeError(
      f"frozenlake: no solvable {size}x{size} map with hole_prob={hole_prob} within "
      f"{max_turns} moves after {_MAX_MAP_ATTEMPTS} draws; lower hole_prob")


def _distances_to(holes: np.ndarray, goal: tuple[int, int]) -> np.ndarray:
  """BFS moves from every cell to `goal` through non-hole cells; -1 where unreachable.

  Holes themselves get -1: stepping on one ends the episode, so no path passes through it.
  """
  size = holes.shape[0]
  distances = np.full(holes.shape, -1, dtype=np.int64)
  distances[goal] = 0
  queue = collections.deque([goal])
  while queue:
    r, c = queue.popleft()
    for dr, dc in _DELTAS.values():
      nr, nc = r + dr, c + dc
      if 0 <= nr < size and 0 <= nc < size and not holes[nr, nc] and distances[nr, nc] < 0:
        distances[nr, nc] = distances[r, c] + 1
        queue.append((nr, nc))
  return distances
