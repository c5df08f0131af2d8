"""Parses gin files and bindings, turning gin's errors into one line that names the culprit.

Configs follow t5x: every `.gin` file opens with `from __gin__ import dynamic_registration` and
binds library functions and classes by their module alias (`configs.TrainConfig.seed = 3`). A
mistake in a binding then fails at parse time, before any compute, as a `ConfigError` such as

  --gin_bindings 'configs.TrainConfig.num_iteratons=3': configs.TrainConfig has no parameter
  'num_iteratons'; did you mean parameter 'num_iterations'?

Each file and each binding is parsed on its own so an error is attributed to exactly one of
them. A literal value bound to a field of a config dataclass is checked against the field's type
annotation as soon as it is parsed (`check_field_types` checks the same at construction, for
values that arrive through references or from Python). Bindings are parsed with the dynamic-registration import and the files' imports prepended,
so a command-line binding may name any function of a module the config (or `default_imports`)
imports, not only the ones the files already bind.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import difflib
import functools
import inspect
import logging
import numbers
import os
import re
import sys
import types
import typing
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


class ConfigTypeError(ConfigError, TypeError):
  """A config field holds a value of the wrong type (a string where a number belongs, ...)."""


def config_class(cls: type) -> type:
  """Class decorator for a config dataclass: the checks in its `__post_init__` raise ConfigErrors.

  A bad value surfaces while gin builds an entry's arguments, or when a caller builds the config
  in Python; as a ConfigError (still a ValueError, a TypeError stays one too) the entry point
  reports it in one line by its type, without reading the message gin wraps around it.
  """
  check = cls.__post_init__

  @functools.wraps(check)
  def __post_init__(self):
    try:
      check(self)
    except ConfigError:
      raise
    except TypeError as e:
      raise ConfigTypeError(str(e)) from e
    except ValueError as e:
      raise ConfigError(str(e)) from e

  cls.__post_init__ = __post_init__
  return cls


def parse_config(gin_files: Sequence[str], gin_bindings: Sequence[str], *,
                 search_paths: Sequence[str] = (),
                 default_imports: Sequence[str] = (),
                 default_bindings: Sequence[str] = ()) -> dict[tuple[str, str], dict[str, Any]]:
  """Parses `default_bindings`, then `gin_files`, then `gin_bindings` into gin's global config.

  Args:
    gin_files: paths of `.gin` files, parsed in order; relative paths are also looked up under
      `search_paths`.
    gin_bindings: binding strings such as `"learner.train.num_iterations = 3"`, applied after
      the files, in order.
    search_paths: extra directories for gin files and their `include`s.
    default_imports: import statements (e.g. `"from agentrl_jax.learner import learner"`)
      available to bindings even when no file imports them.
    default_bindings: bindings parsed first, which the files and bindings may override (e.g.
      the entry point's `learner.run.entry = @learner.train`).

  Returns:
    The bindings as they stood after `default_bindings`, for `require_bindings`.

  Raises:
    ConfigError: a file is missing, or a file or binding does not parse or names an unknown
      module, function or parameter. The message is one line.
  """
  with _quiet_include_search():
    return _parse_files_and_bindings(gin_files, gin_bindings, search_paths, default_imports,
                                     default_bindings)


class _IncludeSearchFilter(logging.Filter):
  """Drops gin's "Path not found" errors: it logs one for every search path an `include` is not
  under before it finds the file, which reads as a failure when nothing failed."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.pathname.endswith(os.path.join("gin", "resource_reader.py"))
                and record.msg == "Path not found: %s")


@contextlib.contextmanager
def _quiet_include_search():
  quiet = _IncludeSearchFilter()
  logging.getLogger().addFilter(quiet)
  try:
    yield
  finally:
    logging.getLogger().removeFilter(quiet)


def _parse_files_and_bindings(gin_files, gin_bindings, search_paths, default_imports,
                              default_bindings):
  paths = [_find_gin_file(gin_file, search_paths) for gin_file in gin_files]
  _check_importable(default_imports)
  if default_bindings:
    gin.parse_config("\n".join([_DYNAMIC_REGISTRATION, *default_imports, *default_bindings]))
  defaults = _bound_values()
  # A file's `include`s are also looked up beside it (base files next to the configs using them),
  # also when the file is itself included from elsewhere.
  directories = [*search_paths]
  for path in paths:
    directories += _include_directories(path, search_paths)
  for path in _unique(directories):
    gin.add_config_file_search_path(path)
  file_imports = []
  for path in paths:
    with open(path, encoding="utf-8") as f:
      file_imports += _import_lines(f.read())
    before = _bound_values()
    _parse_or_explain(lambda p=path: gin.parse_config_file(p), source=path,
                      imports=[*default_imports, *file_imports])
    _check_bound_types(before, path)
  imports = _unique([*default_imports, *file_imports, *_import_lines(gin.config_str())])
  preamble = "\n".join([_DYNAMIC_REGISTRATION, *imports])
  for binding in gin_bindings:
    source = f"--gin_bindings {binding!r}"
    before = _bound_values()
    _parse_or_explain(lambda b=binding: gin.parse_config(f"{preamble}\n{b}"), source=source,
                      imports=imports)
    _check_bound_types(before, source)
  return defaults


