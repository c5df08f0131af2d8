"""Tests of the env registry and of the protocol helpers every env shares (envs/base.py)."""

import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from agentrl_jax import envs
from agentrl_jax.envs import base
from agentrl_jax.envs import registry


class _Counter(base.TextEnv):
  """Minimal env: counts to `max_turns`; "stop" ends early with success."""

  action_words = ("go", "stop")

  def __init__(self, max_turns: int = 3, label: str = "n"):
    super().__init__(max_turns)
    self.label = label

  def expert_action(self):
    return "go"

  def _reset(self, seed):
    return f"{self.label} 0"

  def _step(self, action):
    word = base.parse_action(action, self.action_words)
    if word == "stop":
      return base.StepResult("stopped", 1.0, True, {"action_valid": True, "success": True})
    return base.StepResult(f"{self.label} {self.turn}", 0.0, False,
                           {"action_valid": word is not None})


class _Broken(_Counter):

  def _step(self, action):
    return base.StepResult("x", 0.0, False, {})


@pytest.fixture
def scratch_registry(monkeypatch):
  """Lets a test register envs without leaking them into other tests."""
  monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_builtin_envs_are_registered():
  assert {"frozenlake", "dd_chain"} <= set(envs.names())
  assert envs.names() == sorted(envs.names())
  for name in envs.names():
    env = envs.make(name)
    assert isinstance(env, base.TextEnv) and env.name == name


def test_unknown_name_is_named_with_known_envs_and_a_suggestion():
  with pytest.raises(ValueError) as error:
    envs.make("frozen_lake")
  message = str(error.value)
  assert "'frozen_lake'" in message
  assert "dd_chain" in message and "frozenlake" in message
  assert "did you mean 'frozenlake'?" in message


def test_unknown_name_without_close_match_has_no_suggestion():
  with pytest.raises(ValueError, match="unknown env 'zzz'") as error:
    envs.make("zzz")
  assert "did you mean" not in str(error.value)


def test_unknown_argument_names_env_argument_and_suggestion():
  with pytest.raises(TypeError) as error:
    envs.make("frozenlake", sizee=5)
  message = str(error.value)
  assert "'frozenlake'" in message and "'sizee'" in message
  assert "did you mean 'size'?" in message


def test_bad_argument_value_names_env_and_argument():
  with pytest.raises(ValueError, match=r"make\('dd_chain'\): num_decisions"):
    envs.make("dd_chain", horizon=4, num_decisions=9)


def test_register_custom_env(scratch_registry):
  registry.register("counter")(_Counter)
  env = envs.make("counter", max_turns=2, label="c")
  assert env.name == "counter" and "counter" in envs.names()
  assert env.reset(0) == "c 0"
  registry.register("counter")(_Counter)  # Same class again (a reload) is fine.


def test_register_rejects_clashes_and_non_envs(scratch_registry):
  with pytest.raises(ValueError, match="already registered"):
    registry.register("frozenlake")(_Counter)
  with pytest.raises(TypeError, match="TextEnv subclass"):
    registry.register("thing")(dict)
  with pytest.raises(ValueError, match="non-empty"):
    registry.register("")


def test_base_enforces_lifecycle_cap_and_info_contract():
  env = _Counter(max_turns=3)
  with pytest.raises(RuntimeError, match="before reset"):
    env.step("go")
  env.reset(0)
  results = [env.step("go") for _ in range(3)]
  assert [r.done for r in results] == [False, False, True]
  assert results[-1].info == {"action_valid": True, "success": False}
  with pytest.raises(RuntimeError, match="after the episode ended"):
    env.step("go")
  with pytest.raises(AssertionError, match="action_valid"):
    broken = _Broken()
    broken.reset(0)
    broken.step("go")


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True, None])
def test_bad_seed_is_rejected(seed):
  with pytest.raises(ValueError, match="seed"):
    _Counter().reset(seed)


def test_numpy_seed_is_accepted():
  env = envs.make("frozenlake")
  assert env.reset(np.int64(4)) == env.reset(4)


def test_invalid_action_message():
  words = ("left", "down", "right", "up")
  assert base.invalid_action_message("jump", words) == (
      "invalid action 'jump': use left, down, right or up")
  assert base.invalid_action_message("  ", words) == "empty action: use left, down, right or up"
  assert base.invalid_action_message(None, ("0", "1")) == (
      "invalid action of type NoneType: use 0 or 1")
  # Cut to 16 characters ("ab\ncdab\ncdab\ncda"), then newlines become spaces.
  long = base.invalid_action_message("ab\ncd" * 2000, ("0", "1"))
  assert long == "invalid action 'ab cdab cdab cda...': use 0 or 1"


def test_observation_hash_normalises_case_whitespace_and_step_counter():
  expected = envs.observation_hash("f p\nh g")
  assert envs.observation_hash("F  P\n H G ") == expected
  assert envs.observation_hash("Step 3 of 10. F P\nH G") == expected
  assert envs.observation_hash("step 12/40: f p h g") == expected
  assert envs.observation_hash("F P\nG H") != expected
  # Turn numbers that are the state (DD-Chain) are not step counters.
  assert envs.observation_hash("turn 1 of 8") != envs.observation_hash("turn 2 of 8")


def test_observation_hash_is_crc32_folded_to_int32():
  texts = [f"board {i}" for i in range(200)]
  hashes = [envs.observation_hash(t) for t in texts]
  assert all(isinstance(h, int) and -2**31 <= h < 2**31 for h in hashes)
  assert any(h < 0 for h in hashes)  # The fold to signed is exercised.
  assert all(h % 2**32 == zlib.crc32(t.encode()) for h, t in zip(hashes, texts))
  assert np.asarray(hashes, dtype=np.int32).tolist() == hashes


def test_observation_hash_is_stable_across_processes():
  code = "from agentrl_jax.envs import base; print(base.observation_hash('Hello P F'))"
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # A different hash seed would change the builtin hash(); CRC-32 must not care.
  env = dict(os.environ, PYTHONHASHSEED="123", PYTHONPATH=root)
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                       text=True).stdout
  assert int(out) == envs.observation_hash("Hello P F")
