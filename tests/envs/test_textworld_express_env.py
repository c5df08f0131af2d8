"""Tests of the TextWorld-Express env (skipped without the textworld-express package)."""

import random
import shutil

import pytest

pytest.importorskip("textworld_express", reason="needs the textworld-express package (envs extra)")
if shutil.which("java") is None:
  pytest.skip("textworld-express needs a Java runtime on PATH", allow_module_level=True)

from agentrl_jax.envs import registry  # pylint: disable=g-import-not-at-top
from agentrl_jax.envs import textworld_express_env as twx  # pylint: disable=g-import-not-at-top

import episodes  # pylint: disable=g-import-not-at-top

GAMES = ("coin", "cookingworld", "twc")
# Random policy (uniform over the engine's valid actions, default params, 20 turns), seeds 0..99:
# coin 68%, cookingworld 0% (mean score 0.10), twc 11% (mean score 0.32).
RANDOM_SUCCESS_BOUND = {"coin": 0.85, "cookingworld": 0.05, "twc": 0.25}


@pytest.fixture(name="make_env", scope="module")
def fixture_make_env():
  yield twx.TextWorldExpress
  twx.shutdown_engine()


def _expert_episode(env, seed):
  return episodes.expert_final(env, seed)


def _random_episode(env, seed, rng):
  return episodes.play(env, seed, lambda e: rng.choice(e.valid_actions))[-1]


def test_registered():
  env = registry.make("textworld_express", game="twc")
  assert isinstance(env, twx.TextWorldExpress) and env.game == "twc"
  with pytest.raises(ValueError, match="game must be one of"):
    registry.make("textworld_express", game="zork")


def test_interleaved_envs_share_one_engine_without_crosstalk(make_env):
  """Envs stepped in lockstep (as the rollout loop does) see the episodes they see alone."""
  specs = [("coin", 0), ("twc", 1), ("coin", 2), ("cookingworld", 3)]

  def expert_trace(env, seed):
    trace = [env.reset(seed)]
    while not env.done:
      trace.append(env.step(env.expert_action()))
    return trace

  alone = [expert_trace(make_env(game=g), s) for g, s in specs]
  envs = [make_env(game=g) for g, _ in specs]
  together = [[env.reset(s)] for env, (_, s) in zip(envs, specs)]
  while not all(env.done for env in envs):
    for env, trace in zip(envs, together):
      if not env.done:
        trace.append(env.step(env.expert_action()))
  assert together == alone


@pytest.mark.parametrize("game", GAMES)
def test_expert_succeeds_fast(make_env, game):
  env = make_env(game=game)
  for seed in range(3):
    final = _expert_episode(env, seed)
    assert final.info["success"] and final.info["sub_outcomes"]["score"] == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("game", GAMES)
def test_expert_succeeds_on_100_seeds(make_env, game):
  env = make_env(game=game)
  assert sum(_expert_episode(env, s).info["success"] for s in range(100)) >= 95


@pytest.mark.slow
@pytest.mark.parametrize("game", GAMES)
def test_random_policy_success_is_recorded(make_env, game):
  env = make_env(game=game)
  rng = random.Random(0)
  rate = sum(_random_episode(env, s, rng).info["success"] for s in range(100)) / 100
  assert rate <= RANDOM_SUCCESS_BOUND[game]


def test_reward_is_score_delta(make_env):
  env = make_env(game="cookingworld")
  env.reset(0)
  total, score = 0.0, 0.0
  while True:
    result = env.step(env.expert_action())
    total += result.reward
    assert result.reward == pytest.approx(result.info["score"] - score)
    score = result.info["score"]
    if result.done:
      break
  assert total == pytest.approx(1.0)


def test_same_seed_same_episode(make_env):
  env = make_env(game="twc")

  def play(seed):
    trace = [env.reset(seed)]
    for _ in range(4):
      trace.append(env.step(env.expert_action()))
    return trace

  assert play(7) == play(7)
  assert play(7)[0] != play(8)[0]


def test_valid_actions_can_be_shown(make_env):
  env = make_env(game="coin", show_valid_actions=True)
  observation = env.reset(0)
  assert "valid actions: " in observation
  assert all(a in observation for a in env.valid_actions)


def test_step_cap(make_env):
  env = make_env(game="cookingworld", max_turns=2)
  env.reset(0)
  assert not env.step("look around").done
  final = env.step("inventory")
  assert final.done and not final.info["success"] and "score" in final.info["sub_outcomes"]


@pytest.mark.parametrize("action, fragment", [
    ("", "empty action"),
    (None, "action of type NoneType"),
    ("x" * 5000, "longer than 200"),
    ("fly to the moon", "invalid action 'fly to the moon'"),
])
def test_malformed_actions_get_a_clear_observation(make_env, action, fragment):
  env = make_env(game="coin")
  env.reset(0)
  result = env.step(action)
  assert fragment in result.observation
  assert result.info["action_valid"] is False and result.reward == 0.0