def require_bindings(start_from: str,
                     defaults: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
  """Refuses a config that binds nothing: a launch without one trains nothing anyone chose.

  Args:
    start_from: what the message suggests instead, e.g. "--gin_file=experiments/configs/quickstart.gin".
    defaults: `parse_config`'s return value; bindings equal to these do not count.

  Raises:
    ConfigError: no file or binding parsed so far sets any value.
  """
  if _bound_values() == (defaults or {}):
    raise ConfigError("the config binds nothing (no --gin_file or --gin_bindings sets a value); "
                      f"start from the quickstart: {start_from}")


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


_INCLUDE = re.compile(r"""^include\s+['"]([^'"]+)['"]""", re.M)


def _include_directories(path: str, search_paths: Sequence[str], seen=None) -> list[str]:
  """The directory of `path` and of every file it includes, recursively (each file's own
  includes are written relative to where it sits)."""
  seen = set() if seen is None else seen
  path = os.path.abspath(path)
  if path in seen:
    return []
  seen.add(path)
  here = os.path.dirname(path)
  found = [here]
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return found  # gin reports the unreadable file itself
  for name in _INCLUDE.findall(text):
    candidates = [name] if os.path.isabs(name) else [
        os.path.join(d, name) for d in (here, *search_paths)]
    target = next((c for c in candidates if os.path.isfile(c)), None)
    if target is not None:
      found += _include_directories(target, search_paths, seen)
  return found


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


# ---------------------------------------------------------------------------------------------
# Field types.


def check_field_types(instance: Any) -> None:
  """Checks every field of a dataclass instance against its resolved type annotation.

  Called first thing in each config dataclass's `__post_init__`, so the range checks after it
  compare numbers with numbers (a string bound to an int field used to surface as Python's
  "'<' not supported between instances of 'str' and 'int'"). Understood annotations: `int` (not
  bool), `float` (an int is accepted), `bool`, `str`, `None`, unions and `Optional`, `Literal`,
  `tuple[X, ...]` and fixed tuples (a list is accepted), `list`/`Sequence`, `dict`/`Mapping`,
  `Callable`, dataclasses and other plain classes; anything else is not checked. 0-d JAX and
  NumPy arrays count as numbers of their dtype's kind.

  Args:
    instance: a dataclass instance.

  Raises:
    ConfigTypeError: naming the class, the field, the value and the expected type, e.g.
      "configs.TrainConfig.num_iterations expects int, got 'many' (str)".
  """
  cls = type(instance)
  for name, hint in _field_hints(cls).items():
    value = getattr(instance, name)
    if not _matches(value, hint):
      raise ConfigTypeError(type_error_message(cls, name, value, hint))


def type_error_message(cls: type, name: str, value: Any, hint: Any) -> str:
  """"<module alias>.<Class>.<field> expects <type>, got <value> (<type of value>)"."""
  shown = repr(value)
  if len(shown) > 80:
    shown = shown[:77] + "..."
  return (f"{configurable_name(cls)}.{name} expects {describe_type(hint)}, got {shown} "
          f"({type(value).__name__})")


def configurable_name(cls: type) -> str:
  """The name a gin binding uses for `cls`: its module's last component, then the class."""
  return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__}"


@functools.lru_cache(maxsize=None)
def _field_hints(cls: type) -> dict[str, Any]:
  """Each init field's annotation, resolved; a field whose annotation does not resolve (a name
  imported only under TYPE_CHECKING) is left out rather than guessed."""
  fields = [f.name for f in dataclasses.fields(cls) if f.init]
  try:
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in fields if name in hints}
  except Exception:  # pylint: disable=broad-except
    pass
  namespace = dict(vars(sys.modules[cls.__module__])) if cls.__module__ in sys.modules else {}
  resolved = {}
  for name in fields:
    annotation = cls.__annotations__.get(name) if hasattr(cls, "__annotations__") else None
    if annotation is None:
      continue
    if isinstance(annotation, str):
      try:
        annotation = eval(annotation, namespace)  # pylint: disable=eval-used
      except Exception:  # pylint: disable=broad-except
        continue
    resolved[name] = annotation
  return resolved


def _array_kind(value: Any) -> str | None:
  """The dtype kind ('b', 'i', 'u', 'f', ...) of a 0-d array or array scalar, else None."""
  dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
  if dtype is None or shape != ():
    return None
  return getattr(dtype, "kind", None)


