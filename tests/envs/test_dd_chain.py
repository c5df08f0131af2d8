"""Tests of DD-Chain, the decision-density chain of docs/methods.md#dd-chain."""

import itertools

import numpy as np
import pytest

from agentrl_jax import envs
from agentrl_jax.envs import dd_chain


def _episode(env, seed, actions):
  """Plays `actions` (one per turn) from `reset(seed)`; returns the list of StepResults."""
  env.reset(seed)
  return [env.step(a) for a in actions]


def _expert_episode(env, seed):
  env.reset(seed)
  results = []
  while not results or not results[-1].done:
    results.append(env.step(env.expert_action()))
  return results


@pytest.mark.parametrize("horizon, num_decisions",
                         [(64, m) for m in (1, 2, 4, 8, 16, 32, 64)] +
                         [(t, m) for t in (1, 2, 3, 5, 7, 16, 128) for m in range(1, t + 1, 3)])
def test_decision_set_has_m_turns_and_exact_density(horizon, num_decisions):
  env = dd_chain.DDChain(horizon=horizon, num_decisions=num_decisions)
  turns = env.decision_turns
  assert len(turns) == num_decisions == len(set(turns))
  assert list(turns) == sorted(turns)
  assert turns[0] == 0 and 0 <= turns[-1] <= horizon - 1
  if num_decisions > 1:
    assert turns[-1] == horizon - 1
  assert env.density == num_decisions / horizon
  assert env.decision_mask.sum() == num_decisions


def test_decision_turns_hand_checked():
  # linspace(0, 15, 4) = [0, 5, 10, 15]; linspace(0, 9, 4) = [0, 3, 6, 9];
  # linspace(0, 6, 5) = [0, 1.5, 3, 4.5, 6] rounds half to even -> [0, 2, 3, 4, 6].
  assert dd_chain.decision_turns(16, 4) == (0, 5, 10, 15)
  assert dd_chain.decision_turns(10, 4) == (0, 3, 6, 9)
  assert dd_chain.decision_turns(7, 5) == (0, 2, 3, 4, 6)


@pytest.mark.parametrize("actions", [["0"] * 16, ["1"] * 16, ["bad"] * 16])
def test_every_episode_lasts_exactly_horizon_turns(actions):
  env = dd_chain.DDChain(horizon=16)
  results = _episode(env, 0, actions)
  assert [r.done for r in results] == [False] * 15 + [True]
  assert all(r.reward == 0.0 for r in results[:-1])
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("0")


def test_reward_counts_correct_decisions():
  env = dd_chain.DDChain(horizon=16, num_decisions=4, beta=2.0)
  targets = env.targets
  for num_right in range(5):
    actions = ["0"] * 16
    for k, t in enumerate(env.decision_turns):
      wrong = "1" if targets[t] == "0" else "0"
      actions[t] = targets[t] if k < num_right else wrong
    final = _episode(env, 0, actions)[-1]
    assert final.reward == 2.0 * num_right
    assert final.info["sub_outcomes"] == {"correct_decisions": num_right / 4}
    assert final.info["success"] == (num_right == 4)


def test_reward_is_invariant_to_routine_actions():
  env = dd_chain.DDChain(horizon=12, num_decisions=3, noise_std=0.5)
  decision = set(env.decision_turns)
  rng = np.random.default_rng(0)
  rewards = set()
  for _ in range(20):
    actions = [env.targets[t] if t in decision else rng.choice(["0", "1", "x", None])
               for t in range(12)]
    rewards.add(_episode(env, 5, actions)[-1].reward)
  assert len(rewards) == 1


def test_invalid_actions_count_as_wrong_and_are_reported():
  env = dd_chain.DDChain(horizon=4, num_decisions=2)
  env.reset(0)
  result = env.step("maybe")
  assert result.observation == "invalid action 'maybe': use 0 or 1\nturn 2 of 4"
  assert result.info == {"action_valid": False, "decision_turn": True}  # turn 0 is in D
  for action in (None, 5, "x" * 10_000):
    result = env.step(action)
    assert "use 0 or 1" in result.observation and len(result.observation) < 100
  assert result.done and result.reward == 0.0
  assert result.info["sub_outcomes"] == {"correct_decisions": 0.0}
  assert not result.info["success"] and not result.info["action_valid"]


