"""docs/adding_an_env.md works as written: its env file, test file and gin file, run as they are.

The guide's three code blocks carry their target path after the language (```python
agentrl_jax/envs/corridor.py). Each test writes them to tmp_path, imports the env file as the
module the guide names (so the test file's and the gin file's imports find it) and registers it
in a scratch registry, then plays, tests or parses it. Nothing is written into the repository.
"""

import importlib.util
import pathlib
import re
import sys

import gin
import pytest

from agentrl_jax import config_errors
from agentrl_jax import envs
from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "adding_an_env.md"
ENV_FILE = "agentrl_jax/envs/corridor.py"
TEST_FILE = "tests/envs/test_corridor.py"
GIN_FILE = "experiments/configs/corridor_grpo.gin"
MODULE = "agentrl_jax.envs.corridor"
ENV_NAME = "corridor"


def _blocks() -> dict[str, str]:
  """Target path -> code of every fenced block that names one."""
  found = re.findall(r"^```\w+ (\S+)\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)
  blocks = dict(found)
  assert len(blocks) == len(found), "two code blocks of the guide name the same file"
  return blocks


@pytest.fixture
def guide(tmp_path, monkeypatch):
  """The guide's files under tmp_path, with the env module imported and registered."""
  blocks = _blocks()
  assert set(blocks) == {ENV_FILE, TEST_FILE, GIN_FILE}, sorted(blocks)
  paths = {}
  for target, code in blocks.items():
    path = tmp_path / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    paths[target] = path
  monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
  assert ENV_NAME not in registry.names(), "the guide's env name is taken by a built-in env"
  spec = importlib.util.spec_from_file_location(MODULE, paths[ENV_FILE])
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, MODULE, module)
  monkeypatch.setattr(envs, "corridor", module, raising=False)
  spec.loader.exec_module(module)
  yield paths, module
  gin.clear_config()


def test_the_guide_names_its_three_files():
  assert set(_blocks()) == {ENV_FILE, TEST_FILE, GIN_FILE}


def test_env_registers_and_the_expert_plays_an_episode(guide):
  _, module = guide
  assert ENV_NAME in registry.names()
  env = registry.make(ENV_NAME)
  assert isinstance(env, module.Corridor) and env.name == ENV_NAME
  for seed in range(20):
    observation, results = env.reset(seed), []
    assert observation
    while not results or not results[-1].done:
      results.append(env.step(env.expert_action()))
    assert results[-1].info["success"] and results[-1].reward == 1.0
    assert all(r.info["action_valid"] for r in results)
    assert len(results) <= env.max_turns


def test_action_words_are_single_tokens_of_the_shipped_tokenizer(guide):
  """The gin file restricts sampling to the action words, which needs one token per word."""
  tok = tokenizer_lib.load_tokenizer()
  env = registry.make(ENV_NAME)
  for word in env.action_words:
    tok.single_token_id(word)


def test_the_guides_tests_pass(guide):
  paths, _ = guide
  namespace = {"__name__": "test_corridor", "__file__": str(paths[TEST_FILE])}
  exec(compile(paths[TEST_FILE].read_text(), str(paths[TEST_FILE]), "exec"), namespace)
  tests = {name: fn for name, fn in namespace.items() if name.startswith("test_")}
  assert len(tests) >= 4, sorted(tests)
  for name, fn in tests.items():
    fn()  # fixture-free by design; a failure names the guide's test in the traceback


def test_gin_file_parses_with_a_header_and_builds_the_env(guide):
  paths, _ = guide
  text = paths[GIN_FILE].read_text()
  header = text.split("from __gin__", 1)[0]
  assert header.lstrip().startswith("#") and "experiments/run.py" in header
  gin.clear_config()
  config_errors.parse_config([str(paths[GIN_FILE])], [])
  assert gin.query_parameter("configs.TrainConfig.env_name") == ENV_NAME
  env_kwargs = gin.query_parameter("configs.TrainConfig.env_kwargs")
  env = registry.make(ENV_NAME, **env_kwargs)
  assert gin.query_parameter("loop.RolloutConfig.max_turns") == env.max_turns
  # The longest observation (an invalid action's message above the row) fits the bucket.
  env.reset(0)
  longest = env.step("x" * 10_000).observation
  tok = tokenizer_lib.load_tokenizer()
  assert len(tok.encode(longest)) <= max(gin.query_parameter("loop.RolloutConfig.obs_buckets"))