def _matches(value: Any, hint: Any) -> bool:  # pylint: disable=too-many-return-statements
  """Whether `value` is an instance of the annotation `hint` (True where `hint` is not understood)."""
  if hint is Any or hint is object:
    return True
  if hint is None or hint is type(None):
    return value is None
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union or origin is types.UnionType:
    return any(_matches(value, arg) for arg in args)
  if origin is typing.Literal:
    # `True == 1`: a literal matches only a value of its own type.
    return any(value == arg and type(value) is type(arg) for arg in args)
  if hint is bool:
    return isinstance(value, bool) or _array_kind(value) == "b"
  if hint is int:
    return ((isinstance(value, numbers.Integral) and not isinstance(value, bool))
            or _array_kind(value) in ("i", "u"))
  if hint is float:
    return ((isinstance(value, numbers.Real) and not isinstance(value, bool))
            or _array_kind(value) in ("i", "u", "f"))
  if hint is str:
    return isinstance(value, str)
  if origin is tuple:
    if not isinstance(value, (tuple, list)):
      return False
    if len(args) == 2 and args[1] is Ellipsis:
      return all(_matches(item, args[0]) for item in value)
    if args == ((),):  # tuple[()]
      return not value
    return not args or (len(value) == len(args) and all(map(_matches, value, args)))
  if origin in (list, collections.abc.Sequence, collections.abc.MutableSequence):
    if not isinstance(value, (tuple, list)):
      return False
    return not args or all(_matches(item, args[0]) for item in value)
  if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
    if not isinstance(value, collections.abc.Mapping):
      return False
    if len(args) != 2:
      return True
    return all(_matches(k, args[0]) and _matches(v, args[1]) for k, v in value.items())
  if origin is collections.abc.Callable or hint is collections.abc.Callable:
    return callable(value)
  if origin is not None:
    hint = origin
  if isinstance(hint, type):
    try:
      return isinstance(value, hint)
    except TypeError:
      return True
  return True  # a TypeVar, a string left unresolved, ...: not checked


def describe_type(hint: Any) -> str:
  """A short human-readable form of an annotation: "int", "float or None", "tuple of int"."""
  if hint is None or hint is type(None):
    return "None"
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin is typing.Union or origin is types.UnionType:
    return " or ".join(describe_type(arg) for arg in args)
  if origin is typing.Literal:
    return "one of " + ", ".join(repr(arg) for arg in args)
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return f"tuple of {describe_type(args[0])}"
    return f"tuple ({', '.join(describe_type(a) for a in args)})" if args else "tuple"
  if origin in (list, collections.abc.Sequence, collections.abc.MutableSequence):
    return f"sequence of {describe_type(args[0])}" if args else "sequence"
  if origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
    if len(args) != 2:
      return "mapping"
    if args[1] is Any:
      return f"mapping with {describe_type(args[0])} keys"
    return f"mapping of {describe_type(args[0])} to {describe_type(args[1])}"
  if origin is collections.abc.Callable or hint is collections.abc.Callable:
    return "callable"
  if isinstance(hint, type):
    return configurable_name(hint) if dataclasses.is_dataclass(hint) else hint.__name__
  return str(hint).replace("typing.", "")


def _bound_values() -> dict[tuple[str, str], dict[str, Any]]:
  """A shallow copy of gin's bindings, {(scope, selector): {parameter: value}}.

  gin offers no public way to list every binding; `gin.config._CONFIG` is the one place they
  all live (gin's own finalize hooks are handed this same object).
  """
  return {key: dict(values) for key, values in gin.config._CONFIG.items()}  # pylint: disable=protected-access


def _check_bound_types(before: dict[tuple[str, str], dict[str, Any]], source: str) -> None:
  """Checks the literal values `source` bound to config dataclass fields against their types.

  Values holding a reference or macro are left to `check_field_types` at construction.
  """
  for key, values in _bound_values().items():
    old = before.get(key, {})
    for parameter, value in values.items():
      if parameter in old and old[parameter] is value:
        continue
      cls = _dataclass_of(key[1])
      if cls is None or _holds_reference(value):
        continue
      hint = _field_hints(cls).get(parameter)
      if hint is not None and not _matches(value, hint):
        raise ConfigTypeError(f"{source}: {type_error_message(cls, parameter, value, hint)}")


def _dataclass_of(selector: str) -> type | None:
  try:
    wrapped = gin.get_configurable(selector)
  except Exception:  # pylint: disable=broad-except
    return None
  # gin's class wrapper may be a subclass; the dataclass it wraps is the first one in the MRO.
  for cls in getattr(wrapped, "__mro__", ()):
    if dataclasses.is_dataclass(cls) and "__dataclass_fields__" in vars(cls):
      return cls
  return None


def _holds_reference(value: Any) -> bool:
  if isinstance(value, gin.config.ConfigurableReference):
    return True
  if isinstance(value, (tuple, list, set, frozenset)):
    return any(_holds_reference(item) for item in value)
  if isinstance(value, dict):
    return any(_holds_reference(k) or _holds_reference(v) for k, v in value.items())
  return False
