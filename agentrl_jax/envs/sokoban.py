"""Sokoban in a small walled room, drawn one letter per cell.

    w w w w w w
    w f f G w w
    w f o f f w
    w f P f f w
    w f f f f w
    w w w w w w

w = wall, f = floor, G = goal (target square), o = box, F = box on a goal ("filled"), P = player,
N = player standing on a goal. Letters rather than the classic `# . $ *` symbols: with the shipped
tokenizer each of these letters, with its leading space, is one token (and stays one after a rebuild
on this env's text, since SentencePiece never merges across a space), while `' #'`, `' _'` or
`' $'` cost two or fall back to bytes. Every cell costs one token and every row break one more.

Puzzles are made by reverse play: boxes start on their goals and the player walks at random,
sometimes *pulling* a box behind it. Every pull is the inverse of a push, so the forward puzzle is
solvable by construction; a BFS over (player, boxes) states then gives its optimal length, and a
puzzle is kept only when that length is within the step cap.

Actions: up, down, left, right (`action_words`). Reward 1 when every box is on a goal (success);
optional shaping `box_reward` per box pushed onto a goal (and minus it per box pushed off one).
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

ACTIONS = ("up", "down", "left", "right")
WALL, FLOOR, GOAL, BOX, BOX_ON_GOAL, PLAYER, PLAYER_ON_GOAL = "w", "f", "G", "o", "F", "P", "N"
INSTRUCTION = ("push every box o onto a goal G. w wall, f floor, F box on goal, P you, "
               "N you on goal. moves: " + " ".join(ACTIONS))

_DELTAS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
# Draws until a puzzle fits the config; a sane config accepts within a few draws, the cap turns an
# impossible one (more boxes than the room holds) into an error instead of a hang.
_MAX_PUZZLE_ATTEMPTS = 1000

Cell = tuple[int, int]


@registry.register("sokoban")
class Sokoban(base.TextEnv):
  """Push all boxes onto goals in a `size` x `size` room (border walls included).

  `reset(seed)` draws the interior walls, goals, boxes and player from the seed (reverse play from
  the solved state), so an episode is a deterministic function of the seed and the actions.
  Pushing into a wall or into a second box is a valid move that leaves the state unchanged.
  The episode ends when solved or at `max_turns` steps; the last info carries
  `sub_outcomes = {"boxes_on_goal": fraction of boxes on goals}`.
  """

  action_words = ACTIONS

  def __init__(self, size: int = 6, num_boxes: int = 2, max_turns: int = 20,
               num_inner_walls: int = 2, reverse_steps: int = 40, min_solution: int = 3,
               box_reward: float = 0.0):
    """Builds the env; the puzzle is drawn at `reset`.

    Args:
      size: side of the room including its border walls, 5..10.
      num_boxes: boxes (and goals), 1..3.
      max_turns: step cap; every drawn puzzle is solvable in at most this many moves.
      num_inner_walls: wall cells drawn inside the room besides the border.
      reverse_steps: random reverse moves when scrambling the solved state.
      min_solution: puzzles whose optimal solution is shorter than this are redrawn.
      box_reward: shaping reward per box pushed onto a goal (minus it per box pushed off); 0 keeps
        the sparse 0/1 reward.
    """
    if not base.is_int(size) or not 5 <= size <= 10:
      raise ValueError(f"size must be an int in [5, 10], got {size!r}")
    if not base.is_int(num_boxes) or not 1 <= num_boxes <= 3:
      raise ValueError(f"num_boxes must be an int in [1, 3], got {num_boxes!r}")
    if not base.is_int(num_inner_walls) or not 0 <= num_inner_walls <= (size - 2) ** 2 // 4:
      raise ValueError(
          f"num_inner_walls must be an int in [0, {(size - 2) ** 2 // 4}], got {num_inner_walls!r}")
    if not base.is_int(reverse_steps) or reverse_steps < 1:
      raise ValueError(f"reverse_steps must be a positive int, got {reverse_steps!r}")
    if not base.is_int(min_solution) or min_solution < 1:
      raise ValueError(f"min_solution must be a positive int, got {min_solution!r}")
    if not base.is_number(box_reward) or box_reward < 0:
      raise ValueError(f"box_reward must be a number >= 0, got {box_reward!r}")
    super().__init__(max_turns)
    if min_solution > max_turns:
      raise ValueError(f"min_solution={min_solution} exceeds max_turns={max_turns}")
    self.size = size
    self.num_boxes = num_boxes
    self.num_inner_walls = num_inner_walls
    self.reverse_steps = reverse_steps
    self.min_solution = min_solution
    self.box_reward = float(box_reward)
    self._walls = np.ones((size, size), dtype=bool)
    self._goals: frozenset[Cell] = frozenset()
    self._boxes: frozenset[Cell] = frozenset()
    self._player: Cell = (1, 1)
    self._plan: list[str] = []
    self._plan_state: tuple[Cell, frozenset[Cell]] | None = None

  @property
  def walls(self) -> np.ndarray:
    """Bool [size, size] wall map (a copy)."""
    return self._walls.copy()

  @property
  def goals(self) -> frozenset[Cell]:
    return self._goals

  @property
  def boxes(self) -> frozenset[Cell]:
    return self._boxes

  @property
  def player(self) -> Cell:
    return self._player

  @property
  def solved(self) -> bool:
    return self._boxes == self._goals

  def solution(self) -> list[str] | None:
    """An optimal move sequence from the current state, or None when it is unsolvable."""
    return _solve(self._walls, self._goals, self._player, self._boxes, self.max_turns * 4)

  def board_text(self) -> str:
    """The room, one letter per cell, cells separated by spaces, one row per line."""
    rows = []
    for r in range(self.size):
      cells = []
      for c in range(self.size):
        cell = (r, c)
        if self._walls[cell]:
          cells.append(WALL)
        elif cell == self._player:
          cells.append(PLAYER_ON_GOAL if cell in self._goals else PLAYER)
        elif cell in self._boxes:
          cells.append(BOX_ON_GOAL if cell in self._goals else BOX)
        else:
          cells.append(GOAL if cell in self._goals else FLOOR)
      rows.append(" ".join(cells))
    return "\n".join(rows)

  def expert_action(self) -> str:
    """The first move of an optimal solution (BFS over player and box positions)."""
    # The cached plan stays optimal while the state follows it; any other move replans.
    if not self._plan or self._plan_state != (self._player, self._boxes):
      self._plan = self.solution() or [ACTIONS[0]]
      self._plan_state = (self._player, self._boxes)
    return self._plan[0]

  def _reset(self, seed: int) -> str:
    rng = np.random.default_rng(seed)
    for _ in range(_MAX_PUZZLE_ATTEMPTS):
      puzzle = self._draw_puzzle(rng)
      if puzzle is None:
        continue
      walls, goals, player, boxes = puzzle
      plan = _solve(walls, goals, player, boxes, self.max_turns)
      if plan is not None and self.min_solution <= len(plan) <= self.max_turns:
        self._walls, self._goals, self._player, self._boxes = walls, goals, player, boxes
        self._plan, self._plan_state = plan, (player, boxes)
        return f"{INSTRUCTION}\n{self.board_text()}"
    raise RuntimeError(
        f"sokoban: no puzzle with size={self.size}, num_boxes={self.num_boxes} solvable in "
        f"[{self.min_solution}, {self.max_turns}] moves after {_MAX_PUZZLE_ATTEMPTS} draws")

  def _step(self, action: Any) -> base.StepResult:
    word = base.parse_action(action, ACTIONS)
    if word is None:
      feedback = base.invalid_action_message(action, ACTIONS)
      return self._result(feedback, 0.0, False, {"action_valid": False})
    before = len(self._boxes & self._goals)
    on_plan = bool(self._plan) and self._plan[0] == word and self._plan_state == (
        self._player, self._boxes)
    feedback = self._move(word)
    if on_plan:  # Following an optimal plan keeps its tail optimal: no replanning next turn.
      self._plan = self._plan[1:]
      self._plan_state = (self._player, self._boxes)
    after = len(self._boxes & self._goals)
    reward = self.box_reward * (after - before)
    info: dict[str, Any] = {"action_valid": True}
    if self.solved:
      info.update(success=True, sub_outcomes=self._sub_outcomes())
      return self._result(f"{feedback}, solved", reward + 1.0, True, info)
    return self._result(feedback, reward, False, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    feedback, board = result.observation.split("\n", 1)
    info = dict(result.info, success=False, sub_outcomes=self._sub_outcomes())
    return result._replace(observation=f"{feedback}; out of turns\n{board}", done=True, info=info)

  def _sub_outcomes(self) -> dict[str, float]:
    return {"boxes_on_goal": len(self._boxes & self._goals) / self.num_boxes}

  def _result(self, feedback: str, reward: float, done: bool,
              info: dict[str, Any]) -> base.StepResult:
    return base.StepResult(f"{feedback}\n{self.board_text()}", reward, done, info)

  def _move(self, word: str) -> str:
    dr, dc = _DELTAS[word]
    r, c = self._player
    target = (r + dr, c + dc)
    if self._walls[target]:
      return "hit wall"
    if target in self._boxes:
      beyond = (r + 2 * dr, c + 2 * dc)
      if self._walls[beyond] or beyond in self._boxes:
        return "box blocked"
      self._boxes = (self._boxes - {target}) | {beyond}
      self._player = target
      return f"pushed {word}"
    self._player = target
    return f"moved {word}"

  def _draw_puzzle(self, rng: np.random.Generator):
    """Walls, goals, player, boxes of one reverse-played puzzle; None when the draw is unusable."""
    size = self.size
    walls = np.ones((size, size), dtype=bool)
    walls[1:-1, 1:-1] = False
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    picks = rng.permutation(len(interior))
    cells = [interior[i] for i in picks]
    for cell in cells[:self.num_inner_walls]:
      walls[cell] = True
    free = cells[self.num_inner_walls:]
    if len(free) < self.num_boxes + 1:
      return None
    goals = frozenset(free[:self.num_boxes])
    boxes = set(goals)
    player = free[self.num_boxes]
    for _ in range(self.reverse_steps):
      word = ACTIONS[int(rng.integers(4))]
      dr, dc = _DELTAS[word]
      nxt = (player[0] + dr, player[1] + dc)
      if walls[nxt] or nxt in boxes:
        continue
      behind = (player[0] - dr, player[1] - dc)
      # Pull: the player steps `word`-wards and drags the box behind it into the cell it left.
      # Played forward, that is a push in the opposite direction, so the puzzle stays solvable.
      if behind in boxes and rng.random() < 0.7:
        boxes.remove(behind)
        boxes.add(player)
      player = nxt
    boxes = frozenset(boxes)
    if boxes == goals:
      return None
    return walls, goals, player, boxes


def _solve(walls: np.ndarray, goals: frozenset[Cell], player: Cell, boxes: frozenset[Cell],
           max_depth: int) -> list[str] | None:
  """BFS over (player, boxes): the shortest move list, or None if none within `max_depth`."""
  start = (player, boxes)
  if boxes == goals:
    return []
  parents: dict[Any, Any] = {start: None}
  frontier = collections.deque([(start, 0)])
  while frontier:
    state, depth = frontier.popleft()
    if depth >= max_depth:
      continue
    (r, c), bxs = state
    for word in ACTIONS:
      dr, dc = _DELTAS[word]
      target = (r + dr, c + dc)
      if walls[target]:
        continue
      new_boxes = bxs
      if target in bxs:
        beyond = (r + 2 * dr, c + 2 * dc)
        if walls[beyond] or beyond in bxs:
          continue
        new_boxes = (bxs - {target}) | {beyond}
      nxt = (target, new_boxes)
      if nxt in parents:
        continue
      parents[nxt] = (state, word)
      if new_boxes == goals:
        return _backtrack(parents, nxt)
      frontier.append((nxt, depth + 1))
  return None


def _backtrack(parents: dict[Any, Any], state: Any) -> list[str]:
  moves = []
  while parents[state] is not None:
    state, word = parents[state]
    moves.append(word)
  return moves[::-1]
