r"""Trains DeltaTTG's frozen Token-to-Go progress meter (docs/methods.md#deltattg) and saves it.

Records episodes from several scripted policies of different quality (the env's expert with its
actions replaced by random ones at each of `--noise_levels`; noise 1 is a random policy), keeps
the completed ones, and regresses the meter on `log(1 + TTG_k)` with a Huber loss. The meter then
stays frozen during actor training (`deltattg.DeltaTTG(meter_path=...)`).

  python experiments/train_deltattg_meter.py --out=runs/deltattg_meter/meter.npz

Prints the held-out Huber loss of the meter next to that of the best constant prediction; about
1 minute on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax import types  # noqa: E402
from agentrl_jax.credit import deltattg  # noqa: E402
from agentrl_jax.envs import registry  # noqa: E402
from agentrl_jax.models import tokenizer as tokenizer_lib  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import loop as loop_lib  # noqa: E402

# Recording seeds sit apart from training (0…) and held-out evaluation (1e9…) seeds.
_SEED_BASE = 700_000_000


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


def record(flags: argparse.Namespace) -> types.Trajectories:
  """Completed episodes of every noise level, concatenated along the batch."""
  tok = tokenizer_lib.load_tokenizer(None)
  env_kwargs = json.loads(flags.env_kwargs)
  model = transformer.tiny(tok.vocab_size)
  graphdef, _ = transformer.create(model, flags.seed)  # unused by scripted actors
  runner = loop_lib.RolloutRunner(graphdef, model, tok, loop_lib.RolloutConfig(
      max_turns=flags.max_turns, max_len=flags.max_len))
  actor_rng = np.random.default_rng(flags.seed)
  batches = []
  n = flags.episodes_per_policy
  for p, noise in enumerate(float(x) for x in flags.noise_levels.split(",")):
    seeds = [_SEED_BASE + p * n + i for i in range(n)]
    envs = [registry.make(flags.env_name, **env_kwargs) for _ in seeds]
    traj, _ = runner.collect(envs, seeds, list(range(n)), actor=loop_lib.noisy_expert(noise),
                             actor_rng=actor_rng)
    keep = np.flatnonzero(np.asarray(traj.success))
    print(f"noise {noise:.2f}: {len(keep)}/{n} episodes completed", flush=True)
    batches.append(jax.tree.map(lambda x: np.asarray(x)[keep], traj))
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)


def train(flags: argparse.Namespace, data: types.Trajectories):
  """Fits the meter by minibatch Adam; returns (params, config, held-out and baseline losses)."""
  rng = np.random.default_rng(flags.seed)
  order = rng.permutation(data.batch_size)
  n_hold = max(1, int(flags.holdout_fraction * data.batch_size))
  hold = jax.tree.map(lambda x: jnp.asarray(x[order[:n_hold]]), data)
  fit = jax.tree.map(lambda x: x[order[n_hold:]], data)
  config = deltattg.MeterConfig()
  params = deltattg.init_meter(config, jax.random.key(flags.seed))
  optimizer = optax.adam(flags.learning_rate)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(deltattg.meter_loss)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  for i in range(flags.steps):
    idx = rng.choice(fit.batch_size, size=min(flags.batch_size, fit.batch_size), replace=False)
    params, opt_state, loss = step(params, opt_state, jax.tree.map(lambda x: jnp.asarray(x[idx]), fit))
    if (i + 1) % 100 == 0:
      print(f"step {i + 1}: train Huber {float(loss):.4f}", flush=True)
  held_out = float(deltattg.meter_loss(params, hold))
  targets = deltattg.ttg_targets(hold)
  mask = jnp.asarray(hold.turn_mask, bool)
  constant = jnp.sum(jnp.where(mask, targets, 0.0)) / jnp.sum(mask)
  baseline = float(jnp.sum(jnp.where(mask, optax.huber_loss(constant, targets), 0.0)) / jnp.sum(mask))
  return params, config, held_out, baseline


def main(argv: Sequence[str] | None = None) -> int:
  flags = parse_flags(argv)
  data = record(flags)
  if data.batch_size < 2:
    print("error: fewer than 2 completed episodes were recorded; raise --episodes_per_policy",
          file=sys.stderr)
    return 1
  params, config, held_out, baseline = train(flags, data)
  os.makedirs(os.path.dirname(os.path.abspath(flags.out)), exist_ok=True)
  deltattg.save_meter(flags.out, params, config)
  print(f"held-out Huber loss {held_out:.4f} (best constant: {baseline:.4f}); saved {flags.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
