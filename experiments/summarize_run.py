r"""Writes one run's held-out figures, with binomial intervals, as a results JSON.

  python experiments/summarize_run.py --workdir=runs/smollm2_frozenlake_moves \
      --config=experiments/configs/smollm2_frozenlake_moves.gin \
      --out=notebooks/results/smollm2_frozenlake_moves.json

Reads `<workdir>/metrics.jsonl` and the operative `config.gin` (`studies.run_summary`): every
held-out evaluation's success with its exact 95% interval, its change from the untrained or
warm-started policy with Newcombe's interval, and the training curve. Runs that are not
finished are summarized as far as they went (`iterations_done` of `planned_iterations`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax.studies import run_summary  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--config", required=True, help="the gin file the run was launched with")
  parser.add_argument("--out", required=True, help="results JSON to write")
  parser.add_argument("--seed_count", type=int, default=1)
  args = parser.parse_args(argv)
  try:
    summary = run_summary.summarize_workdir(args.workdir)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  record = {"config": args.config, "seeds": args.seed_count, **summary}
  pathlib.Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
  for e in summary["evaluations"]:
    change = (f", change {e['change']:+.3f} {e['change_interval']}" if "change" in e else "")
    print(f"step {e['step']}: {e['success']:.3f} {e['interval']}{change}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