def test_same_seed_same_episode_and_noise_comes_from_the_reset_seed():
  env = dd_chain.DDChain(noise_std=1.0)
  actions = ["1", "0"] * 8
  first = _episode(env, 3, actions)
  assert _episode(dd_chain.DDChain(noise_std=1.0), 3, actions) == first
  finals = {_episode(env, seed, actions)[-1].reward for seed in range(10)}
  assert len(finals) == 10


def test_targets_depend_on_target_seed_only():
  env = dd_chain.DDChain(horizon=64, num_decisions=32)
  targets = env.targets
  env.reset(1)
  env.reset(2)
  assert env.targets == targets
  others = [dd_chain.DDChain(horizon=64, num_decisions=32, target_seed=s).targets
            for s in range(1, 4)]
  assert all(o != targets for o in others)


def test_observations_never_reveal_targets_or_decision_turns():
  actions = ["0"] * 16
  a = _episode(dd_chain.DDChain(target_seed=0), 0, actions)
  b = _episode(dd_chain.DDChain(target_seed=1, num_decisions=8), 0, actions)
  assert [r.observation for r in a] == [r.observation for r in b]
  assert a[0].observation == "turn 2 of 16"
  assert a[-1].observation == "episode over"


def test_first_observation_and_turn_hashes():
  env = dd_chain.DDChain(horizon=8)
  assert env.reset(0) == "answer 0 or 1 each turn\nturn 1 of 8"
  observations = [r.observation for r in _episode(env, 0, ["0"] * 8)]
  # The turn index is DD-Chain's whole state, so every turn must hash differently.
  assert len({envs.observation_hash(o) for o in observations}) == 8


def test_expert_always_succeeds():
  env = dd_chain.DDChain(horizon=16, num_decisions=4, noise_std=0.0)
  for seed in range(100):
    final = _expert_episode(env, seed)[-1]
    assert final.info["success"] and final.reward == 4.0


def test_expert_plays_zero_on_routine_turns():
  env = dd_chain.DDChain(horizon=8, num_decisions=2)
  env.reset(0)
  plays = []
  for t in range(8):
    plays.append(env.expert_action())
    env.step(plays[-1])
  assert [p for t, p in enumerate(plays) if t not in (0, 7)] == ["0"] * 6


def test_random_policy_success_matches_two_to_the_minus_m():
  # Uniform random actions succeed with probability 2^-m = 1/16 for m = 4 (measured 5.1% over
  # 1000 seeds). Exhaustive check over the 16 decision-action combinations:
  env = dd_chain.DDChain(horizon=16, num_decisions=4)
  wins = 0
  for combo in itertools.product("01", repeat=4):
    actions = ["0"] * 16
    for t, a in zip(env.decision_turns, combo):
      actions[t] = a
    wins += _episode(env, 0, actions)[-1].info["success"]
  assert wins == 1


@pytest.mark.parametrize("kwargs, argument", [
    ({"horizon": 0}, "horizon"),
    ({"num_decisions": 0}, "num_decisions"),
    ({"horizon": 4, "num_decisions": 5}, "num_decisions"),
    ({"noise_std": -1.0}, "noise_std"),
    ({"target_seed": -1}, "target_seed"),
    ({"beta": "1"}, "beta"),
])
def test_bad_config_is_rejected_naming_the_argument(kwargs, argument):
  with pytest.raises(ValueError, match=argument):
    dd_chain.DDChain(**kwargs)


def test_registered_under_its_name():
  env = envs.make("dd_chain", horizon=8, num_decisions=2)
  assert isinstance(env, dd_chain.DDChain) and env.name == "dd_chain"
  assert env.action_words == ("0", "1") and env.max_turns == 8


def test_every_step_reports_whether_it_was_a_decision_turn():
  env = dd_chain.DDChain(horizon=9, num_decisions=3)  # D = {0, 4, 8}
  results = _episode(env, 0, ["1"] * 9)
  reported = [r.info["decision_turn"] for r in results]
  assert reported == [t in (0, 4, 8) for t in range(9)]
  np.testing.assert_array_equal(reported, env.decision_mask)
