r"""Evaluates a run's newest checkpoint on held-out seeds, and optionally exports the policy.

  python experiments/evaluate.py --workdir=runs/quickstart
  python experiments/evaluate.py --workdir=runs/quickstart --num_tasks=500 --pass_k=8 \
      --export=/tmp/quickstart_policy

Prints and writes (`<workdir>/evaluation/step_<n>.json`) the held-out greedy success, pass@k,
invalid-action rate and mean turns; see `agentrl_jax.learner.evaluate_workdir`. A workdir without
a config or a checkpoint fails with one line (exit status 2).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax import config_errors  # noqa: E402


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description="Evaluate a run's newest checkpoint on its held-out seeds.")
  parser.add_argument("--workdir", required=True, help="the run's workdir (config.gin, checkpoints/)")
  parser.add_argument("--num_tasks", type=int, default=None,
                      help="held-out tasks played greedily (default: the run's EvalConfig)")
  parser.add_argument("--pass_k", type=int, default=None,
                      help="attempts per task for pass@k (default: the run's EvalConfig)")
  parser.add_argument("--export", default=None,
                      help="directory to write the policy to (LoRA: adapters + merged HF; else HF)")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="binding applied after the run's config.gin; repeatable")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_flags(argv)
  from agentrl_jax.learner import evaluate_workdir  # pylint: disable=g-import-not-at-top
  try:
    evaluate_workdir.parse_run_config(args.workdir, args.gin_bindings)
    result = evaluate_workdir.evaluate_workdir(args.workdir, num_tasks=args.num_tasks,
                                               pass_k=args.pass_k, export_dir=args.export)
  except config_errors.ConfigError as e:
    print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
    return 2
  figures = ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in result.items()
                      if k.startswith("eval/"))
  print(f"Checkpoint at iteration {result['step']}, {result['num_tasks']} held-out tasks: {figures}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
