"""Parses gin files and bindings, turning gin's errors into one line that names the culprit.

Configs follow t5x: every `.gin` file opens with `from __gin__ import dynamic_registration` and
binds library functions and classes by their module alias (`configs.TrainConfig.seed = 3`). A
mistake in a binding then fails at parse time, before any compute, as a `ConfigError` such as

  --gin_bindings 'configs.TrainConfig.num_iteratons=3': configs.TrainConfig has no parameter
  'num_iteratons'; did you mean parameter 'num_iterations'?

Each file and each binding is parsed on its own so an error is attributed to exactly one of
them. Bindings are parsed with the dynamic-registration import and the files' imports prepended,
so a command-line binding may name any function of a module the config (or `default_imports`)
imports, not only the ones the files already bind.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from collections.abc import Sequence
from typing import Any

import gin

_DYNAMIC_REGISTRATION = "from __gin__ import dynamic_registration"
_IMPORT_LINE = re.compile(
    r"^\s*(from\s+[\w.]+\s+import\s+[\w., ]+|import\s+[\w.]+(\s+as\s+\w+)?)\s*$")
_NO_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_NO_CONFIGURABLE = re.compile(r"No configurable matching (?:reference )?'@?([^'(]+)(?:\(\))?'")
_UNRESOLVED_SELECTOR = re.compile(r"Couldn't resolve selector ([\w./]+);")
_NOT_IMPORTED = re.compile(r"'(\w+)' was not provided by an import statement")


class ConfigError(ValueError):
  """A gin file or binding is wrong; the message is one line naming it."""


def parse_config(gin_files: Sequence[str], gin_bindings: Sequence[str], *,
                 search_paths: Sequence[str] = (),
                 default_imports: Sequence[str] = ()) -> None:
  """Parses `gin_files` then `gin_bindings` into gin's global config (not finalized).

  Args:
    gin_files: paths of `.gin` files, parsed in order; relative paths are also looked up under
      `search_paths`.
    gin_bindings: binding strings such as `"learner.train.num_iterations = 3"`, applied after
      the files, in order.
    search_paths: extra directories for gin files and their `include`s.
    default_imports: import statements (e.g. `"from agentrl_jax.learner import learner"`)
      available to bindings even when no file imports them.

  Raises:
    ConfigError: a file is missing, or a file or binding does not parse or names an unknown
      module, function or parameter. The message is one line.
  """
  paths = [_find_gin_file(gin_file, search_paths) for gin_file in gin_files]
  _check_importable(default_imports)
  for path in search_paths:
    gin.add_config_file_search_path(path)
  file_imports = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      file_imports += _import_lines(f.read())
    _parse_or_explain(lambda p=path: gin.parse_config_file(p), source=path,
                      imports=[*default_imports, *file_imports])
  imports = _unique([*default_imports, *file_imports, *_import_lines(gin.config_str())])
  preamble = "\n".join([_DYNAMIC_REGISTRATION, *imports])
  for binding in gin_bindings:
    _parse_or_explain(lambda b=binding: gin.parse_config(f"{preamble}\n{b}"),
                      source=f"--gin_bindings {binding!r}", imports=imports)


def _check_importable(statements: Sequence[str]) -> None:
  for statement in statements:
    try:
      exec(statement, {})  # pylint: disable=exec-used
    except Exception as e:  # pylint: disable=broad-except
      raise ConfigError(f"{statement!r} failed: {_first_line(str(e)) or type(e).__name__}") from e


def _find_gin_file(gin_file: str, search_paths: Sequence[str]) -> str:
  candidates = [gin_file] + [os.path.join(d, gin_file) for d in search_paths]
  for candidate in candidates:
    if os.path.isfile(candidate):
      return candidate
  searched = f" (also searched {list(search_paths)})" if search_paths else ""
  raise ConfigError(f"--gin_file {gin_file!r}: no such file{searched}")


def _import_lines(text: str) -> list[str]:
  """The Python import statements of a gin config, without the dynamic-registration marker."""
  lines = [line.strip() for line in text.splitlines() if _IMPORT_LINE.match(line)]
  return [line for line in lines if "__gin__" not in line]


def _unique(items: Sequence[str]) -> list[str]:
  return list(dict.fromkeys(items))


def _parse_or_explain(parse, *, source: str, imports: Sequence[str]) -> None:
  """Runs `parse`, re-raising any failure as a one-line ConfigError about `source`."""
  try:
    parse()
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    # gin raises ValueError, AttributeError, NameError, SyntaxError, OSError and import errors;
    # whatever it raises, the user must learn which file or binding caused it.
    raise ConfigError(f"{source}{_line_of(e)}: {explain(e, imports)}") from e


def _line_of(error: Exception) -> str:
  """`:N` for an error inside a gin file (bindings are named by their text instead)."""
  if isinstance(error, SyntaxError) and error.filename and error.lineno:
    return f":{error.lineno}"
  match = re.search(r'In file "[^"]*", line (\d+)', str(error))
  return f":{match.group(1)}" if match else ""


def explain(error: Exception, imports: Sequence[str] = ()) -> str:
  """A one-line reason for a gin parse error, with a 'did you mean' where one is close.

  Args:
    error: what gin raised.
    imports: the config's import statements, used to find the module or function a binding
      names so its real parameter and attribute names can be suggested.
  """
  message = str(error)
  namespace = _import_namespace(imports)
  if match := _NO_PARAMETER.search(message):
    name, parameter = _unscoped(match.group(1)), match.group(2)
    return f"{name} has no parameter {parameter!r}{_parameter_hint(namespace, name, parameter)}"
  if match := (_NO_CONFIGURABLE.search(message) or _UNRESOLVED_SELECTOR.search(message)):
    name = _unscoped(match.group(1).strip())
    return f"no function or class {name!r}{_name_hint(namespace, name)}"
  if match := _NOT_IMPORTED.search(message):
    alias = match.group(1)
    return f"{alias!r} is not imported by the config{_closest(alias, _aliases(namespace), 'alias')}"
  if isinstance(error, SyntaxError):
    return f"syntax error: {error.msg}"
  return _first_line(message) or type(error).__name__


def _unscoped(name: str) -> str:
  return name.rsplit("/", 1)[-1]


def _first_line(text: str) -> str:
  return text.strip().splitlines()[0] if text.strip() else ""


def _import_namespace(imports: Sequence[str]) -> dict[str, Any]:
  """Executes the config's import statements, as gin itself does, to resolve dotted names."""
  namespace: dict[str, Any] = {}
  for statement in imports:
    try:
      exec(statement, namespace)  # pylint: disable=exec-used
    except Exception:  # pylint: disable=broad-except
      # A failing import is reported by gin itself; hints just get fewer candidates.
      pass
  return namespace


