r"""Writes a trajectory report from a run's latest checkpoint.

  python -m agentrl_jax.viewer --workdir=/tmp/quickstart
  python -m agentrl_jax.viewer --workdir=/tmp/quickstart \
      --gin_bindings="report.ViewerConfig.estimators = ('grpo', 'gigpo', 'rloo')"

The run is rebuilt from `<workdir>/config.gin` (the config `experiments/run.py` wrote), the
policy parameters are restored from the newest checkpoint, a few held-out tasks are played
`group_size` times each with the run's sampling settings, the episodes are scored by the run's own
credit pipeline and by `report.ViewerConfig`'s pipelines, and the report is written to
`<workdir>/viewer/iter_<n>.html` (n = the checkpoint's iteration) with `index.html` beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import gin
import jax

from agentrl_jax import config_errors
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import registry
from agentrl_jax.learner import assembly
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import evaluate_workdir
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.viewer import report

DEFAULT_IMPORTS = ("from agentrl_jax.learner import learner",
                   "from agentrl_jax.viewer import report")


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m agentrl_jax.viewer",
      description="Write an HTML trajectory report from a run's latest checkpoint.")
  parser.add_argument("--workdir", required=True,
                      help="the run's workdir (holds config.gin and checkpoints/)")
  parser.add_argument("--gin_file", action="append", default=[],
                      help="extra gin file parsed after <workdir>/config.gin; repeatable")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="extra binding, e.g. \"report.ViewerConfig.num_examples = 6\"; "
                           "repeatable")
  parser.add_argument("--num_tasks", type=int, default=2,
                      help="held-out tasks played, each group_size times (default 2)")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed")
  return parser.parse_args(argv)


def run_name(config, corrections: Sequence[Any]) -> str:
  """The run's own pipeline as shown in the report, e.g. `run: grpo + grounded_credit`."""
  names = [getattr(c, "__name__", None) or getattr(getattr(c, "func", None), "__name__", "correction")
           for c in corrections]
  return "run: " + " + ".join([estimators.resolve(config.estimator).name, *names])


def write_viewer_report(workdir: str, *, num_tasks: int = 2, seed: int = 0) -> str:
  """Restores the run of the parsed gin config, plays held-out tasks, writes the report."""
  if num_tasks < 1:
    raise ValueError(f"--num_tasks must be >= 1, got {num_tasks}")
  arguments = evaluate_workdir.train_arguments()
  restored = evaluate_workdir.restore(workdir, arguments)
  run = restored.run
  try:
    viewer_config = _viewer_config()
    corrections = tuple(arguments.get("corrections") or ())
    run_pipeline = assembly.credit_pipeline(run.config, arguments.get("reward_shapers") or (),
                                            corrections)
    pipelines = report.make_pipelines(
        viewer_config, extra={run_name(run.config, corrections): run_pipeline})
    group_size = run.config.group_size
    tasks = evaluate_lib.held_out_seeds(run.evaluation, num_tasks)
    seeds = [task for task in tasks for _ in range(group_size)]
    groups = [i for i in range(num_tasks) for _ in range(group_size)]
    envs = [registry.make(run.config.env_name, **run.config.env_kwargs) for _ in seeds]
    traj, _ = run.runner.collect(envs, seeds, groups,
                                 params=run.method.policy_params(restored.state),
                                 rng=jax.random.key(seed))
  finally:
    run.method.close()
  return report.write_report(
      workdir, restored.iteration, traj, run.tokenizer, pipelines,
      num_examples=viewer_config.num_examples, env_name=run.config.env_name,
      metrics=_metrics_at(workdir, restored.iteration))


def _viewer_config() -> report.ViewerConfig:
  """`report.ViewerConfig` as bound in gin; its defaults when no binding names it."""
  try:
    return gin.get_configurable(report.ViewerConfig)()
  except ValueError:
    return report.ViewerConfig()


def _metrics_at(workdir: str, iteration: int) -> dict[str, float]:
  """The scalars `metrics.jsonl` recorded at `iteration` (later records win)."""
  merged: dict[str, float] = {}
  for record in metrics_lib.read_metrics(workdir):
    if record.get("step") == iteration:
      merged.update(record)
  return merged


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_flags(argv)
  config_file = os.path.join(args.workdir, metrics_lib.CONFIG_FILE)
  if not os.path.isfile(config_file):
    print(f"error: {config_file} not found; is --workdir a training run's workdir?",
          file=sys.stderr)
    return 2
  try:
    config_errors.parse_config([config_file, *args.gin_file], args.gin_bindings,
                               default_imports=DEFAULT_IMPORTS)
  except config_errors.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    path = write_viewer_report(args.workdir, num_tasks=args.num_tasks, seed=args.seed)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Wrote {path}")
  print(f"Index: {os.path.join(args.workdir, 'viewer', 'index.html')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
