"""Tests of the TextWorld env (skipped without the textworld package).

Games are compiled into a per-module temporary cache; compiling takes 1-5 s per game, so the
fast tests stay on three small coin-collector games and the many-seed checks are marked slow.
"""

import random
import threading
import time

import pytest

pytest.importorskip("textworld", reason="needs the textworld package (envs extra)")

from agentrl_jax.envs import registry  # pylint: disable=g-import-not-at-top
from agentrl_jax.envs import textworld_env  # pylint: disable=g-import-not-at-top
from agentrl_jax.learner import configs  # pylint: disable=g-import-not-at-top
from agentrl_jax.learner import warm_start  # pylint: disable=g-import-not-at-top

import episodes  # pylint: disable=g-import-not-at-top

COIN = {"challenge": "tw-coin_collector", "settings": {"level": 5}}
# Random policy (uniform over admissible commands, 30 turns), seeds 0..19: tw-cooking default
# settings 5% (mean score fraction 0.23); tw-coin_collector level 5: 40%.
RANDOM_SUCCESS_BOUND = {"tw-cooking": 0.2, "tw-coin_collector": 0.7}


@pytest.fixture(name="cache_dir", scope="module")
def fixture_cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("textworld_cache"))


def _expert_episode(env, seed):
  return episodes.expert_final(env, seed)


def _random_episode(env, seed, rng):
  return episodes.play(env, seed, lambda e: rng.choice(e.admissible_commands))[-1]


def test_registered(cache_dir):
  env = registry.make("textworld", cache_dir=cache_dir, **COIN)
  assert isinstance(env, textworld_env.TextWorld)
  with pytest.raises(ValueError, match="challenge must be a TextWorld challenge name"):
    registry.make("textworld", challenge="zork")


def test_expert_succeeds_fast(cache_dir):
  env = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)
  for seed in range(3):
    final = _expert_episode(env, seed)
    assert final.info["success"] and final.info["sub_outcomes"]["score_fraction"] == 1.0
    assert final.reward == 1.0  # The coin is the game's only point.
  env.close()


def test_noisy_demonstrations_draw_admissible_commands_and_still_win(cache_dir):
  # The engine's policy_commands are planned from the current state, so the expert recovers
  # from a random admissible command: a warm start may ask for expert noise on this env.
  env = textworld_env.TextWorld(cache_dir=cache_dir, max_turns=30, **COIN)
  assert episodes.noisy_expert_wins(env, range(3)) >= 3  # the noise drew other commands
  warm_start.check_noise(configs.WarmStartConfig(iterations=1, expert_noise=0.3), lambda: env)
  env.close()


def test_games_are_cached_by_seed_and_settings(cache_dir):
  env = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)
  path = env.game_file(0)
  assert path.exists() and path.with_suffix(".json").exists()
  assert env.game_file(0) == path
  assert env.game_file(1) != path
  other = textworld_env.TextWorld(cache_dir=cache_dir, challenge="tw-coin_collector",
                                  settings={"level": 6})
  assert other.game_path(0) != path and other.game_path(0).parent == path.parent
  start = time.perf_counter()
  env.reset(0)
  # A cached game only loads (about 0.02 s here); compiling takes seconds.
  assert time.perf_counter() - start < 1.0
  env.close()


def test_same_seed_same_episode(cache_dir):
  env = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)

  def play(seed):
    trace = [env.reset(seed)]
    for action in ("look", "go north", "inventory"):
      trace.append(env.step(action))
    return trace

  assert play(1) == play(1)
  assert play(1)[0] != play(2)[0]
  env.close()


def test_a_pool_of_games_replays_seed_mod_its_size(cache_dir):
  pooled = textworld_env.TextWorld(cache_dir=cache_dir, num_games=2, **COIN)
  single = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)
  assert [pooled.game_of(s) for s in (0, 1, 2, 3, 1_000_000_001)] == [0, 1, 0, 1, 1]
  assert pooled.reset(2) == single.reset(0) and pooled.reset(3) == single.reset(1)
  assert single.reset(2) != single.reset(0)  # without the pool, seed 2 is its own game
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ValueError, match="num_games must be None or an int >= 1"):
      textworld_env.TextWorld(num_games=bad, **COIN)
  pooled.close()
  single.close()


