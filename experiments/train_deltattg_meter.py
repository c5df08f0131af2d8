r"""Trains DeltaTTG's frozen Token-to-Go progress meter (docs/methods.md#deltattg) and saves it.

Records episodes from several scripted policies of different quality (the env's expert with its
actions replaced by random ones at each of `--noise_levels`; noise 1 is a random policy), keeps
the completed ones, and regresses the meter on `log(1 + TTG_k)` with a Huber loss. The meter then
stays frozen during actor training (`deltattg.DeltaTTG(meter_path=...)`). The recording and the
fit are `agentrl_jax.offline.deltattg_meter`'s.

  python experiments/train_deltattg_meter.py --out=runs/deltattg_meter/meter.npz

Prints the held-out Huber loss of the meter next to that of the best constant prediction; about
1 minute on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Sequence

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax.offline import deltattg_meter  # noqa: E402


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", required=True, help="where the meter .npz goes")
  parser.add_argument("--env_name", default="frozenlake")
  parser.add_argument("--env_kwargs", default='{"size": 4, "hole_prob": 0.2, "max_turns": 10}',
                      help="JSON constructor arguments of the env")
  parser.add_argument("--noise_levels", default="0.0,0.2,0.5,1.0",
                      help="comma-separated expert noise levels, one recorded policy each")
  parser.add_argument("--episodes_per_policy", type=int, default=192)
  parser.add_argument("--max_turns", type=int, default=10)
  parser.add_argument("--max_len", type=int, default=384)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--learning_rate", type=float, default=3e-3)
  parser.add_argument("--holdout_fraction", type=float, default=0.2)
  parser.add_argument("--seed", type=int, default=0)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  flags = parse_flags(argv)
  log = lambda line: print(line, flush=True)
  data = deltattg_meter.record_episodes(
      flags.env_name, json.loads(flags.env_kwargs),
      noise_levels=[float(x) for x in flags.noise_levels.split(",")],
      episodes_per_policy=flags.episodes_per_policy, max_turns=flags.max_turns,
      max_len=flags.max_len, seed=flags.seed, log=log)
  try:
    fit = deltattg_meter.fit_meter(data, steps=flags.steps, batch_size=flags.batch_size,
                                   learning_rate=flags.learning_rate,
                                   holdout_fraction=flags.holdout_fraction, seed=flags.seed,
                                   log=log)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  deltattg_meter.save(flags.out, fit)
  print(f"held-out Huber loss {fit.held_out_loss:.4f} (best constant: {fit.constant_loss:.4f}); "
        f"saved {flags.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
