"""Tests of the FrozenLake text grid world."""

import numpy as np
import pytest

from agentrl_jax import envs
from agentrl_jax.envs import frozenlake

VALID_HINT = "use left, down, right or up"


def _play(env, seed, actions):
  """Observations, rewards, dones and infos of `actions` from `reset(seed)`, up to done."""
  trace = [env.reset(seed)]
  for action in actions:
    result = env.step(action)
    trace.append(result)
    if result.done:
      break
  return trace


def _run_policy(env, seed, policy):
  env.reset(seed)
  while True:
    result = env.step(policy(env))
    if result.done:
      return result


def test_first_observation_is_instruction_then_board():
  env = frozenlake.FrozenLake()
  lines = env.reset(0).split("\n")
  assert lines[0] == frozenlake.INSTRUCTION
  board = [row.split(" ") for row in lines[1:]]
  assert len(board) == 4 and all(len(row) == 4 for row in board)
  assert all(cell in "PFHG" for row in board for cell in row)
  assert board[0][0] == "P" and board[3][3] == "G"
  assert "\n".join(lines[1:]) == env.board_text()


def test_board_marks_holes_and_moves_player():
  env = frozenlake.FrozenLake(hole_prob=0.0)
  env.reset(0)
  assert env.board_text() == "P F F F\nF F F F\nF F F F\nF F F G"
  result = env.step("right")
  assert result.observation == "moved right\nF P F F\nF F F F\nF F F F\nF F F G"
  assert env.position == (0, 1)


def test_same_seed_and_actions_give_identical_episodes():
  actions = ["right", "down", "jump", "down", "LEFT", None, "right", "up", "down", "right"]
  for slippery in (0.0, 0.3):
    a = _play(frozenlake.FrozenLake(slippery=slippery), 7, actions)
    b = _play(frozenlake.FrozenLake(slippery=slippery), 7, actions)
    assert a == b


def test_seed_changes_the_map():
  env = frozenlake.FrozenLake()
  boards = {env.reset(seed) for seed in range(20)}
  assert len(boards) > 10


def test_slips_are_seeded_and_happen_at_the_set_rate():
  env = frozenlake.FrozenLake(hole_prob=0.0, slippery=0.5, max_turns=10)
  slips = 0
  for seed in range(200):
    env.reset(seed)
    slips += env.step("right").observation.startswith("slipped")
  # Binomial(200, 0.5): mean 100, std ~7; [70, 130] is > 4 std wide on each side.
  assert 70 <= slips <= 130


def test_every_map_is_solvable_within_the_cap():
  env = frozenlake.FrozenLake(hole_prob=0.4, max_turns=8)
  for seed in range(200):
    env.reset(seed)
    assert not env.holes[0, 0] and not env.holes[3, 3]
    assert 6 <= env.shortest_path_length <= 8


def test_expert_solves_every_seed_on_a_shortest_path():
  env = frozenlake.FrozenLake()
  solved = 0
  for seed in range(100):
    env.reset(seed)
    optimal = env.shortest_path_length
    result = _run_policy(env, seed, lambda e: e.expert_action())
    solved += result.info["success"]
    assert env.turn == optimal
  # The spec asks >= 95%; without slips the BFS expert cannot fail.
  assert solved == 100


def test_random_policy_rarely_succeeds():
  # Measured: uniform random moves solve 1.6% of 1000 default episodes (the expert: 100%).
  env = frozenlake.FrozenLake()
  rng = np.random.default_rng(0)
  wins = sum(
      _run_policy(env, seed, lambda e: frozenlake.ACTIONS[rng.integers(4)]).info["success"]
      for seed in range(200))
  assert wins < 20


@pytest.mark.parametrize("action", ["jump", "", "   ", "x" * 10_000, None, 5, 1.5, ["left"],
                                    "left right", "\n"])
def test_invalid_action_is_a_wasted_turn_not_an_error(action):
  env = frozenlake.FrozenLake()
  env.reset(3)
  board = env.board_text()
  result = env.step(action)
  feedback, rest = result.observation.split("\n", 1)
  assert VALID_HINT in feedback
  assert feedback.startswith(("invalid action", "empty action"))
  assert rest == board
  assert len(result.observation) < 200  # A 10k-char action is quoted truncated.
  assert result.reward == 0.0 and not result.done
  assert result.info == {"action_valid": False}
  assert env.turn == 1 and env.position == (0, 0)


@pytest.mark.parametrize("action", ["LEFT", "  up\n", "Down", "\tright "])
def test_case_and_surrounding_whitespace_are_tolerated(action):
  env = frozenlake.FrozenLake(hole_prob=0.0)
  env.reset(0)
  assert env.step(action).info["action_valid"]


