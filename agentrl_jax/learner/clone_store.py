"""Finished behaviour-cloning warm starts, kept by what determines them.

Several RL seeds from one clone (`TrainConfig.init_seed`) would each clone the same policy
again: on the slower envs that is most of a seed's time. With `WarmStartConfig.reuse_dir` the
first run to need a clone computes it and saves its weights there as `<key>.npz`; every later
run whose clone has the same key loads them instead. The key hashes what determines the clone:
the warm start's settings, the initial weights, the tokens of the first batch of demonstrations
(so the env, its expert and noise, the tokenizer and the conversation format) and the token
restriction. A code change that alters only later demonstrations is not seen: after changing an
env's expert, start from an empty directory.

Runs sharing a directory take a file lock per key, so of several seeds launched together one
clones and the others wait for its file (a killed run releases the lock; the next one clones).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import time
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from agentrl_jax import files

PyTree = Any
# Part of every key: bump it when the file layout changes.
_FORMAT = 1
# How often a run waiting for another's clone checks whether it was asked to stop.
_POLL_S = 0.5


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
def _locked(directory: str, key: str, stop: Callable[[], bool]) -> Iterator[bool]:
  """Holds the key's lock, polling so that a stop request ends the wait; yields False then."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f"{key}.lock"), "w") as lock:
    while True:
      try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on close, or if the run dies
        break
      except BlockingIOError:
        if stop():
          yield False
          return
        time.sleep(_POLL_S)
    try:
      yield True
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _named_leaves(tree: PyTree) -> dict[str, Any]:
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


_META = "__meta__"


def save(path: str, tree: PyTree, meta: Mapping[str, Any] | None = None) -> None:
  """Writes `tree`'s leaves (and `meta`, JSON) whole to `path`, locally or on an object store."""
  arrays = {name: np.asarray(jax.device_get(leaf)) for name, leaf in _named_leaves(tree).items()}
  if meta is not None:
    arrays[_META] = np.asarray(json.dumps(dict(meta)))
  if files.is_remote(path):  # one upload of the whole file
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    files.write_bytes(path, buffer.getvalue())
    return
  # Locally the archive streams to a temporary file: a 135M-parameter model's weights and
  # optimizer state are 1.6 GB, which an in-memory copy would double.
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = f"{path}.tmp-{os.getpid()}"
  with open(temporary, "wb") as f:
    np.savez(f, **arrays)
  os.replace(temporary, path)


def load(path: str, like: PyTree) -> PyTree:
  """The tree saved at `path`, placed like the leaves of `like` (same tree, shapes, dtypes).

  Raises:
    ValueError: the file cannot be read or does not hold `like`'s leaves, naming what differs.
  """
  return load_with_meta(path, like)[0]


def _source(path: str):
  """What `np.load` reads: a local file in place, an object store's file fetched whole."""
  return io.BytesIO(files.read_bytes(path)) if files.is_remote(path) else path


def read_meta(path: str) -> dict[str, Any] | None:
  """The `meta` saved with the tree at `path`; None if the file is missing, unreadable or has
  none."""
  if not files.exists(path):
    return None
  try:
    with np.load(_source(path)) as saved:
      return json.loads(str(saved[_META])) if _META in saved.files else None
  except Exception:  # a damaged file: whoever loads the tree says so
    return None


def load_with_meta(path: str, like: PyTree) -> tuple[PyTree, dict[str, Any] | None]:
  """`load`, and the `meta` saved with the tree (None if none was)."""
  try:
    with np.load(_source(path)) as saved:
      arrays = {name: saved[name] for name in saved.files}
  except Exception as e:  # a missing, truncated or foreign file: zipfile, pickle or OS errors
    raise ValueError(f"saved clone {path}: unreadable ({type(e).__name__}: {e})") from e
  meta = json.loads(str(arrays.pop(_META))) if _META in arrays else None
  expected = _named_leaves(like)
  if set(arrays) != set(expected):
    differ = sorted(set(arrays) ^ set(expected))
    raise ValueError(f"saved clone {path}: its leaves differ from the model's ({differ[:3]} ...)")
  for name, leaf in expected.items():
    if arrays[name].shape != leaf.shape or arrays[name].dtype != leaf.dtype:
      raise ValueError(f"saved clone {path}: leaf {name} is {arrays[name].dtype}"
                       f"{list(arrays[name].shape)}, the model's {leaf.dtype}{list(leaf.shape)}")
  placed = [jax.device_put(arrays[name], getattr(leaf, "sharding", None))
            for name, leaf in expected.items()]
  return jax.tree.unflatten(jax.tree.structure(like), placed), meta


def reuse_or_clone(directory: str, parts: Mapping[str, Any], params: PyTree,
                   clone: Callable[[], PyTree | None],
                   stop: Callable[[], bool] = lambda: False) -> tuple[PyTree | None, bool]:
  """The clone keyed by `parts` from `directory`, or `clone()`'s, saved there for the next run.

  `params` are the initial weights, whose tree, shapes and placement a loaded clone takes.
  `clone()` returns None when it was stopped; so does this, also when `stop()` turns true while
  another run holds the key's lock.

  Returns:
    `(cloned params, whether they were loaded)`; `(None, False)` when stopped.
  """
  directory = os.path.normpath(directory)
  key = key_of(parts)
  path = os.path.join(directory, f"{key}.npz")
  with _locked(directory, key, stop) as held:
    if not held:
      return None, False
    if os.path.exists(path):
      return load(path, params), True
    cloned = clone()
    if cloned is None:
      return None, False
    save(path, cloned)
    files.write_text(os.path.join(directory, f"{key}.json"),
                     json.dumps(canonical(parts), indent=1, sort_keys=True))
    return cloned, False
