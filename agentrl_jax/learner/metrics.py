"""What a run records in its workdir: metrics, TensorBoard events, gin configs, progress.

`<workdir>/metrics.jsonl` is the record a notebook or test reads back (`read_metrics`);
`<workdir>/tensorboard/` holds the same scalars for TensorBoard; `config.gin` is the config as
parsed and `operative_config.gin` the values the run actually used (t5x). Only process 0 writes,
so a multi-host job produces one copy. The workdir may be local or on an object store (gs://).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time
from typing import IO, Any, Mapping

import gin
import tensorboardX
import tqdm

from agentrl_jax import config_errors
from agentrl_jax import files

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"


def check_workdir(workdir: str | os.PathLike[str]) -> None:
  """Makes `workdir` a directory this process can write, or says in one line why it cannot be.

  Run at launch, before any compute, so a typo'd or read-only workdir does not surface as a
  traceback after the model is built. An object-store workdir is left to its first write.

  Raises:
    config_errors.ConfigError: `workdir` is a file, cannot be created, or is not writable.
  """
  if files.is_remote(workdir):
    return
  path = os.fspath(workdir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise config_errors.ConfigError(f"--workdir {path!r} is a file, not a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise config_errors.ConfigError(
        f"--workdir {path!r}: cannot create it ({e.strerror or e})") from e
  # A real write, not os.access: root passes every permission check yet cannot write a
  # read-only mount. Named per host and process, since hosts of one job share the workdir.
  probe = os.path.join(path, f".write_probe.{socket.gethostname()}.{os.getpid()}")
  try:
    with open(probe, "w", encoding="utf-8"):
      pass
    os.remove(probe)
  except OSError as e:
    raise config_errors.ConfigError(
        f"--workdir {path!r} is not writable ({e.strerror or e})") from e


def write_config(workdir: str | os.PathLike[str]) -> str:
  """Writes the whole parsed gin config to `<workdir>/config.gin`; returns the path.

  Called before any compute: gin's operative config only lists what has been called so far.
  Written atomically, so hosts sharing a workdir never leave a torn file.
  """
  return files.write_text(files.join(workdir, CONFIG_FILE), gin.config_str())


def write_operative_config(workdir: str | os.PathLike[str], process_index: int = 0) -> str | None:
  """Writes the values the run actually used to `<workdir>/operative_config.gin`.

  Call it after the first training step, once every configurable has been called. Returns the
  path, or None on processes other than 0.
  """
  if process_index != 0:
    return None
  return files.write_text(files.join(workdir, OPERATIVE_CONFIG_FILE), gin.operative_config_str())


class _AppendedFile:
  """The JSONL record on a local disk: appended and flushed line by line."""

  def __init__(self, path: str):
    _terminate_truncated_line(path)
    self._file: IO[str] | None = open(path, "a", encoding="utf-8")

  def append(self, line: str) -> None:
    self._file.write(line + "\n")
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


class _RewrittenObject:
  """The JSONL record on an object store, which cannot append: each write uploads it whole.

  Uploads are atomic, so a reader (or a preempted run's successor) always sees whole lines.
  A run logs thousands of records, not millions, so rewriting stays cheap.
  """

  def __init__(self, path: str):
    self._path = path
    existing = files.read_text(path) or ""
    self._lines = [line for line in existing.splitlines() if line.strip()]

  def append(self, line: str) -> None:
    self._lines.append(line)
    files.write_text(self._path, "\n".join(self._lines) + "\n")

  def close(self) -> None:
    pass


class MetricsWriter:
  """Appends scalars to `<workdir>/metrics.jsonl` and TensorBoard; a no-op off process 0.

  The JSON file is opened in append mode so a resumed run continues the same record; steps
  re-run after a restore then appear twice, in the order they were written.
  """

  def __init__(self, workdir: str | os.PathLike[str], process_index: int = 0):
    self._active = process_index == 0
    self._file: _AppendedFile | _RewrittenObject | None = None
    self._tensorboard: tensorboardX.SummaryWriter | None = None
    if not self._active:
      return
    workdir = os.fspath(workdir)
    path = files.join(workdir, METRICS_FILE)
    if files.is_remote(workdir):
      self._file = _RewrittenObject(path)
    else:
      os.makedirs(workdir, exist_ok=True)
      self._file = _AppendedFile(path)
    # tensorboardX writes gs:// event files itself (with google-cloud-storage installed).
    self._tensorboard = tensorboardX.SummaryWriter(files.join(workdir, TENSORBOARD_DIR))

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `scalars` (anything `float()` accepts: Python, NumPy or jax scalars) at `step`."""
    if not self._active:
      return
    if "step" in scalars:
      raise ValueError("'step' is reserved for the step number; rename that scalar")
    values = {name: float(value) for name, value in scalars.items()}
    self._file.append(json.dumps({"step": int(step), **values}))
    for name, value in values.items():
      self._tensorboard.add_scalar(name, value, global_step=int(step))
    self._tensorboard.flush()

  def write_text(self, step: int, tag: str, text: str) -> None:
    """Records free text (a sample conversation, the config) under `tag` in TensorBoard."""
    if not self._active:
      return
    self._tensorboard.add_text(tag, text, global_step=int(step))
    self._tensorboard.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tensorboard is not None:
      self._tensorboard.close()
      self._tensorboard = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _terminate_truncated_line(path: str) -> None:
  """Ends a line cut short by a crash so the next record does not run into it."""
  if not os.path.exists(path) or os.path.getsize(path) == 0:
    return
  with open(path, "rb+") as f:
    f.seek(-1, os.SEEK_END)
    if f.read(1) != b"\n":
      f.write(b"\n")


def read_metrics(workdir: str | os.PathLike[str]) -> list[dict[str, float]]:
  """Reads every record of `<workdir>/metrics.jsonl`, in file order.

  A line that does not parse (the tail of a write cut short by a crash) is skipped with a
  logged warning. A missing file reads as no records.
  """
  path = files.join(workdir, METRICS_FILE)
  text = files.read_text(path)
  if text is None:
    return []
  records = []
  for number, line in enumerate(text.splitlines(), start=1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      logging.warning("Skipping unparseable line %d of %s (cut short by a crash?)", number, path)
  return records


class ProgressBar:
  """Training progress: a tqdm bar on a terminal, one concise line every N iterations otherwise.

  Log files and CI output get no carriage-return redraws, only lines like
  `iteration 40/200 (20%) | 3.1 it/s | eta 0:00:51 | success=0.45 loss=1.23`.
  """

  def __init__(self, total: int, initial: int = 0, *, stream: IO[str] | None = None,
               log_every: int | None = None, force_bar: bool = False, enabled: bool = True):
    """Starts the display.

    Args:
      total: the iteration the run ends at.
      initial: the iteration the run starts from (non-zero when resuming).
      stream: where to write; stderr by default, as tqdm does.
      log_every: iterations between lines when not on a terminal; default about 20 lines a run.
      force_bar: draw the tqdm bar even when `stream` is not a terminal.
      enabled: False shows nothing (e.g. on processes other than 0).
    """
    self._stream = stream if stream is not None else sys.stderr
    self._total = total
    self._initial = initial
    self._log_every = log_every or max(1, (total - initial) // 20)
    self._start = time.monotonic()
    self._last_logged: int | None = None
    self._bar: tqdm.tqdm | None = None
    self._enabled = enabled
    if enabled and (force_bar or _is_terminal(self._stream)):
      self._bar = tqdm.tqdm(total=total, initial=initial, file=self._stream,
                            dynamic_ncols=True, unit="it")

  def update(self, iteration: int, postfix: Mapping[str, Any] | None = None) -> None:
    """Shows that `iteration` iterations are done, with e.g. `{"success": .4, "loss": 1.2}`."""
    if not self._enabled:
      return
    postfix = postfix or {}
    if self._bar is not None:
      self._bar.set_postfix({k: _format_value(v) for k, v in postfix.items()}, refresh=False)
      self._bar.update(iteration - self._bar.n)
      return
    done = iteration - self._initial
    is_due = done % self._log_every == 0 or iteration >= self._total or self._last_logged is None
    if is_due and iteration != self._last_logged:
      self._last_logged = iteration
      self._stream.write(self._line(iteration, postfix) + "\n")
      self._stream.flush()

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def __enter__(self) -> ProgressBar:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _line(self, iteration: int, postfix: Mapping[str, Any]) -> str:
    elapsed = time.monotonic() - self._start
    done = iteration - self._initial
    rate = done / elapsed if elapsed > 0 else 0.0
    parts = [f"iteration {iteration}/{self._total} ({100 * iteration / max(self._total, 1):.0f}%)"]
    if rate > 0:
      remaining = max(self._total - iteration, 0) / rate
      parts.append(f"{rate:.3g} it/s | eta {tqdm.tqdm.format_interval(remaining)}")
    if postfix:
      parts.append(" ".join(f"{k}={_format_value(v)}" for k, v in postfix.items()))
    return " | ".join(parts)


def _is_terminal(stream: IO[str]) -> bool:
  isatty = getattr(stream, "isatty", None)
  return bool(isatty and isatty())


def _format_value(value: Any) -> str:
  try:
    number = float(value)
  except (TypeError, ValueError):
    return str(value)
  if number.is_integer() and abs(number) < 1e6:
    return str(int(number))
  return f"{number:.3g}" if math.isfinite(number) else str(number)
