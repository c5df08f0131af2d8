"""An env's missing package or program is one line with the install hint at launch (before the
model is built), and an env whose every step faults stops the run."""

import importlib.util
import pathlib
import shutil

import pytest

import agentrl_jax.envs  # noqa: F401  (registers the built-in envs)
from agentrl_jax.envs import registry

REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "experiments" / "configs" / "quickstart.gin")

# (env, what it needs, the kind of requirement)
NEEDS = [("textworld", "textworld", "module"), ("textworld_express", "textworld_express", "module"),
         ("textworld_express", "java", "program"), ("search_qa", "bm25s", "module")]


@pytest.fixture
def hide(monkeypatch):
  """Makes the named modules and programs look uninstalled, whether or not they are here."""
  hidden = set()
  find_spec, which = importlib.util.find_spec, shutil.which
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name in hidden else find_spec(name, *a))
  monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name in hidden else which(
      name, *a, **k))
  return hidden


@pytest.mark.parametrize("env,needed,kind", NEEDS, ids=[f"{e}-{n}" for e, n, _ in NEEDS])
def test_missing_dependency_is_one_line_with_the_install_hint(hide, env, needed, kind):
  hide.update(n for e, n, _ in NEEDS if e == env)  # every requirement of the env gone
  with pytest.raises(registry.MissingDependencyError) as info:
    registry.check_requirements(env)
  message = str(info.value)
  assert "\n" not in message and f"env {env!r} needs" in message, message
  assert "pip install 'agentrl_jax[envs]'" in message or "Java" in message, message


def test_java_alone_missing_names_java(hide):
  if importlib.util.find_spec("textworld_express") is None:
    pytest.skip("textworld_express is not installed here; its own check comes first")
  hide.add("java")
  with pytest.raises(registry.MissingDependencyError, match="'java'.*Java runtime"):
    registry.check_requirements("textworld_express")


def test_a_run_stops_before_the_model_with_the_hint(hide, tmp_path, capsys):
  hide.add("bm25s")
  spec = importlib.util.spec_from_file_location("run", REPO / "experiments" / "run.py")
  run = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(run)
  code = run.main([f"--gin_file={QUICKSTART}", "--gin_bindings=configs.TrainConfig.env_name = "
                   "'search_qa'", "--gin_bindings=configs.TrainConfig.env_kwargs = {}",
                   f"--workdir={tmp_path / 'run'}"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1, err
  assert "env 'search_qa' needs the Python package 'bm25s'" in err, err
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_installed_requirements_pass():
  for name in registry.names():
    if all(not r.missing() for r in registry._REQUIRES.get(name, ())):  # pylint: disable=protected-access
      registry.check_requirements(name)


class _Fault:
  kind, detail = "exception", "RuntimeError: engine crashed"


def test_an_env_faulting_on_every_step_stops_with_its_error():
  with pytest.raises(registry.EnvFaultError, match="faulted on all 4 steps.*engine crashed"):
    registry.check_env_faults("frozenlake", 4, [_Fault()] * 4)
  registry.check_env_faults("frozenlake", 4, [_Fault()] * 3)  # some steps ran: isolated faults
  registry.check_env_faults("frozenlake", 0, [])
