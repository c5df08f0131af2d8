"""What a run records in its workdir: metrics, TensorBoard events, gin configs, progress.

`<workdir>/metrics.jsonl` is the record a notebook or test reads back (`read_metrics`);
`<workdir>/tensorboard/` holds the same scalars for TensorBoard; `config.gin` is the config as
parsed and `operative_config.gin` the values the run actually used (t5x). A config that binds
`metrics.MetricsWriter.wandb = @metrics.WandbConfig()` also logs the scalars to a Weights & Biases
run (its local files in `<workdir>/wandb/`, its id in `<workdir>/wandb_run_id`). Only process 0
writes, so a multi-host job produces one copy. The workdir may be local or on an object store
(gs://).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import socket
import sys
import time
from typing import IO, Any, Literal, Mapping

import gin
from etils import epath
import tensorboardX
import tqdm

from agentrl_jax import config_errors
from agentrl_jax import files

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
CONFIG_FILE = "config.gin"
OPERATIVE_CONFIG_FILE = "operative_config.gin"
CONFIG_CHANGES_FILE = "config_changes.jsonl"
# `wandb.init(dir=workdir)` adds this level itself; named here for readers of the run files.
WANDB_DIR = "wandb"
WANDB_RUN_ID_FILE = "wandb_run_id"
WANDB_INSTALL = "pip install 'agentrl_jax[wandb]'"
# Where `checkpoint.Checkpointer` keeps its steps (one directory per finalised step, named by
# the step number); read here by name only, so the launch checks need neither jax nor orbax.
CHECKPOINT_DIR = "checkpoints"

_BINDING_LINE = re.compile(r"^([\w./]+)\s*=\s*(.*)$")


def check_workdir(workdir: str | os.PathLike[str]) -> None:
  """Makes `workdir` a directory this process can write, or says in one line why it cannot be.

  Run at launch, before any compute, so a typo'd or read-only workdir does not surface as a
  traceback after the model is built. An object-store workdir is left to its first write.

  The W&B run a config binds for the workdir is checked here too (`check_wandb`), since this is
  the launch check every entry point runs.

  Raises:
    config_errors.ConfigError: `workdir` is a file, cannot be created, or is not writable; or
      the config binds a W&B run that cannot start.
  """
  check_wandb()
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


def checkpoint_steps_on_disk(workdir: str | os.PathLike[str]) -> list[int]:
  """The step numbers of `<workdir>/checkpoints/<step>` directories, oldest first.

  Orbax writes a step under a temporary name and renames it when finalised (on an object store
  it adds `commit_success.txt` instead), so a bare number names a finished save; whether its
  files are intact is only known when it is restored.
  """
  directory = epath.Path(files.join(workdir, CHECKPOINT_DIR))
  if not directory.is_dir():
    return []
  steps = []
  for child in directory.iterdir():
    if not child.name.isdigit() or not child.is_dir():
      continue
    if files.is_remote(workdir) and not (child / "commit_success.txt").exists():
      continue
    steps.append(int(child.name))
  return sorted(steps)


def bindings(config_text: str) -> dict[str, str]:
  """`{binding key: value text}` of a config as `gin.config_str()` writes it.

  Values wrapped onto indented continuation lines are joined, and whitespace is collapsed, so
  two writes of the same config compare equal.
  """
  result: dict[str, str] = {}
  key = None
  for line in config_text.splitlines():
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
      key = None
      continue
    if line[:1].isspace() and key is not None:
      result[key] = f"{result[key]} {stripped}"
      continue
    match = _BINDING_LINE.match(stripped)
    key = match.group(1) if match else None
    if key is not None:
      result[key] = match.group(2)
  return {k: " ".join(v.split()) for k, v in result.items()}


def config_changes(old_text: str, new_text: str) -> list[str]:
  """One `key: old -> new` entry per binding that differs, sorted by key."""
  old, new = bindings(old_text), bindings(new_text)
  unset = "(unset)"
  return [f"{key}: {old.get(key, unset)} -> {new.get(key, unset)}"
          for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key)]


def check_resumed_config(workdir: str | os.PathLike[str], *, allow_change: bool) -> None:
  """Stops a relaunch whose config differs from the one its workdir's checkpoints were made with.

  Call it at launch, after the config is parsed and before `write_config` overwrites the
  recorded one. A workdir without a checkpoint resumes nothing, so any config may start there.
  With `allow_change` the run goes on, and the change is appended to
  `<workdir>/config_changes.jsonl` with the iteration it takes effect after (the newest
  checkpoint on disk).

  Raises:
    config_errors.ConfigError: the bindings differ and `allow_change` is False; the message is
      one line listing each differing binding as `key: old -> new`.
  """
  steps = checkpoint_steps_on_disk(workdir)
  recorded = files.read_text(files.join(workdir, CONFIG_FILE))
  if not steps or recorded is None:
    return
  changes = config_changes(recorded, gin.config_str())
  if not changes:
    return
  if not allow_change:
    raise config_errors.ConfigError(
        f"--workdir {os.fspath(workdir)!r} holds a run (checkpoint {steps[-1]}) made with a "
        f"different config: {'; '.join(changes)}. Relaunch with the recorded config "
        f"({CONFIG_FILE} there), another --workdir, or --allow_config_change to go on with "
        "this one")
  record_config_change(workdir, steps[-1], changes)


def record_config_change(workdir: str | os.PathLike[str], iteration: int,
                         changes: list[str]) -> str:
  """Appends `{"iteration", "changes", "time"}` to `<workdir>/config_changes.jsonl`.

  Rewritten whole (atomically, and on an object store, which cannot append). Every host of a
  job calls this at launch; a record equal to the last one is not repeated.
  """
  path = files.join(workdir, CONFIG_CHANGES_FILE)
  lines = [line for line in (files.read_text(path) or "").splitlines() if line.strip()]
  if lines:
    last = json.loads(lines[-1])
    if last.get("iteration") == iteration and last.get("changes") == changes:
      return path
  lines.append(json.dumps({"iteration": iteration, "changes": changes, "time": time.time()}))
  return files.write_text(path, "".join(line + "\n" for line in lines))


def read_config_changes(workdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """The records of `config_changes.jsonl`, oldest first (none when the file is missing)."""
  text = files.read_text(files.join(workdir, CONFIG_CHANGES_FILE)) or ""
  return [json.loads(line) for line in text.splitlines() if line.strip()]


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
    self._path = path
    self._file: IO[str] | None = open(path, "a", encoding="utf-8")

  def append(self, line: str) -> None:
    self._file.write(line + "\n")
    self._file.flush()

  def lines(self) -> list[str]:
    with open(self._path, encoding="utf-8") as f:
      return [line for line in f.read().splitlines() if line.strip()]

  def replace(self, lines: list[str]) -> None:
    """Swaps the file for one holding `lines` (atomically) and appends to that from now on."""
    self.close()
    files.write_text(self._path, "".join(line + "\n" for line in lines))
    self._file = open(self._path, "a", encoding="utf-8")

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

  def lines(self) -> list[str]:
    return list(self._lines)

  def replace(self, lines: list[str]) -> None:
    self._lines = list(lines)
    files.write_text(self._path, "".join(line + "\n" for line in lines))

  def close(self) -> None:
    pass


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WandbConfig:
  """A Weights & Biases run that gets the learner's scalars beside metrics.jsonl and TensorBoard.

  Bound in gin as `metrics.MetricsWriter.wandb = @metrics.WandbConfig()`.

  Attributes:
    project, entity, name, group, tags: as `wandb.init` takes them; None leaves the choice to
      W&B (the account's default entity, a generated name).
    mode: 'online' streams to the W&B server; 'offline' keeps the run in `<workdir>/wandb` for
      a later `wandb sync`; 'disabled' logs nothing and needs no wandb package.
  """

  project: str
  entity: str | None = None
  name: str | None = None
  group: str | None = None
  tags: tuple[str, ...] = ()
  mode: Literal["online", "offline", "disabled"] = "online"

  def __post_init__(self):
    config_errors.check_field_types(self)
    if not self.project.strip():
      raise ValueError("metrics.WandbConfig.project must name a W&B project, got ''")


def wandb_config() -> WandbConfig | None:
  """The W&B run the gin config binds as `metrics.MetricsWriter.wandb`; None when it binds none.

  Read from gin here because configs use dynamic registration: the learner constructs its
  writer directly, so gin never injects the binding into that call.

  Raises:
    config_errors.ConfigError: the binding does not build a `WandbConfig` (one line).
  """
  try:
    bound = gin.get_bindings(MetricsWriter, resolve_references=False)
  except ValueError:  # gin registers the writer only once a config binds one of its parameters
    return None
  if bound.get("wandb") is None:
    return None
  try:
    config = gin.get_bindings(MetricsWriter)["wandb"]
  except (config_errors.ConfigError, TypeError) as e:
    # gin re-raises under a proxy subclass of the error's type: rebuild the library's own.
    kind = config_errors.ConfigTypeError if isinstance(e, TypeError) else config_errors.ConfigError
    raise kind(f"metrics.MetricsWriter.wandb: {_first_line(e)}") from e
  if not isinstance(config, WandbConfig):
    raise config_errors.ConfigTypeError(
        f"metrics.MetricsWriter.wandb expects @metrics.WandbConfig(), got {config!r}")
  return config


def check_wandb() -> None:
  """Fails at launch, in one line, when the config binds a W&B run but wandb is not installed.

  Looks the package up without importing it: only the process that logs pays for loading it.
  """
  config = wandb_config()
  if config is not None and config.mode != "disabled" and importlib.util.find_spec("wandb") is None:
    raise config_errors.ConfigError(_missing_wandb_message())


def _missing_wandb_message() -> str:
  return f"metrics.WandbConfig binds a W&B run, but wandb is not installed: {WANDB_INSTALL}"


def _first_line(error: Exception) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[0] if lines else type(error).__name__


class _WandbRun:
  """The W&B side of a `MetricsWriter`: one W&B run per workdir, found again by its stored id.

  The run starts at the first `log`, not at construction, so a `forget` from the driver's
  rewind (which comes first) decides whether it is a new run or the stored one resumed.
  """

  def __init__(self, workdir: str, config: WandbConfig):
    self._wandb = _import_wandb()
    self._workdir = workdir
    self._config = config
    self._run: Any = None

  def log(self, step: int, values: Mapping[str, float]) -> None:
    if self._run is None:
      self._run = self._start()
    self._run.log(dict(values), step=step)

  def forget(self) -> None:
    """Ends the current run and drops the stored id: the next `log` starts a new W&B run."""
    self.close()
    stored = epath.Path(self._id_path())
    if stored.exists():
      stored.unlink()

  def close(self) -> None:
    if self._run is not None:
      self._run.finish()
      self._run = None

  def _id_path(self) -> str:
    return files.join(self._workdir, WANDB_RUN_ID_FILE)

  def _start(self) -> Any:
    run_id = (files.read_text(self._id_path()) or "").strip() or None
    config = self._config
    run = self._wandb.init(
        project=config.project, entity=config.entity, name=config.name, group=config.group,
        tags=list(config.tags), mode=config.mode, dir=self._local_dir(), id=run_id,
        resume="allow", config=self._run_config(), allow_val_change=True)
    if run_id is None:
      files.write_text(self._id_path(), run.id)
    return run

  def _local_dir(self) -> str | None:
    # wandb adds the `wandb/` level itself, and cannot write to an object store: a gs://
    # workdir's run files go where W&B puts them by default (WANDB_DIR, else ./wandb).
    return None if files.is_remote(self._workdir) else self._workdir

  def _run_config(self) -> dict[str, Any]:
    text = files.read_text(files.join(self._workdir, CONFIG_FILE))
    if text is None:
      return {}
    # Values parsed where they are literals, so W&B can sort and filter runs by them.
    return {"gin": {key: _literal(value) for key, value in bindings(text).items()},
            "gin_config": text}


def _import_wandb() -> Any:
  try:
    return importlib.import_module("wandb")
  except ImportError as e:
    raise config_errors.ConfigError(_missing_wandb_message()) from e


def _literal(text: str) -> Any:
  try:
    return ast.literal_eval(text)
  except (ValueError, TypeError, SyntaxError, RecursionError):
    return text


class MetricsWriter:
  """Appends scalars to `<workdir>/metrics.jsonl`, TensorBoard and W&B; a no-op off process 0.

  The JSON file is opened in append mode so a resumed run continues the same record. A resumed
  run calls `rewind(restored step)` first, so the iterations it re-runs after the restore are
  recorded once, not twice: the file then holds one record per iteration however often the run
  was killed.

  With a `WandbConfig` (the `wandb` argument, else the gin binding `metrics.MetricsWriter.wandb`)
  the same scalars go to a W&B run at the same steps (W&B's `step`). Its id is kept in
  `<workdir>/wandb_run_id`, so a relaunch that resumes a checkpoint resumes the same W&B run.
  W&B cannot delete logged steps, and ignores (with a warning) a step below the last one a run
  received: the iterations re-run after a restore keep, in W&B, the values logged before the
  kill, and W&B agrees with metrics.jsonl again from the first step past them. A launch with no
  checkpoint (`rewind(None)`) starts a new W&B run. Free text (`write_text`) stays in
  TensorBoard.
  """

  def __init__(self, workdir: str | os.PathLike[str], process_index: int = 0,
               wandb: WandbConfig | None = None):
    self._active = process_index == 0
    self._file: _AppendedFile | _RewrittenObject | None = None
    self._tensorboard: tensorboardX.SummaryWriter | None = None
    self._wandb: _WandbRun | None = None
    if not self._active:
      return
    workdir = os.fspath(workdir)
    # First, so that a missing wandb package fails before any file is opened.
    run = wandb if wandb is not None else wandb_config()
    if run is not None and run.mode != "disabled":
      self._wandb = _WandbRun(workdir, run)
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
    if self._wandb is not None:
      self._wandb.log(int(step), values)

  def rewind(self, step: int | None) -> int:
    """Drops the records of the steps after `step`: those a resumed run is about to re-run.

    Call it right after restoring checkpoint `step`, or with None when a run (re)starts with no
    checkpoint, which drops every record. A line cut short by a crash goes too. TensorBoard's
    event files cannot be rewound; TensorBoard shows the later write of a step. W&B cannot be
    rewound either: `step` resumes the stored W&B run, None starts a new one (see the class).

    Args:
      step: the restored checkpoint's step, or None for none.

    Returns:
      How many records were dropped (0 off process 0).
    """
    if not self._active:
      return 0
    if step is None and self._wandb is not None:
      self._wandb.forget()
    kept, dropped = [], 0
    for line in self._file.lines():
      try:
        record_step = json.loads(line)["step"]
      except (json.JSONDecodeError, KeyError, TypeError):
        dropped += 1
        continue
      if step is not None and record_step <= step:
        kept.append(line)
      else:
        dropped += 1
    if dropped:
      self._file.replace(kept)
    return dropped

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
    if self._wandb is not None:
      self._wandb.close()
      self._wandb = None

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
