"""Orbax checkpoints of the learner state that are never used half-written.

A checkpoint step holds three items in `<workdir>/checkpoints/<step>/`:

  state     the pytree of (possibly sharded) jax arrays, written by every process;
  extra     JSON host state (env seed cursor, iteration, metrics history), process 0 only;
  manifest  JSON, process 0 only: for every leaf its path, shape, dtype and a fingerprint.

Two failure modes are guarded against:

  * A crash during a save. Orbax writes a step into `<step>.orbax-checkpoint-tmp-<time>` (or, on
    GCS, marks completion with `commit_success.txt`) and only lists finalised steps, so an
    unfinished step is never seen by `latest_step` or `restore`.
  * A finalised step whose files were damaged afterwards (truncated, deleted, bit-flipped). Reading
    it either raises inside orbax/tensorstore or yields arrays whose fingerprints differ from the
    manifest. `restore()` then prints one line on stderr naming the step, its path and where it
    went, moves the step aside to `<workdir>/corrupt_checkpoints/` (so the step number can be
    saved again) and falls back to the previous step; `resume()` starts from scratch when no
    intact step is left. Garbage is never returned, and the libraries' own reports of the failed
    read (orbax/absl log lines, asyncio's "Event loop is closed" from a tensorstore callback that
    outlives the read) are held back: the one line says what happened.
"""

from __future__ import annotations

import dataclasses
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from agentrl_jax import config_errors
from agentrl_jax import files

PyTree = Any

CHECKPOINT_DIR = "checkpoints"
QUARANTINE_DIR = "corrupt_checkpoints"

_STATE = "state"
_EXTRA = "extra"
_MANIFEST = "manifest"
_MANIFEST_VERSION = 1

# An odd multiplier keeps every position weight odd, hence invertible mod 2**32: changing any
# single word always changes the fingerprint.
_POSITION_MULTIPLIER = 2654435761


class CorruptCheckpointError(RuntimeError):
  """A finalised checkpoint step cannot be read back intact."""


class Restored(NamedTuple):
  """What `Checkpointer.restore` returns."""

  state: PyTree
  extra: dict[str, Any]


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
  """How checkpoints are kept.

  Attributes:
    max_to_keep: newest finalised steps kept on disk; older ones are deleted after a save.
  """

  max_to_keep: int = 3

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {self.max_to_keep!r}")


