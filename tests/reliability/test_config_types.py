"""Every config dataclass type-checks its fields at construction, and run.py reports a wrong type
as one line naming the class, the parameter, the value and the expected type, before any compute.
"""

import dataclasses
import importlib
import importlib.util
import pathlib
import re
import typing

import pytest

from agentrl_jax import config_errors

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "experiments" / "configs" / "quickstart.gin")

# (binding, fragments the one-line error must contain: class.parameter, value, expected type)
WRONG_TYPES = [
    ("configs.TrainConfig.num_iterations = 'many'", ("configs.TrainConfig.num_iterations",
                                                     "'many'", "expects int")),
    ("configs.OptimConfig.learning_rate = 'fast'", ("configs.OptimConfig.learning_rate",
                                                    "'fast'", "expects float")),
    ("transformer.TransformerConfig.num_heads = 'four'",
     ("transformer.TransformerConfig.num_heads", "'four'", "expects int")),
    ("configs.TrainConfig.env_kwargs = 5", ("configs.TrainConfig.env_kwargs", "got 5",
                                            "expects mapping")),
    ("configs.TrainConfig.group_size = 2.5", ("configs.TrainConfig.group_size", "2.5",
                                              "expects int")),
    ("configs.TrainConfig.use_critic = 'yes'", ("configs.TrainConfig.use_critic", "'yes'",
                                                "expects bool")),
    ("loop.RolloutConfig.obs_buckets = (64, 'x')", ("loop.RolloutConfig.obs_buckets",
                                                    "expects tuple of int")),
    ("sampler.SamplingConfig.temperature = None", ("sampler.SamplingConfig.temperature",
                                                   "None", "expects float")),
    ("configs.EvalConfig.num_tasks = True", ("configs.EvalConfig.num_tasks", "True",
                                             "expects int")),
]

# Values for the fields some config classes require, so each can be built from its defaults.
REQUIRED = {"vocab_size": 32, "open_token_id": 1, "close_token_id": 2, "project": "p"}


@pytest.fixture(scope="module")
def main():
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


@pytest.mark.parametrize("binding,fragments", WRONG_TYPES, ids=[b for b, _ in WRONG_TYPES])
def test_wrong_type_on_the_command_line_is_one_line_naming_it(main, tmp_path, capsys, binding,
                                                              fragments):
  workdir = tmp_path / "run"
  code = main([f"--gin_file={QUICKSTART}", f"--gin_bindings={binding}", f"--workdir={workdir}"])
  err = capsys.readouterr().err
  assert code == 2, err
  assert err.startswith("error: --gin_bindings ") and len(err.strip().splitlines()) == 1, err
  assert repr(binding) in err, err  # the command-line text it came from
  for fragment in fragments:
    assert fragment in err, err
  assert "not supported between" not in err and "partial" not in err, err
  assert not workdir.exists(), "nothing may be written before the config is valid"


def test_wrong_type_in_a_gin_file_names_the_file(main, tmp_path, capsys):
  bad = tmp_path / "bad.gin"
  bad.write_text("from __gin__ import dynamic_registration\n"
                 "from agentrl_jax.learner import configs\n\n"
                 "configs.TrainConfig.seed = 'zero'\n")
  code = main([f"--gin_file={QUICKSTART}", f"--gin_file={bad}", f"--workdir={tmp_path / 'run'}"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1, err
  assert str(bad) in err and "configs.TrainConfig.seed expects int, got 'zero' (str)" in err, err
  assert not (tmp_path / "run").exists()


def test_python_construction_is_checked_too():
  from agentrl_jax.learner import configs  # pylint: disable=import-outside-toplevel
  with pytest.raises(config_errors.ConfigTypeError,
                     match=re.escape("configs.TrainConfig.num_iterations expects int, got 'many'")):
    configs.TrainConfig(num_iterations="many")
  with pytest.raises(TypeError):  # a ConfigTypeError is a TypeError and a ValueError
    configs.OptimConfig(learning_rate="fast")
  # An int is a fine float; a NumPy integer a fine int.
  configs.OptimConfig(learning_rate=1)
  configs.TrainConfig(group_size=__import__("numpy").int64(4))


def test_union_literal_tuple_and_nested_configs_are_understood():
  from agentrl_jax.models import transformer  # pylint: disable=import-outside-toplevel
  from agentrl_jax.rollout import loop, sampler  # pylint: disable=import-outside-toplevel
  transformer.TransformerConfig(vocab_size=8, num_kv_heads=None, head_dim=16, position="rope")
  with pytest.raises(config_errors.ConfigTypeError, match="expects int or None"):
    transformer.TransformerConfig(vocab_size=8, num_kv_heads="2")
  with pytest.raises(config_errors.ConfigTypeError, match="one of 'rope', 'turn_slot'"):
    transformer.TransformerConfig(vocab_size=8, position=3)
  loop.RolloutConfig(obs_buckets=[48, 64], sampling=sampler.SamplingConfig())
  with pytest.raises(config_errors.ConfigTypeError, match="sampler.SamplingConfig"):
    loop.RolloutConfig(sampling={"temperature": 1.0})


def _config_classes():
  """Every `*Config` dataclass defined in agentrl_jax, found from the source."""
  found = []
  for path in sorted((REPO / "agentrl_jax").rglob("*.py")):
    text = path.read_text()
    names = re.findall(r"@dataclasses\.dataclass\([^)]*\)\nclass (\w+Config)\b", text)
    if not names:
      continue
    module_name = ".".join(path.relative_to(REPO).with_suffix("").parts)
    try:
      module = importlib.import_module(module_name)
    except ImportError:  # an optional dependency (TFDS, ...) is missing here
      continue
    found += [getattr(module, name) for name in names]
  return found


CONFIG_CLASSES = _config_classes()


def _checkable_field(cls):
  hints = typing.get_type_hints(cls)
  for field in dataclasses.fields(cls):
    hint = hints.get(field.name)
    if field.init and hint not in (None, typing.Any, object):
      return field.name
  return None


def test_the_config_classes_were_found():
  names = {cls.__name__ for cls in CONFIG_CLASSES}
  assert {"TrainConfig", "OptimConfig", "TransformerConfig", "RolloutConfig",
          "LossConfig"} <= names, names


@pytest.mark.parametrize("cls", CONFIG_CLASSES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_config_class_checks_its_field_types(cls):
  required = {f.name: REQUIRED[f.name] for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
  cls(**required)  # the defaults themselves must pass
  name = _checkable_field(cls)
  assert name is not None
  with pytest.raises(config_errors.ConfigTypeError, match=re.escape(f"{cls.__qualname__}.{name} expects")):
    cls(**{**required, name: object()})
