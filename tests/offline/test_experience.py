"""Tests of SLEA-RL's clustering, library maintenance and the 'slea' env wrapper."""

import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.offline import experience


def test_structural_key_ignores_entity_names_numbers_and_quotes():
  a = "You are in the Kitchen. Alice gave you 3 apples; 'open fridge' failed."
  b = "You are in the Garage. Bob gave you 17 apples; 'take key' failed."
  assert experience.structural_key(a) == experience.structural_key(b)
  assert experience.structural_key(a) != experience.structural_key("You are in a room.")


def test_frozenlake_boards_with_the_same_neighbourhood_share_a_cluster():
  a = "moved right\nF P F F\nF H F H\nF F F H\nH F F G"
  b = "hit wall\nF P F H\nF H H F\nH F F F\nF F H G"   # left F, down H, right F, up wall
  c = "moved down\nF F F F\nP H F H\nF F F H\nH F F G"
  assert experience.frozenlake_key(a) == experience.frozenlake_key(b)
  assert experience.frozenlake_key(a) != experience.frozenlake_key(c)
  lib = experience.ExperienceLibrary(experience.LibraryConfig(backoff_similarity=1.0))
  lib.entries.append(experience.Entry(experience.frozenlake_key(a), "strategy", "tip: right", 1.0, 0))
  assert [e.text for e in lib.retrieve(experience.frozenlake_key(b))] == ["tip: right"]
  assert lib.retrieve(experience.frozenlake_key(c)) == []


def _episodes(rng, n_keys, n_eps):
  out = []
  for i in range(n_eps):
    steps = tuple(experience.StepView(key=f"k{rng.integers(n_keys)}", observation=f"o{j}",
                                      action=f"a{rng.integers(50)}", action_valid=True,
                                      next_observation=f"o{j + 1}", done=j == 2)
                  for j in range(3))
    success = bool(rng.random() < 0.5)
    out.append(experience.Episode(seed=i // 4, steps=steps, ret=float(success), success=success))
  return out


def test_library_size_and_admissions_stay_bounded():
  cfg = experience.LibraryConfig(admission_threshold=0.1, max_admissions_per_update=6,
                                 max_per_key=2, max_entries=10, episodes_per_update=16)
  lib = experience.ExperienceLibrary(cfg)
  rng = np.random.default_rng(0)
  for _ in range(20):
    before = len(lib)
    admitted = lib.update(_episodes(rng, n_keys=8, n_eps=16))
    assert admitted <= 6
    assert len(lib) <= min(before + admitted, 10)
    per_key = {}
    for e in lib.entries:
      per_key[e.key] = per_key.get(e.key, 0) + 1
    assert max(per_key.values(), default=0) <= 2
  assert 0 < len(lib) <= 10


def test_score_threshold_blocks_zero_advantage_episodes():
  # Every episode of a seed has the same return -> GRPO advantage 0 -> score 0 < threshold.
  lib = experience.ExperienceLibrary(experience.LibraryConfig(admission_threshold=0.01))
  eps = _episodes(np.random.default_rng(1), 4, 8)
  eps = [e._replace(ret=1.0, success=True) for e in eps]
  assert lib.update(eps) == 0 and len(lib) == 0


def test_wrapper_with_empty_library_equals_base_env_and_injects_after_extraction():
  kw = {"size": 4, "hole_prob": 0.2, "max_turns": 10}
  env = registry.make("slea", env="frozenlake", env_kwargs=kw, library="test_wrapper",
                      episodes_per_update=2, admission_threshold=0.1)
  base = registry.make("frozenlake", **kw)
  assert env.reset(7) == base.reset(7)
  for action in ("right", "down", "left"):
    r1, r2 = env.step(action), base.step(action)
    assert r1.observation == r2.observation and r1.reward == r2.reward
  # Two episodes of the same seed, one success (expert) and one failure (invalid words).
  for actor in ("expert", "bad"):
    env.reset(11)
    done = False
    while not done:
      done = env.step(env.expert_action() if actor == "expert" else "jump").done
  assert len(env.library) > 0
  assert "experience:" in env.reset(11)
  # Held-out seeds read the library but never write to it.
  size = len(env.library)
  for _ in range(2):
    env.reset(2_000_000_000)
    while not env.step("jump").done:
      pass
  assert len(env.library) == size and not env.library.pending


def test_state_dict_round_trip():
  lib = experience.ExperienceLibrary(experience.LibraryConfig(admission_threshold=0.1))
  lib.update(_episodes(np.random.default_rng(2), 4, 8))
  other = experience.ExperienceLibrary()
  other.load_state_dict(lib.state_dict())
  assert [(e.key, e.text, e.score) for e in other.entries] == [
      (e.key, e.text, e.score) for e in lib.entries]


def test_shared_library_name_with_another_config_is_an_error():
  experience.library("test_clash", experience.LibraryConfig(max_per_key=2))
  assert experience.library("test_clash").config.max_per_key == 2
  with pytest.raises(ValueError, match="test_clash"):
    experience.library("test_clash", experience.LibraryConfig(max_per_key=3))
