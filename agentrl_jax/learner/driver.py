"""The one outer loop every training method runs in.

A method (online GRPO/PPO, DRIFT, Iterative GRPO, AHEAD, RTPO, ...) supplies its state and one
`iteration`; the driver owns everything around it, the same way for every method:

  * resume: the newest good checkpoint in the workdir is restored, with the driver's own record
    (iterations done, the evaluations before RL) and every stateful part's memory;
  * held-out evaluation before training, after the warm start, every `eval_every` iterations
    and at the end, each with its own key (`evaluation_key`), so resumed and uninterrupted runs
    evaluate alike;
  * the warm start, once per run, checkpointed at step 0 so a kill right after it loses nothing;
    a stop during it keeps its progress, which the next launch resumes (`warm_start_progress`);
  * the logging cadence (`log_every`, always the last iteration), the operative config after the
    first iteration this launch runs, the progress bar;
  * checkpoints every `checkpoint_every` iterations and at the end;
  * preemption: SIGTERM or Ctrl-C on any host stops every host at the same iteration (or
    warm-start step), with a checkpoint (`preemption.StopRequest`);
  * hooks after every iteration, on the writing process only (`learner.hooks`);
  * the summary.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

import jax

from agentrl_jax import types
from agentrl_jax.learner import checkpoint as checkpoint_lib
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import preemption
from agentrl_jax.learner import warm_start_progress
from agentrl_jax.parallel import multihost

# Evaluation tags: the key of each evaluation is `fold_in(eval_key, tag)`.
BEFORE_TAG = 0
WARM_START_TAG = 1


def iteration_tag(done: int) -> int:
  """The evaluation tag after `done` iterations (past the two tags above)."""
  return 2 + done


class IterationResult(NamedTuple):
  """What one iteration of a method returns.

  Attributes:
    state: the method's state after the iteration.
    metrics: the iteration's scalars.
    traj: the batch it trained on (for hooks), or None when it has no single batch.
  """

  state: Any
  metrics: dict[str, float]
  traj: types.Trajectories | None = None


class Method(Protocol):
  """One training method, as the driver runs it."""

  name: str

  def iteration(self, state: Any, iteration: int) -> IterationResult:
    """Runs iteration `iteration` (0-based) from `state`."""

  def policy_params(self, state: Any) -> Any:
    """The policy parameters of `state` (what is evaluated)."""

  def progress(self, metrics: Mapping[str, float]) -> dict[str, float]:
    """The few numbers the progress bar shows."""

  def restored(self, state: Any) -> None:
    """Called once after a checkpoint restore (e.g. re-sync a teacher snapshot)."""

  def close(self) -> None:
    """Releases what the method holds (threads, worker processes)."""


@runtime_checkable
class Stateful(Protocol):
  """A part of the run with memory across iterations (PEARL's history, SLEA's library, ...)."""

  def state_dict(self) -> dict[str, Any]: ...

  def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
  """When the driver does what, in iterations."""

  num_iterations: int
  log_every: int = 1
  checkpoint_every: int = 25
  eval_every: int = 25

  @classmethod
  def of(cls, config, evaluation) -> Schedule:
    """The schedule a `configs.TrainConfig` and `configs.EvalConfig` ask for."""
    return cls(num_iterations=config.num_iterations, log_every=config.log_every,
               checkpoint_every=config.checkpoint_every, eval_every=evaluation.every)


@dataclasses.dataclass
class Outcome:
  """How a run ended."""

  method: str
  state: Any
  iterations: int
  resumed_from: int | None
  success_before: float | None
  success_after_warm_start: float | None
  success_after: float
  final_metrics: dict[str, float]
  preempted: bool = False


def evaluation_key(base_key: jax.Array) -> jax.Array:
  """The key every held-out evaluation of a run folds its tag into."""
  return jax.random.fold_in(base_key, 7)


def json_state(state: dict[str, Any]) -> dict[str, Any]:
  """A stateful part's memory as checkpoint metadata (arrays as lists)."""
  return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in state.items()}