class Checkpointer:
  """Saves and restores `(state pytree, extra JSON)` pairs under `<workdir>/checkpoints`.

  Saves are synchronous: `save` returns once the step is finalised on disk, so a crash right
  after it cannot lose that step. The caller decides when to save (e.g. every K iterations).

  Example:
    ckpt = Checkpointer(workdir)
    if (step := ckpt.latest_step()) is not None:
      state, extra = ckpt.restore(target=abstract_state)
    ...
    ckpt.save(iteration, state, {"iteration": iteration, "seed_cursor": cursor})
  """

  def __init__(self, workdir: str | os.PathLike[str], *,
               config: CheckpointConfig | None = None, max_to_keep: int | None = None):
    """Opens (creating if needed) the checkpoint directory of `workdir`.

    Args:
      workdir: the run's working directory.
      config: how checkpoints are kept; defaults to `CheckpointConfig()`.
      max_to_keep: shorthand overriding `config.max_to_keep`.
    """
    config = config or CheckpointConfig()
    if max_to_keep is not None:
      config = dataclasses.replace(config, max_to_keep=max_to_keep)
    self._workdir = os.fspath(workdir)
    if "://" not in self._workdir:  # orbax wants absolute local paths; gs:// stays as given
      self._workdir = os.path.abspath(self._workdir)
    self._directory = os.path.join(self._workdir, CHECKPOINT_DIR)
    self._quarantine_count = 0
    self._restored_step: int | None = None
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.max_to_keep,
        create=True,
        enable_async_checkpointing=False,
    )
    self._manager = ocp.CheckpointManager(
        self._directory, options=options, item_names=(_STATE, _EXTRA, _MANIFEST))

  @property
  def directory(self) -> str:
    return self._directory

  @property
  def restored_step(self) -> int | None:
    """The step the last successful `restore` read (it may be older than asked for)."""
    return self._restored_step

  def all_steps(self) -> list[int]:
    """Finalised steps on disk, oldest first."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest finalised step, or None when there is none."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def step_path(self, step: int) -> str:
    return os.path.join(self._directory, str(step))

  def save(self, step: int, state: PyTree, extra: dict[str, Any] | None = None) -> None:
    """Writes `state` and `extra` as checkpoint `step` and waits until it is finalised.

    Args:
      step: a step number larger than every step on disk.
      state: pytree of jax arrays (sharded or not), numpy arrays or scalars.
      extra: JSON-serialisable host state; restored verbatim.

    Raises:
      TypeError: `extra` is not JSON-serialisable.
      ValueError: `step` is not newer than the latest step on disk.
    """
    extra = {} if extra is None else dict(extra)
    _check_json_serialisable(extra)
    self._manager.reload()
    latest = self._manager.latest_step()
    if latest is not None and step <= latest:
      raise ValueError(
          f"checkpoint step {step} is not newer than the latest step {latest} in "
          f"{self._directory}")
    manifest = _manifest(state)
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(**{
            _STATE: ocp.args.StandardSave(state),
            _EXTRA: ocp.args.JsonSave(extra),
            _MANIFEST: ocp.args.JsonSave(manifest),
        }),
    )
    self._manager.wait_until_finished()
    if not saved:
      raise ValueError(f"orbax declined to save checkpoint step {step} in {self._directory}")

  def restore(self, step: int | None = None, *, target: PyTree) -> Restored:
    """Reads a checkpoint back into the structure, shapes and shardings of `target`.

    With `step=None` the newest intact step is used: a corrupt step is reported in one line on
    stderr naming it and its path, moved to `<workdir>/corrupt_checkpoints`, and the next older
    step is tried. `restored_step` tells which step was read.

    Args:
      step: the step to read, or None for the newest intact one. An explicit step that is
        corrupt raises instead of falling back.
      target: pytree matching the saved state whose leaves are `jax.ShapeDtypeStruct`s (with
        `.sharding` set to restore arrays already sharded) or concrete arrays used as templates.
        A leaf dtype differing from the saved one casts on restore.

    Returns:
      `Restored(state, extra)`.

    Raises:
      FileNotFoundError: there is no finalised step (or not the requested one).
      ValueError: `target`'s structure or a leaf's shape does not match the checkpoint; the
        message names the leaf path.
      CorruptCheckpointError: the requested step, or every step, is corrupt.
    """
    target = jax.tree.map(_abstract, target)
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(
            f"no finalised checkpoint step {step} in {self._directory} (steps: {steps})")
      restored = self._restore_step(step, target)
      self._restored_step = step
      return restored
    if not steps:
      raise FileNotFoundError(f"no finalised checkpoint in {self._directory}")
    for i, candidate in enumerate(reversed(steps)):
      try:
        restored = self._restore_step(candidate, target)
      except CorruptCheckpointError as e:
        older = i + 1 < len(steps)
        self._report_and_quarantine(
            candidate, e, then="falling back to an older step" if older else "no older step")
        continue
      self._restored_step = candidate
      return restored
    raise CorruptCheckpointError(
        f"every checkpoint step in {self._directory} is corrupt (tried {steps[::-1]})")

  def resume(self, *, target: PyTree) -> Restored | None:
    """What a launch restores: the newest intact step, or None to start from scratch.

    Like `restore(target=...)`, except that no checkpoint, or none left intact once the corrupt
    ones are moved aside, is not an error: the run starts over (one line says so when steps
    were there). `restored_step` is None then.

    Args:
      target: as for `restore`.

    Returns:
      `Restored(state, extra)`, or None.

    Raises:
      ValueError: `target` does not match the checkpoint (a different model, not damage).
    """
    self._restored_step = None
    if not self.all_steps():
      return None
    try:
      return self.restore(target=target)
    except CorruptCheckpointError:
      _say(f"no intact checkpoint left in {self._directory}; starting from scratch")
      return None

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _restore_step(self, step: int, target: PyTree) -> Restored:
    """Restores one step; damage raises CorruptCheckpointError, a wrong target ValueError."""
    with _library_reports_held_back():
      return self._restore_step_quietly(step, target)

  def _restore_step_quietly(self, step: int, target: PyTree) -> Restored:
    path = self.step_path(step)
    try:
      manifest = self._manager.restore(
          step, args=ocp.args.Composite(**{_MANIFEST: ocp.args.JsonRestore()}))[_MANIFEST]
      leaves = manifest["leaves"]
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"checkpoint step {step} at {path}: unreadable manifest ({_one_line(e)})") from e
    _check_target_matches(target, leaves, step)
    try:
      items = self._manager.restore(
          step,
          args=ocp.args.Composite(**{
              _STATE: ocp.args.StandardRestore(target),
              _EXTRA: ocp.args.JsonRestore(),
          }),
      )
      state, extra = items[_STATE], items[_EXTRA]
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"checkpoint step {step} at {path}: unreadable data ({_one_line(e)})") from e
    _check_fingerprints(state, leaves, step, path)
    return Restored(state=state, extra=extra if extra is not None else {})

  def _report_and_quarantine(self, step: int, error: CorruptCheckpointError, *, then: str) -> None:
    """Reports a corrupt step in one line and moves it aside so its number can be saved again."""
    self._quarantine_count += 1
    destination = os.path.join(
        self._workdir, QUARANTINE_DIR, f"{step}-{time.time_ns()}-{self._quarantine_count}")
    _say(f"{error}; moved to {destination}; {then}")
    if jax.process_index() == 0:
      files.move(self.step_path(step), destination)
    # Every process must see the move before any of them lists steps again.
    ocp.multihost.sync_global_processes(
        f"agentrl_checkpoint_quarantine_{step}_{self._quarantine_count}")
    self._manager.reload()


def _abstract(leaf: Any) -> Any:
  """Turns a concrete array into the ShapeDtypeStruct orbax restores into."""
  if isinstance(leaf, jax.Array):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
  if isinstance(leaf, np.ndarray):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
  return leaf


def _is_array_like(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, bool))


def _leaf_fingerprint(x: jax.Array) -> jax.Array:
  """A uint32 position-weighted sum of the leaf's bits.

  Integer sums are exact and associative mod 2**32, so the value does not depend on the sharding
  or reduction order, and no reshape (which would gather a sharded array) is needed.
  """
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if jnp.iscomplexobj(x):
    x = jnp.stack([x.real, x.imag])
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  elif x.dtype.itemsize == 8:
    words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # Adds a trailing axis of 2.
  else:
    unsigned = jnp.dtype(f"uint{8 * x.dtype.itemsize}")
    words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
  position = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(words.ndim)):
    position += jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride)
    stride = (stride * words.shape[axis]) % 2**32
  weight = position * jnp.uint32(2 * _POSITION_MULTIPLIER % 2**32) + jnp.uint32(1)
  return jnp.sum(words * weight, dtype=jnp.uint32)


# One call per leaf: leaves of one state may live on different device sets (a replicated scalar
# committed to one device next to mesh-sharded parameters), which a single jit call rejects.
_jitted_leaf_fingerprint = jax.jit(_leaf_fingerprint)


def _flat_arrays(tree: PyTree) -> tuple[list[str], list[Any]]:
  """Leaf paths (as `jax.tree_util.keystr`) and leaves of a pytree."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [jax.tree_util.keystr(p) for p, _ in flat], [leaf for _, leaf in flat]


