"""Evaluates a finished (or stopped) online run's newest checkpoint, and optionally exports it.

  python experiments/evaluate.py --workdir=runs/quickstart --num_tasks=500 --pass_k=8
  python experiments/evaluate.py --workdir=runs/smollm2 --export=/tmp/smollm2_rl

The run is rebuilt from `<workdir>/config.gin` by `learner.build` (the same assembly training
used: tokenizer, chat template, model, LoRA base), the newest checkpoint is restored into it,
and the policy plays the held-out seeds of its `EvalConfig` (greedy success, pass@k, invalid-action
rate, mean turns). Nothing of the run is changed: the figures go to
`<workdir>/evaluation/step_<n>.json`. With the run's own evaluation settings the figures equal
the run's last evaluation at that step (the same held-out seeds and sampling key).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Any, NamedTuple, Sequence

import gin

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax.learner import checkpoint as checkpoint_lib
from agentrl_jax.learner import driver
from agentrl_jax.learner import learner
from agentrl_jax.learner import metrics as metrics_lib

EVALUATION_DIR = "evaluation"
DEFAULT_IMPORTS = ("from agentrl_jax.learner import learner",)


def train_arguments() -> dict[str, Any]:
  """`learner.train`'s keyword arguments as the parsed gin config binds them (else defaults)."""
  arguments = {name: p.default for name, p in inspect.signature(learner.train).parameters.items()
               if p.default is not inspect.Parameter.empty}
  # gin evaluates `@configs.TrainConfig()`-style references when it reports the bindings.
  arguments.update(gin.get_bindings(learner.train))
  return arguments


def parse_run_config(workdir: str, gin_bindings: Sequence[str] = ()) -> None:
  """Parses the config the run recorded, then `gin_bindings`.

  Raises:
    config_errors.ConfigError: no `config.gin` in `workdir`, or the run's loop is not online RL
      (`learner.train`), whose state this restores.
  """
  path = files.join(workdir, metrics_lib.CONFIG_FILE)
  if not os.path.isfile(path):
    raise config_errors.ConfigError(f"--workdir {workdir!r} has no {metrics_lib.CONFIG_FILE}; "
                                    "pass the workdir of a run started by experiments/run.py")
  gin.clear_config()
  config_errors.parse_config([path], gin_bindings, default_imports=DEFAULT_IMPORTS)
  entry = gin.get_bindings(learner.run).get("entry", learner.train) if _binds_run() else None
  if entry is not None and inspect.unwrap(entry) is not learner.train:
    raise config_errors.ConfigError(
        f"{path} trains with {getattr(entry, '__name__', entry)!r}; evaluate restores online runs "
        f"(learner.train) only")


def _binds_run() -> bool:
  try:
    gin.get_configurable(learner.run)
  except ValueError:  # no config mentions learner.run: online RL
    return False
  return True


class Restored(NamedTuple):
  """A run rebuilt by `learner.build` with its newest checkpoint restored."""

  run: learner.OnlineRun
  state: Any
  iteration: int
  tag: int  # the key tag of the run's own evaluation at this point


def restore(workdir: str, arguments: dict[str, Any]) -> Restored:
  """Builds the run from `arguments` (`train_arguments()`) and restores its newest checkpoint.

  The caller closes `restored.run.method`.

  Raises:
    config_errors.ConfigError: the workdir has no checkpoint.
  """
  if not metrics_lib.checkpoint_steps_on_disk(workdir):  # before opening: that creates the directory
    raise config_errors.ConfigError(f"--workdir {workdir!r} has no checkpoint; train first")
  run = learner.build(**{**arguments, "hooks": ()})  # reports and libraries are the run's
  with checkpoint_lib.Checkpointer(workdir) as ckpt:
    state, extra = ckpt.restore(ckpt.latest_step(), target=run.state)
  iteration = int(extra.get("iteration", ckpt.latest_step()))
  if iteration:
    tag = driver.iteration_tag(iteration)
  else:
    tag = driver.WARM_START_TAG if extra.get("warm_start_done") else driver.BEFORE_TAG
  return Restored(run=run, state=state, iteration=iteration, tag=tag)


def evaluate_workdir(workdir: str, *, num_tasks: int | None = None, pass_k: int | None = None,
                     export_dir: str | None = None) -> dict[str, Any]:
  """Restores the newest checkpoint of the parsed run config and evaluates it.

  Args:
    workdir: the run's workdir.
    num_tasks, pass_k: override the run's `EvalConfig` (None: the run's own).
    export_dir: also write the policy there (LoRA: adapters and merged HF weights; otherwise an
      HF checkpoint).

  Returns:
    The `eval/` metrics with the checkpoint's `step` and the settings used; also written to
    `<workdir>/evaluation/step_<step>.json`.

  Raises:
    config_errors.ConfigError: the workdir has no checkpoint.
  """
  arguments = train_arguments()
  changes = {k: v for k, v in (("num_tasks", num_tasks), ("pass_k", pass_k)) if v is not None}
  evaluation = arguments["evaluation"] = dataclasses.replace(arguments["evaluation"], **changes)
  restored = restore(workdir, arguments)
  try:
    metrics = restored.run.evaluate(restored.run.method.policy_params(restored.state),
                                    restored.tag)
    if export_dir:
      restored.run.export(export_dir, restored.state)
  finally:
    restored.run.method.close()
  result = {"step": restored.iteration, "num_tasks": evaluation.num_tasks,
            "pass_k": evaluation.pass_k, **metrics,
            **({"exported_to": export_dir} if export_dir else {})}
  files.makedirs(files.join(workdir, EVALUATION_DIR))
  files.write_text(files.join(workdir, EVALUATION_DIR, f"step_{restored.iteration}.json"),
                   json.dumps(result, indent=1))
  return result