def _resolve(namespace: dict[str, Any], dotted: str) -> Any | None:
  parts = dotted.split(".")
  if parts[0] not in namespace:
    return None
  obj = namespace[parts[0]]
  for part in parts[1:]:
    if not hasattr(obj, part):
      return None
    obj = getattr(obj, part)
  return obj


def _parameter_hint(namespace: dict[str, Any], name: str, parameter: str) -> str:
  target = _resolve(namespace, name)
  if target is None:
    return ""
  try:
    signature = inspect.signature(target)
  except (TypeError, ValueError):
    return ""
  names = [p.name for p in signature.parameters.values()
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
  hint = _closest(parameter, names, "parameter")
  return hint or f" (its parameters: {', '.join(names) or 'none'})"


def _name_hint(namespace: dict[str, Any], name: str) -> str:
  """Suggests a fix for the first component of `name` that does not resolve."""
  parts = name.split(".")
  for depth in range(len(parts) - 1, 0, -1):
    parent = _resolve(namespace, ".".join(parts[:depth]))
    if parent is None:
      continue
    closest = _closest_word(parts[depth], [a for a in dir(parent) if not a.startswith("_")])
    if closest is None:
      return ""
    return f"; did you mean {'.'.join([*parts[:depth], closest, *parts[depth + 1:]])!r}?"
  if parts[0] in namespace:
    return ""
  closest = _closest_word(parts[0], _aliases(namespace))
  if closest is None:
    return f" ({parts[0]!r} is not imported by the config)"
  return f"; did you mean {'.'.join([closest, *parts[1:]])!r}?"


def _aliases(namespace: dict[str, Any]) -> list[str]:
  return [a for a in namespace if not a.startswith("__")]


def _closest_word(word: str, candidates: Sequence[str]) -> str | None:
  matches = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
  return matches[0] if matches else None


def _closest(word: str, candidates: Sequence[str], kind: str) -> str:
  closest = _closest_word(word, candidates)
  return f"; did you mean {kind} {closest!r}?" if closest else ""