def _fingerprint_values(leaves: list[Any]) -> list[int | None]:
  """Fingerprints of the array-like leaves, None for the others (e.g. strings)."""
  # One leaf at a time: many small programs in flight whose collectives span different device
  # subsets can deadlock the CPU backend's rendezvous (fake devices share a few threads).
  values = iter(int(jax.device_get(_jitted_leaf_fingerprint(jnp.asarray(x))))
                for x in leaves if _is_array_like(x))
  return [next(values) if _is_array_like(x) else None for x in leaves]


def _manifest(state: PyTree) -> dict[str, Any]:
  paths, leaves = _flat_arrays(state)
  fingerprints = _fingerprint_values(leaves)
  entries = {}
  for path, leaf, fingerprint in zip(paths, leaves, fingerprints, strict=True):
    shape = list(np.shape(leaf)) if _is_array_like(leaf) else None
    dtype = str(jnp.asarray(leaf).dtype) if _is_array_like(leaf) else type(leaf).__name__
    entries[path] = {"shape": shape, "dtype": dtype, "fingerprint": fingerprint}
  return {"version": _MANIFEST_VERSION, "leaves": entries}


def _check_target_matches(target: PyTree, saved: dict[str, Any], step: int) -> None:
  """Raises ValueError naming the first leaf whose path or shape differs from the checkpoint."""
  paths, leaves = _flat_arrays(target)
  missing = [p for p in paths if p not in saved]
  if missing:
    raise ValueError(
        f"restore target leaf {missing[0]} is not in checkpoint step {step} "
        f"(saved leaves: {sorted(saved)})")
  unexpected = sorted(set(saved) - set(paths))
  if unexpected:
    raise ValueError(
        f"checkpoint step {step} has leaf {unexpected[0]} that the restore target lacks")
  for path, leaf in zip(paths, leaves, strict=True):
    want = saved[path]["shape"]
    shape = getattr(leaf, "shape", None)
    if want is not None and shape is not None and list(shape) != want:
      raise ValueError(
          f"restore target leaf {path} has shape {tuple(shape)} but checkpoint step {step} "
          f"holds shape {tuple(want)}")


