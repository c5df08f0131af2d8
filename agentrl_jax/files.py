"""Run outputs on a local disk or an object store (gs://), through one small set of calls.

Cloud TPU jobs write their workdir to `gs://bucket/...`; tests and laptops write to local paths.
`etils.epath` (orbax's path layer) reaches both; the one difference that matters here is that an
object store has no append and no rename-into-place, but uploads a whole object atomically.
"""

from __future__ import annotations

import os
import socket

from etils import epath


def is_remote(path: str | os.PathLike[str]) -> bool:
  """True for URLs such as gs://bucket/run (object stores), False for local paths."""
  return "://" in os.fspath(path)


def join(directory: str | os.PathLike[str], *names: str) -> str:
  return os.path.join(os.fspath(directory), *names)


def write_text(path: str | os.PathLike[str], text: str) -> str:
  """Writes a file whole and atomically: no reader ever sees half of it (see `write_bytes`)."""
  return write_bytes(path, text.encode("utf-8"))


def read_text(path: str | os.PathLike[str]) -> str | None:
  """The file's text, or None when it does not exist."""
  target = epath.Path(os.fspath(path))
  return target.read_text() if target.exists() else None


def move(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> None:
  """Moves a file or directory (on an object store: copy then delete, done by epath)."""
  target = epath.Path(os.fspath(destination))
  target.parent.mkdir(parents=True, exist_ok=True)
  epath.Path(os.fspath(source)).rename(target)


def makedirs(path: str | os.PathLike[str]) -> None:
  """Creates a directory and its parents (on an object store, where directories are implicit,
  nothing is created that a later write would not create anyway)."""
  epath.Path(os.fspath(path)).mkdir(parents=True, exist_ok=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> str:
  """Writes a file whole and atomically: no reader ever sees half of it.

  Locally through a renamed temporary file (named by host and pid, so hosts sharing a workdir
  never write the same temporary); on an object store as one upload, which is atomic already.
  """
  path = os.fspath(path)
  target = epath.Path(path)
  target.parent.mkdir(parents=True, exist_ok=True)
  if is_remote(path):
    target.write_bytes(data)
    return path
  temporary = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"
  with open(temporary, "wb") as f:
    f.write(data)
  os.replace(temporary, path)
  return path


def read_bytes(path: str | os.PathLike[str]) -> bytes | None:
  """The file's bytes, or None when it does not exist."""
  target = epath.Path(os.fspath(path))
  return target.read_bytes() if target.exists() else None


def remove(path: str | os.PathLike[str]) -> None:
  """Deletes a file if it exists."""
  target = epath.Path(os.fspath(path))
  if target.exists():
    target.unlink()


def exists(path: str | os.PathLike[str]) -> bool:
  return epath.Path(os.fspath(path)).exists()
