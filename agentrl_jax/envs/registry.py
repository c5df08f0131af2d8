"""Name → environment class registry: `register`, `make`, `names`.

Importing `agentrl_jax.envs` imports every built-in environment module, which registers it here;
that is the package's only import-time side effect.

An env registered with `requires` (a Python package, a program on PATH) can be checked for them
with `check_requirements` when the config is resolved (experiments/run.py does, at launch), so a
missing dependency is one line with its install hint, not an ImportError inside a rollout worker
on the first reset. `make` itself does not check: an env object can be built (and its code
inspected) without its engine installed.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import inspect
import shutil
from typing import Any, Callable, Sequence, TypeVar

from agentrl_jax import config_errors
from agentrl_jax.envs import base

_EnvT = TypeVar("_EnvT", bound=type[base.TextEnv])

_REGISTRY: dict[str, type[base.TextEnv]] = {}
_REQUIRES: dict[str, tuple[Requirement, ...]] = {}
ENVS_EXTRA = "pip install 'agentrl_jax[envs]'"


class MissingDependencyError(config_errors.ConfigError):
  """An env's package or program is not installed; the message is one line with the fix."""


class EnvFaultError(RuntimeError):
  """Every step of an env faulted: the env is broken, not the policy."""


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Requirement:
  """Something an env needs beyond the core dependencies.

  Attributes:
    module: a top-level Python module that must be importable (found, not imported: importing
      textworld takes seconds), or None.
    program: an executable that must be on PATH (e.g. "java"), or None.
    install: how to get it, quoted in the error.
  """

  module: str | None = None
  program: str | None = None
  install: str = ENVS_EXTRA

  def __post_init__(self):
    config_errors.check_field_types(self)
    if (self.module is None) == (self.program is None):
      raise ValueError(f"Requirement needs exactly one of module and program, got {self!r}")

  def missing(self) -> bool:
    if self.module is not None:
      return importlib.util.find_spec(self.module) is None
    return shutil.which(self.program) is None

  def describe(self) -> str:
    if self.module is not None:
      return f"the Python package {self.module!r}, which is not installed"
    return f"the program {self.program!r}, which is not on PATH"


def register(name: str, *, requires: Sequence[Requirement] = ()) -> Callable[[_EnvT], _EnvT]:
  """Class decorator registering a `TextEnv` subclass under `name` (also sets `cls.name`).

  Args:
    name: registry name, lowercase.
    requires: what the env needs installed; `make` checks it first.

  Returns:
    The decorator; it returns the class unchanged apart from `name`.

  Raises:
    ValueError: if `name` is already taken by a different class.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"env name must be a non-empty str, got {name!r}")

  def decorator(cls: _EnvT) -> _EnvT:
    if not (isinstance(cls, type) and issubclass(cls, base.TextEnv)):
      raise TypeError(f"register({name!r}) needs a TextEnv subclass, got {cls!r}")
    existing = _REGISTRY.get(name)
    # Re-registering the same qualified class is a module reload (notebooks), not a clash.
    if existing is not None and _qualname(existing) != _qualname(cls):
      raise ValueError(
          f"env name {name!r} is already registered to {_qualname(existing)}; "
          f"cannot register {_qualname(cls)}")
    cls.name = name
    _REGISTRY[name] = cls
    _REQUIRES[name] = tuple(requires)
    return cls

  return decorator


def names() -> list[str]:
  """The registered environment names, sorted."""
  return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> base.TextEnv:
  """Builds the environment registered as `name` with constructor arguments `kwargs`.

  Args:
    name: a registered name, see `names()`.
    **kwargs: constructor arguments of that environment.

  Returns:
    A new environment; call `reset(seed)` before `step`.

  Raises:
    ValueError: unknown `name` (the message lists the known names and the closest match), or
      an argument value the environment rejects.
    TypeError: an argument the environment does not take.
  """
  cls = _REGISTRY.get(name)
  if cls is None:
    raise ValueError(_unknown_name_message(name))
  _check_kwargs(name, cls, kwargs)
  try:
    return cls(**kwargs)
  except ValueError as e:
    raise ValueError(f"make({name!r}): {e}") from e


def check_requirements(name: str) -> None:
  """Raises MissingDependencyError for the first of env `name`'s requirements that is missing.

  The message reads e.g. "env 'textworld' needs the Python package 'textworld', which is not
  installed: pip install 'agentrl_jax[envs]'".
  """
  if name not in _REGISTRY:
    raise ValueError(_unknown_name_message(name))
  for requirement in _REQUIRES.get(name, ()):
    if requirement.missing():
      raise MissingDependencyError(
          f"env {name!r} needs {requirement.describe()}: {requirement.install}")


def check_env_faults(name: str, steps: int, faults: Sequence[Any]) -> None:
  """Stops a run whose env faulted on every step it was asked to take.

  A rollout counts a faulted step as a failed episode, so an env that cannot run at all (a
  missing data file, a crashed engine) would otherwise train on nothing and report a success of
  0. Call it after each rollout with the steps taken and the faults seen (the workers'
  `StepFault`s, or anything with `kind` and `detail`).

  Args:
    name: the env's registry name, for the message.
    steps: env steps attempted in the rollout.
    faults: the faults among them.

  Raises:
    EnvFaultError: `steps` > 0 and every one faulted; the message quotes the first fault.
  """
  if steps > 0 and len(faults) >= steps:
    first = faults[0]
    raise EnvFaultError(f"env {name!r} faulted on all {steps} steps of a rollout; the first: "
                        f"{getattr(first, 'kind', 'fault')}: {getattr(first, 'detail', first)}")


def _unknown_name_message(name: Any) -> str:
  known = names()
  message = f"unknown env {name!r}; known envs: {', '.join(known) or '(none)'}"
  close = difflib.get_close_matches(str(name).lower(), known, n=1, cutoff=0.5)
  if close:
    message += f"; did you mean {close[0]!r}?"
  return message


def _check_kwargs(name: str, cls: type[base.TextEnv], kwargs: dict[str, Any]) -> None:
  # Checked against the signature up front so the message names the env and the argument, rather
  # than Python's "__init__() got an unexpected keyword argument".
  params = inspect.signature(cls.__init__).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return
  accepted = [p for p in params if p != "self"]
  for key in kwargs:
    if key not in accepted:
      hint = difflib.get_close_matches(key, accepted, n=1)
      suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
      raise TypeError(
          f"env {name!r} has no argument {key!r}; it takes {', '.join(accepted)}{suggestion}")


def _qualname(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"
