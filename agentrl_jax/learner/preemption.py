"""Graceful stops: SIGTERM (preemption) or Ctrl-C ends the run at an iteration boundary.

The learner checks `StopRequest.agreed()` after each iteration; every host then stops at the
same iteration, writes a checkpoint, and the next launch resumes from it. A second Ctrl-C
interrupts at once (the last periodic checkpoint still stands).
"""

from __future__ import annotations

import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

# The exit status of a run stopped before its last iteration, with a checkpoint the same command
# resumes from: sysexits' EX_TEMPFAIL ("try again later"), so that a scheduler or a shell loop
# tells "relaunch to resume" from "finished" (0) and from a bad config (2).
EXIT_STOPPED = 75


class StopRequest:
  """Installs SIGTERM/SIGINT handlers for the duration of a `with` block."""

  def __init__(self):
    self._requested = False
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self._requested

  def _handle(self, signum, frame):
    del frame
    if self._requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self._requested = True
    print(f"\nReceived {signal.Signals(signum).name}: stopping after this iteration and "
          f"writing a checkpoint (Ctrl-C again to quit at once).", flush=True)

  def agreed(self, step: int | None = None) -> bool:
    """True when any host was asked to stop; identical on every host.

    Call it at every iteration on every host. With `step`, JAX's own preemption notice (the
    coordination service's sync point on Cloud TPU) also counts, at the step it agrees on.
    """
    if jax.process_count() == 1:
      return self._requested
    flags = multihost_utils.process_allgather(np.asarray(self._requested, np.int32))
    return bool(np.any(flags)) or (step is not None and _reached_preemption_sync_point(step))

  def __enter__(self) -> StopRequest:
    # Signal handlers can only be installed from the main thread (e.g. not inside a notebook
    # worker thread); elsewhere the run simply has no graceful stop.
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()


def _reached_preemption_sync_point(step: int) -> bool:
  try:
    return multihost_utils.reached_preemption_sync_point(step)
  except RuntimeError:  # the preemption service is off (CPU and most GPU clusters)
    return False
