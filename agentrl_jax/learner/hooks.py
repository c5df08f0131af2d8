"""What the training loop tells the code that watches it, and the shape of a watcher.

A hook is any callable `hook(event: IterationEnd) -> None`, bound in gin as
`learner.train.hooks = [@report.CreditReport()]`. The loop calls every hook after each training
iteration, on the writing process only, once the iteration's metrics are recorded; a hook reads
the event and never changes the run (viewer reports, exports, extra logging).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Protocol

from agentrl_jax import types


@dataclasses.dataclass(frozen=True, kw_only=True)
class IterationEnd:
  """One finished training iteration.

  Attributes:
    workdir: the run's workdir.
    iteration: iterations done so far (1 after the first).
    traj: the iteration's batch as the learner trained on it (this host's share).
    tokenizer: the run's tokenizer.
    metrics: the iteration's scalars, evaluation included when `evaluating`.
    evaluating: the held-out evaluation ran at this iteration.
    env_name: the training env.
    writer: the run's `metrics.MetricsWriter` (text summaries, extra scalars).
    pipeline: the run's own credit pipeline `fn(traj, values) -> AdvantageOutput` and its name,
      or None when it needs the critic's values (a hook cannot re-score without them).
  """

  workdir: str
  iteration: int
  traj: types.Trajectories
  tokenizer: Any
  metrics: Mapping[str, float]
  evaluating: bool
  env_name: str
  writer: Any
  pipeline: tuple[str, Callable[..., Any]] | None


class Hook(Protocol):
  """Called by the loop after every iteration (see the module docstring)."""

  def __call__(self, event: IterationEnd) -> None: ...
