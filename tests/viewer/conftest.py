"""Hand-built trajectories for the viewer tests, laid out exactly as the rollout loop writes them."""

import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.models import tokenizer as tokenizer_lib


@pytest.fixture(scope="session")
def tok():
  return tokenizer_lib.load_tokenizer()


def build_trajectories(tok, episodes, group_ids, *, max_len=96, max_turns=4):
  """Trajectories from `episodes[b] = [(observation, action, reward, valid, env_error), ...]`.

  Each turn is `<|obs|> observation <|act|>` then the action's tokens, as `RolloutRunner` lays
  it out; the last turn is `done`, and a trajectory succeeds when its outcome is positive.
  """
  traj = types.empty_trajectories(len(episodes), max_len, max_turns)
  traj.group_id[:] = group_ids
  for b, turns in enumerate(episodes):
    cursor = 0
    for k, (observation, action, reward, valid, env_error) in enumerate(turns):
      obs_ids = [tok.obs_id, *tok.encode(observation), tok.act_id]
      act_ids = tok.encode(action)
      traj.tokens[b, cursor:cursor + len(obs_ids)] = obs_ids
      traj.turn_of_token[b, cursor:cursor + len(obs_ids)] = k
      cursor += len(obs_ids)
      traj.tokens[b, cursor:cursor + len(act_ids)] = act_ids
      traj.turn_of_token[b, cursor:cursor + len(act_ids)] = k
      traj.action_mask[b, cursor:cursor + len(act_ids)] = True
      traj.turn_start[b, k], traj.turn_end[b, k] = cursor, cursor + len(act_ids)
      cursor += len(act_ids)
      traj.reward[b, k] = reward
      traj.action_valid[b, k] = valid
      traj.env_error[b, k] = env_error
    traj.done[b, len(turns) - 1] = True
    traj.outcome[b] = sum(t[2] for t in turns)
    traj.success[b] = traj.outcome[b] > 0
  traj.turn_mask[:] = traj.turn_end > traj.turn_start
  traj.sub_outcomes["reached_goal"] = traj.success.astype(np.float32)
  traj.validate()
  return traj


# Two groups of two: group 0 has one success and one failure, group 1 two failures.
EPISODES = [
    [("reach G. moves: left down right up", "down", 0.0, True, False),
     ("moved down <script>alert(1)</script>", "down", 0.0, True, False),
     ("moved down", "right", 1.0, True, False)],
    [("reach G. moves: left down right up", "jump", 0.0, False, False),
     ("invalid action 'jump'", "left", 0.0, True, False)],
    [("reach G & avoid H", "up", 0.0, True, False),
     ("moved up", "up", 0.0, True, False),
     ("moved up", "up", 0.0, True, True)],
    [("reach G & avoid H", "right left", 0.0, True, False)],
]
GROUP_IDS = [0, 0, 1, 1]


@pytest.fixture
def make_trajectories(tok):
  """`build_trajectories` with the session tokenizer, for tests that build their own batch (a
  fixture: `from conftest import ...` picks whichever conftest a worker imported first)."""
  return lambda episodes, group_ids, **kwargs: build_trajectories(tok, episodes, group_ids, **kwargs)


@pytest.fixture
def episodes():
  return EPISODES


@pytest.fixture
def traj(tok):
  return build_trajectories(tok, EPISODES, GROUP_IDS)


@pytest.fixture
def advantages(traj):
  """Two pipelines of distinct random token advantages, zero off the action tokens."""
  rng = np.random.default_rng(0)
  mask = traj.action_mask
  return {name: np.where(mask, rng.normal(size=mask.shape), 0.0).astype(np.float32)
          for name in ("GRPO", "GiGPO <b>")}
