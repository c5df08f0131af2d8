"""Finished behaviour-cloning warm starts, kept by what determines them.

Several RL seeds from one clone (`TrainConfig.init_seed`) would each clone the same policy
again: on the slower envs that is most of a seed's time. With `WarmStartConfig.reuse_dir` the
first run to need a clone computes it and saves its weights there as `<key>.npz`; every later
run whose clone has the same key loads them instead. The key hashes the configuration that
determines the clone (the warm start's settings, the initial weights' seed, the env and its
arguments, the model, the rollout, the tokenizer, the starting checkpoint), not the code: after
changing an env's expert or the shipped tokenizer, start from an empty directory.

Runs sharing a directory take a file lock per key, so of several seeds launched together one
clones and the others wait for its file (a killed run releases the lock; the next one clones).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from agentrl_jax import files

PyTree = Any
# Part of every key: bump it when the file layout changes.
_FORMAT = 1


def canonical(value: Any) -> Any:
  """`value` as JSON-ready data that does not depend on dict order or container type."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {"<class>": type(value).__qualname__,
            **{f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
  if isinstance(value, Mapping):
    return {str(k): canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
  if isinstance(value, (list, tuple)):
    return [canonical(v) for v in value]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return repr(value)


def digest(tree: PyTree) -> str:
  """A hash of a pytree's structure and of every leaf's dtype, shape and bytes."""
  h = hashlib.sha256(str(jax.tree.structure(tree)).encode())
  for leaf in jax.tree.leaves(tree):
    array = np.asarray(jax.device_get(leaf))
    h.update(f"{array.dtype}{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
  return h.hexdigest()


def key_of(parts: Mapping[str, Any]) -> str:
  """A short hash of `parts` (the inputs that determine a clone)."""
  text = json.dumps({"format": _FORMAT, **canonical(parts)}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:20]


def check_directory(directory: str) -> None:
  """Refuses a directory the store cannot lock: an object store (gs://) or several processes.

  Raises:
    ValueError: naming the setting.
  """
  if files.is_remote(directory):
    raise ValueError(f"WarmStartConfig.reuse_dir={directory!r}: must be a local directory "
                     f"(runs sharing it lock its files)")
  if jax.process_count() > 1:
    raise ValueError("WarmStartConfig.reuse_dir: a saved clone is read by one process; this run "
                     f"has {jax.process_count()}")


@contextlib.contextmanager
def _locked(directory: str, key: str) -> Iterator[None]:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f"{key}.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _named_leaves(tree: PyTree) -> dict[str, Any]:
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def save(path: str, params: PyTree) -> None:
  """Writes `params` whole to `path` (a temporary file renamed into place)."""
  arrays = {name: np.asarray(jax.device_get(leaf)) for name, leaf in _named_leaves(params).items()}
  temporary = f"{path}.tmp-{os.getpid()}.npz"
  np.savez(temporary, **arrays)
  os.replace(temporary, path)


def load(path: str, like: PyTree) -> PyTree:
  """The params saved at `path`, placed like the leaves of `like` (same tree, shapes, dtypes).

  Raises:
    ValueError: the file cannot be read or does not hold `like`'s leaves, naming what differs.
  """
  try:
    with np.load(path) as saved:
      arrays = {name: saved[name] for name in saved.files}
  except Exception as e:  # a truncated or foreign file: zipfile, pickle or OS errors
    raise ValueError(f"saved clone {path}: unreadable ({type(e).__name__}: {e})") from e
  expected = _named_leaves(like)
  if set(arrays) != set(expected):
    differ = sorted(set(arrays) ^ set(expected))
    raise ValueError(f"saved clone {path}: its leaves differ from the model's ({differ[:3]} ...)")
  for name, leaf in expected.items():
    if arrays[name].shape != leaf.shape or arrays[name].dtype != leaf.dtype:
      raise ValueError(f"saved clone {path}: leaf {name} is {arrays[name].dtype}"
                       f"{list(arrays[name].shape)}, the model's {leaf.dtype}{list(leaf.shape)}")
  placed = [jax.device_put(arrays[name], leaf.sharding) for name, leaf in expected.items()]
  return jax.tree.unflatten(jax.tree.structure(like), placed)


def reuse_or_clone(directory: str, parts: Mapping[str, Any], params: PyTree,
                   clone: Callable[[], PyTree]) -> tuple[PyTree, bool]:
  """The clone keyed by `parts` from `directory`, or `clone()`'s, saved there for the next run.

  `params` are the initial weights, whose tree, shapes and placement a loaded clone takes.

  Returns:
    `(cloned params, whether they were loaded)`.
  """
  directory = os.path.normpath(directory)
  key = key_of(parts)
  path = os.path.join(directory, f"{key}.npz")
  with _locked(directory, key):
    if os.path.exists(path):
      return load(path, params), True
    cloned = clone()
    save(path, cloned)
    files.write_text(os.path.join(directory, f"{key}.json"),
                     json.dumps(canonical(parts), indent=1, sort_keys=True))
    return cloned, False