def _initial_record() -> dict[str, Any]:
  return {"iteration": 0, "warm_start_done": False, "success_before": None,
          "success_after_warm_start": None}


def run(workdir: str, method: Method, state: Any, *, schedule: Schedule,
        evaluate: Callable[[Any, int], dict[str, float]], writer: metrics_lib.MetricsWriter,
        warm_start: Callable[[Any], Any] | None = None,
        prepare: Callable[[Any], Mapping[str, float] | None] | None = None,
        stateful: Sequence[Stateful] = (), hooks: Sequence[hooks_lib.Hook] = (),
        hook_context: Mapping[str, Any] | None = None,
        evaluate_before: bool = True) -> Outcome:
  """Runs `method` from `state` (or from the workdir's checkpoint) to `schedule.num_iterations`.

  Args:
    workdir: checkpoints go to `<workdir>/checkpoints`; the writer writes the metrics.
    method: the method (see `Method`).
    state: the method's initial state; also the structure a checkpoint is restored into.
    schedule: the cadences.
    evaluate: `(policy params, tag) -> metrics`, the held-out evaluation (`eval/...` keys).
    writer: the run's metrics writer (closed at the end).
    warm_start: `state -> state`, run once before RL (None: no warm start).
    prepare: `state -> metrics or None`, called on every launch after the warm start and before
      the first iteration (e.g. DRIFT's offline collection, which resumes itself); its metrics
      are written at step 0.
    stateful: parts whose memory is checkpointed with the state.
    hooks: called after every iteration on the writing process.
    hook_context: the fields of every `hooks.IterationEnd` that do not change per iteration
      (workdir, tokenizer, env_name, writer, pipeline).
    evaluate_before: evaluate the policy before any training (and before the warm start).

  Returns:
    The outcome; `state` is the final state.
  """
  ckpt = checkpoint_lib.Checkpointer(workdir)
  record = _initial_record()
  resumed = ckpt.resume(target=state)  # the newest intact checkpoint; None: from scratch
  # A warm start stopped part-way: its progress holds the record, and its step-0 metrics stay.
  warm_record = None if resumed is not None else warm_start_progress.saved_record(workdir)
  if warm_record:
    record.update(warm_record)
  # The records of the iterations about to be re-run go.
  writer.rewind(ckpt.restored_step if not warm_record else 0)
  resumed_from = ckpt.restored_step
  if resumed is not None:
    state, saved = resumed
    record.update(saved)
    for part, memory in zip(stateful, record.get("credit_state", [])):
      part.load_state_dict(memory)
    method.restored(state)
    print(f"Resuming from the checkpoint at iteration {record['iteration']} in {ckpt.directory}",
          flush=True)

  progress = None
  metrics: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  preempted = False
  try:
    # From here on SIGTERM or Ctrl-C stop the run at the next boundary: a warm-start step or an
    # iteration.
    with preemption.StopRequest() as stop:
      if evaluate_before and record["success_before"] is None:
        before = evaluate(method.policy_params(state), BEFORE_TAG)
        record["success_before"] = before["eval/greedy_success"]
        writer.write(0, {f"{k}_before": v for k, v in before.items()})
        print(f"Held-out greedy success before training: {record['success_before']:.3f}",
              flush=True)

      if warm_start is not None and not record["warm_start_done"]:
        session = warm_start_progress.Session(directory=workdir, stop=stop.agreed, record=record)
        warmed = warm_start(state, session=session)
        if warmed is None:  # stopped part-way; the session kept its progress
          preempted = True
          print("Run the same command to resume the warm start.", flush=True)
          return Outcome(method=method.name, state=state, iterations=0,
                         resumed_from=resumed_from, success_before=record["success_before"],
                         success_after_warm_start=None, success_after=float("nan"),
                         final_metrics={}, preempted=True)
        state = warmed
        after = evaluate(method.policy_params(state), WARM_START_TAG)
        record["success_after_warm_start"] = after["eval/greedy_success"]
        record["warm_start_done"] = True
        writer.write(0, {f"{k}_warm_start": v for k, v in after.items()})
        print(f"Held-out greedy success after the warm start: "
              f"{record['success_after_warm_start']:.3f}", flush=True)
        # Memories filled during the warm start (SLEA's library) must survive a kill right
        # after it.
        record["credit_state"] = [json_state(part.state_dict()) for part in stateful]
        ckpt.save(0, state, record)
        session.clear()  # the clone is in the checkpoint now

      if prepare is not None:
        prepared = prepare(state)
        if prepared:
          writer.write(0, prepared)

      first = record["iteration"]
      progress = metrics_lib.ProgressBar(total=schedule.num_iterations, initial=first,
                                         enabled=jax.process_index() == 0)
      for iteration in range(first, schedule.num_iterations):
        start = time.perf_counter()
        state, metrics, traj = method.iteration(state, iteration)
        metrics["time/iteration_s"] = time.perf_counter() - start
        if iteration == first:
          metrics_lib.write_operative_config(workdir, process_index=jax.process_index())
        done = record["iteration"] = iteration + 1
        last = done == schedule.num_iterations
        evaluating = done % schedule.eval_every == 0 or last
        if evaluating:
          last_eval = evaluate(method.policy_params(state), iteration_tag(done))
          metrics.update(last_eval)
        if done % schedule.log_every == 0 or last:
          writer.write(done, metrics)
        if hooks and multihost.is_writer():
          event = hooks_lib.IterationEnd(iteration=done, traj=traj, metrics=metrics,
                                         evaluating=evaluating, **hook_context)
          for hook in hooks:
            hook(event)
        progress.update(done, {**method.progress(metrics),
                               "eval": last_eval.get("eval/greedy_success", float("nan"))})
        preempted = stop.agreed(done) and not last
        if done % schedule.checkpoint_every == 0 or last or preempted:
          record["credit_state"] = [json_state(part.state_dict()) for part in stateful]
          ckpt.save(done, state, record)
        if preempted:
          print(f"Stopped at iteration {done}; checkpoint saved. Run the same command to resume.",
                flush=True)
          break
    progress.close()
    if not last_eval and not preempted:  # a preempted host has seconds left: no extra evaluation
      last_eval = evaluate(method.policy_params(state), iteration_tag(record["iteration"]))
  finally:
    if progress is not None:
      progress.close()
    method.close()
    writer.close()
  return Outcome(
      method=method.name, state=state, iterations=record["iteration"], resumed_from=resumed_from,
      success_before=record["success_before"],
      success_after_warm_start=record["success_after_warm_start"],
      success_after=last_eval.get("eval/greedy_success", float("nan")),
      final_metrics={**metrics, **last_eval}, preempted=preempted)


def print_summary(outcome: Outcome, num_tasks: int, pass_k: int) -> None:
  """The lines a run ends with (nothing after a preemption: the stop message said it)."""
  if outcome.preempted:
    return
  lines = [f"Done: {outcome.iterations} iterations of {outcome.method}"
           + (f" (resumed from checkpoint {outcome.resumed_from})"
              if outcome.resumed_from is not None else "")]
  if outcome.success_before is not None:
    lines.append(f"  held-out greedy success before training: {outcome.success_before:.3f}")
  if outcome.success_after_warm_start is not None:
    lines.append(f"  after the warm start (behaviour cloning): "
                 f"{outcome.success_after_warm_start:.3f}")
  lines.append(f"  after RL: {outcome.success_after:.3f}  ({num_tasks} held-out tasks)")
  key = f"eval/pass@{pass_k}"
  if key in outcome.final_metrics:
    lines.append(f"  sampled pass@{pass_k}: {outcome.final_metrics[key]:.3f}")
  print("\n".join(lines), flush=True)
