"""Where a behaviour-cloning warm start keeps its progress, so that a stopped run resumes it.

The warm start saves its weights, its optimizer state and its next step to
`<workdir>/warm_start_progress.npz` every `save_every_s` seconds and when the run is asked to stop
(SIGTERM or Ctrl-C, `preemption.StopRequest`). The next launch continues from there with the same
demonstrations (each step's are drawn from its index), so a resumed clone equals an uninterrupted
one. The file also holds the driver's record (the evaluation before training), so the next
launch neither repeats that evaluation nor drops the metrics written so far; after a hard kill
the warm-start records written since the last save are written again. The driver deletes the
file once the finished clone is in the step-0 checkpoint. With several processes nothing is
saved: a stop part-way clones from the start on the next launch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax

from agentrl_jax import files
from agentrl_jax.learner import clone_store

FILE = "warm_start_progress.npz"


def _never() -> bool:
  return False


@dataclasses.dataclass(frozen=True)
class Session:
  """One launch's warm start: where its progress goes and whether the run was asked to stop.

  Attributes:
    directory: the run's workdir; None: progress is neither restored nor saved.
    stop: True once the run was asked to stop (the same answer on every host).
    save_every_s: seconds between saves of the progress (a stop request always saves).
    record: the driver's record, saved with the progress (`saved_record`).
  """

  directory: str | None = None
  stop: Callable[[], bool] = _never
  save_every_s: float = 300.0
  record: Mapping[str, Any] | None = None

  @property
  def path(self) -> str:
    return files.join(self.directory, FILE)

  @property
  def saves(self) -> bool:
    """Whether progress is kept: a directory, and one process."""
    return self.directory is not None and jax.process_count() == 1

  def restore(self, key: str, like: Any) -> tuple[Any, int] | None:
    """`(tree, next step)` saved by a warm start with this `key`; None if there is none.

    Progress of another warm start (its settings changed) or an unreadable file is set aside
    with one line: the warm start then begins at step 0.
    """
    if not self.saves or not files.exists(self.path):
      return None
    try:
      tree, meta = clone_store.load_with_meta(self.path, like)
    except ValueError as e:
      print(f"Warm start progress not used: {e}", flush=True)
      return None
    if not meta or meta.get("key") != key:
      print(f"Warm start progress in {self.path} is another warm start's (its settings "
            f"differ): cloning from step 0", flush=True)
      return None
    return tree, int(meta["next_step"])

  def save(self, key: str, tree: Any, next_step: int) -> None:
    if not self.saves:
      return
    clone_store.save(self.path, tree, {"key": key, "next_step": next_step,
                                       "record": dict(self.record or {})})

  def clear(self) -> None:
    if self.directory is not None:
      files.remove(self.path)


def saved_record(directory: str) -> dict[str, Any] | None:
  """The driver's record saved with a stopped warm start's progress in `directory`, if any."""
  meta = clone_store.read_meta(files.join(directory, FILE))
  return None if meta is None else meta.get("record")