def test_observation_is_clean_and_admissible_can_be_shown(cache_dir):
  env = textworld_env.TextWorld(cache_dir=cache_dir, show_admissible=True, **COIN)
  observation = env.reset(0)
  assert "$$" not in observation and "\n\n" not in observation
  assert "admissible: " in observation
  assert all(c in observation for c in env.admissible_commands)
  env.close()


def test_clean_feedback_drops_banner_prompt_and_trailer():
  raw = ("  ________\n |  $$$$ |\n\nYou pick up the coin.\n\n>  \n"
         "*** The End ***\nYou scored 1 out of a possible 1")
  assert textworld_env.clean_feedback(raw) == "You pick up the coin."


def test_step_cap(cache_dir):
  env = textworld_env.TextWorld(cache_dir=cache_dir, max_turns=2, **COIN)
  env.reset(0)
  assert not env.step("look").done
  final = env.step("inventory")
  assert final.done and not final.info["success"]
  assert final.info["sub_outcomes"]["score_fraction"] == 0.0
  env.close()


@pytest.mark.parametrize("action, fragment", [
    ("", "empty action"),
    (None, "action of type NoneType"),
    ("x" * 5000, "longer than 200"),
    ("look\ninventory", "one command per turn"),
    ("restart", "'restart' is not allowed"),
    ("QUIT", "'quit' is not allowed"),
    ("fly to the moon", "invalid action 'fly to the moon'"),
])
def test_malformed_actions_get_a_clear_observation(cache_dir, action, fragment):
  env = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)
  env.reset(0)
  result = env.step(action)
  assert fragment in result.observation
  assert result.info["action_valid"] is False and result.reward == 0.0 and not result.done
  env.close()


@pytest.mark.parametrize("action", ["\\rv", "\\help", "take coin \\"])
def test_a_backslash_is_refused_before_it_reaches_the_interpreter(cache_dir, action):
  # Sent to the engine, a line starting with a backslash is taken as an interpreter setting and
  # re-read forever, so the step never returns: it runs in a thread here, to fail, not hang.
  env = textworld_env.TextWorld(cache_dir=cache_dir, **COIN)
  env.reset(0)
  results = []
  worker = threading.Thread(target=lambda: results.append(env.step(action)), daemon=True)
  worker.start()
  worker.join(timeout=60)
  assert results, f"step({action!r}) did not return within 60 s"
  assert "no backslashes" in results[0].observation
  assert results[0].info["action_valid"] is False and not results[0].done
  assert not env.step("look").done  # the game goes on
  env.close()


@pytest.mark.slow
@pytest.mark.parametrize("challenge, settings, seeds", [
    ("tw-cooking", None, 30), ("tw-coin_collector", {"level": 5}, 50),
    ("tw-treasure_hunter", {"level": 5}, 30)])
def test_expert_succeeds_on_many_seeds(cache_dir, challenge, settings, seeds):
  env = textworld_env.TextWorld(challenge=challenge, settings=settings, cache_dir=cache_dir)
  successes = sum(_expert_episode(env, s).info["success"] for s in range(seeds))
  assert successes >= 0.95 * seeds
  env.close()


@pytest.mark.slow
@pytest.mark.parametrize("challenge, settings", [
    ("tw-cooking", None), ("tw-coin_collector", {"level": 5})])
def test_random_policy_success_is_recorded(cache_dir, challenge, settings):
  env = textworld_env.TextWorld(challenge=challenge, settings=settings, cache_dir=cache_dir)
  rng = random.Random(0)
  rate = sum(_random_episode(env, s, rng).info["success"] for s in range(20)) / 20
  assert rate <= RANDOM_SUCCESS_BOUND[challenge]
  env.close()
