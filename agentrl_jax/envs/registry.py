"""Name → environment class registry: `register`, `make`, `names`.

Importing `agentrl_jax.envs` imports every built-in environment module, which registers it here;
that is the package's only import-time side effect.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, TypeVar

from agentrl_jax.envs import base

_EnvT = TypeVar("_EnvT", bound=type[base.TextEnv])

_REGISTRY: dict[str, type[base.TextEnv]] = {}


def register(name: str) -> Callable[[_EnvT], _EnvT]:
  """Class decorator registering a `TextEnv` subclass under `name` (also sets `cls.name`).

  Args:
    name: registry name, lowercase.

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