def _check_fingerprints(state: PyTree, saved: dict[str, Any], step: int, path: str) -> None:
  """Raises CorruptCheckpointError when a restored leaf's bits differ from what was saved.

  Leaves restored with a different dtype than saved (a deliberate cast) cannot be compared.
  """
  paths, leaves = _flat_arrays(state)
  comparable = [
      i for i, (p, leaf) in enumerate(zip(paths, leaves, strict=True))
      if _is_array_like(leaf) and str(jnp.asarray(leaf).dtype) == saved[p]["dtype"]
      and saved[p]["fingerprint"] is not None
  ]
  values = _fingerprint_values([leaves[i] for i in comparable])
  for i, value in zip(comparable, values, strict=True):
    if value != saved[paths[i]]["fingerprint"]:
      raise CorruptCheckpointError(
          f"checkpoint step {step} at {path}: leaf {paths[i]} does not match the fingerprint "
          "written at save time")


def _check_json_serialisable(extra: dict[str, Any]) -> None:
  for key, value in extra.items():
    try:
      json.dumps(value)
    except TypeError as e:
      raise TypeError(f"checkpoint extra[{key!r}] is not JSON-serialisable: {e}") from e


def _one_line(error: BaseException) -> str:
  text = f"{type(error).__name__}: {error}".strip()
  first = text.splitlines()[0] if text else type(error).__name__
  # tensorstore's messages run on for hundreds of characters (a repr of its spec); the start
  # says what failed, and the message must stay one readable line.
  return first if len(first) <= 160 else first[:157] + "..."


def _say(message: str) -> None:
  """One line on stderr, from process 0 only (every process sees the same checkpoints)."""
  if jax.process_index() == 0:
    print(f"warning: {message}", file=sys.stderr, flush=True)


# Loggers orbax and its storage layer report a failed read through; the CorruptCheckpointError
# raised instead carries the reason.
_LIBRARY_LOGGERS = ("absl", "orbax", "tensorstore", "etils")


@contextlib.contextmanager
def _library_reports_held_back() -> Iterator[None]:
  """Silences the libraries' own logging of a failed read for its duration, and for good the
  asyncio reports its leftover tasks and callbacks make later (see below)."""
  _hold_back_closed_event_loop_errors()
  _hold_back_unretrieved_orbax_tasks()
  loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
  levels = [logger.level for logger in loggers]
  for logger in loggers:
    logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    for logger, level in zip(loggers, levels):
      logger.setLevel(level)


def _hold_back_closed_event_loop_errors() -> None:
  """Drops the "Event loop is closed" RuntimeError that reaches `sys.unraisablehook` when a read
  of a damaged step fails: orbax closes its event loop while a tensorstore callback is still
  pending, and the callback fails whenever it runs, often after the restore has returned. Every
  other unraisable exception still reaches the previous hook."""
  if getattr(sys.unraisablehook, "_agentrl_filter", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    value = unraisable.exc_value
    if isinstance(value, RuntimeError) and str(value) == "Event loop is closed":
      return
    previous(unraisable)

  hook._agentrl_filter = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


class _UnretrievedOrbaxTask(logging.Filter):
  """asyncio logs "Task exception was never retrieved" when a failed read's sibling tasks are
  garbage-collected, long after the restore: those of orbax's own coroutines are dropped."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not (message.startswith("Task exception was never retrieved") and "orbax" in message)


def _hold_back_unretrieved_orbax_tasks() -> None:
  logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _UnretrievedOrbaxTask) for f in logger.filters):
    logger.addFilter(_UnretrievedOrbaxTask())