def test_wall_bump_is_valid_and_keeps_position():
  env = frozenlake.FrozenLake()
  env.reset(0)
  result = env.step("up")
  assert result.observation.split("\n")[0] == "hit wall"
  assert result.info == {"action_valid": True}
  assert env.position == (0, 0)


def test_reaching_goal_pays_one_and_ends():
  env = frozenlake.FrozenLake()
  result = _run_policy(env, 11, lambda e: e.expert_action())
  assert result.reward == 1.0 and result.done
  assert result.info == {"action_valid": True, "success": True}
  assert result.observation.split("\n")[0].endswith("reached goal")


def test_falling_in_a_hole_ends_without_reward():
  env = frozenlake.FrozenLake()
  seed = next(s for s in range(100) if env.reset(s) and env.holes[0, 1])
  env.reset(seed)
  result = env.step("right")
  assert result.observation.split("\n")[0] == "moved right, fell in hole"
  assert result.reward == 0.0 and result.done
  assert result.info == {"action_valid": True, "success": False}
  assert env.shortest_path_length is None


def test_step_cap_ends_the_episode():
  env = frozenlake.FrozenLake(max_turns=7)
  env.reset(0)
  for _ in range(6):
    assert not env.step("up").done
  result = env.step("up")
  assert result.done and result.info["success"] is False
  assert result.observation.split("\n")[0] == "hit wall; out of turns"


def test_step_after_done_and_before_reset_raise():
  env = frozenlake.FrozenLake()
  with pytest.raises(RuntimeError, match="before reset"):
    env.step("left")
  _run_policy(env, 0, lambda e: e.expert_action())
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("left")
  env.reset(1)  # A new episode is fine.
  env.step("left")


@pytest.mark.parametrize("kwargs, argument", [
    ({"size": 1}, "size"),
    ({"hole_prob": 1.0}, "hole_prob"),
    ({"hole_prob": "0.2"}, "hole_prob"),
    ({"slippery": 1.5}, "slippery"),
    ({"max_turns": 0}, "max_turns"),
    ({"size": 6, "max_turns": 9}, "max_turns"),
])
def test_bad_config_is_rejected_naming_the_argument(kwargs, argument):
  with pytest.raises(ValueError, match=argument):
    frozenlake.FrozenLake(**kwargs)


def test_registered_under_its_name():
  env = envs.make("frozenlake", size=5, max_turns=12)
  assert isinstance(env, frozenlake.FrozenLake) and env.name == "frozenlake"
  assert env.action_words == ("left", "down", "right", "up")
  assert len(env.reset(0).split("\n")) == 6


def _moves_line_from_board(board_text: str) -> dict[str, str]:
  """What each move reaches, read off the letter grid: a reference for `describe_moves`."""
  grid = [row.split(" ") for row in board_text.split("\n")]
  (r, c), = [(i, j) for i, row in enumerate(grid) for j, cell in enumerate(row) if cell == "P"]
  out = {}
  for word, (dr, dc) in (("left", (0, -1)), ("down", (1, 0)), ("right", (0, 1)), ("up", (-1, 0))):
    rr, cc = r + dr, c + dc
    if not (0 <= rr < len(grid) and 0 <= cc < len(grid)):
      out[word] = "wall"
    else:
      out[word] = {"F": "ice", "H": "hole", "G": "goal"}[grid[rr][cc]]
  return out


def test_describe_moves_line_agrees_with_the_board_every_turn():
  env = frozenlake.FrozenLake(hole_prob=0.3, max_turns=8, describe_moves=True)
  checked = 0
  for seed in range(30):
    observation = env.reset(seed)
    for action in ("down", "right", "right", "down", "left", "down", "right", "up"):
      lines = observation.split("\n")
      board, moves = "\n".join(lines[-5:-1]), lines[-1]
      assert board == env.board_text()
      said = dict(part.split(": ") for part in moves.split(", "))
      assert said == _moves_line_from_board(board)
      checked += 1
      result = env.step(action)
      if result.done:
        break
      observation = result.observation
  assert checked > 60


def test_describe_moves_off_keeps_the_board_last():
  plain = frozenlake.FrozenLake(hole_prob=0.2)
  described = frozenlake.FrozenLake(hole_prob=0.2, describe_moves=True)
  a, b = plain.reset(3), described.reset(3)
  assert b.startswith(a + "\n") and b.count("\n") == a.count("\n") + 1
  assert "where each move leads" in described.instructions
  assert "where each move leads" not in plain.instructions
