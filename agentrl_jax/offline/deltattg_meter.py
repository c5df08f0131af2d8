"""DeltaTTG's progress meter, fitted offline on scripted episodes (docs/methods.md#deltattg).

The meter predicts each turn's remaining effort, `log(1 + tokens to go)`, and stays frozen while the
actor trains (`credit.deltattg.DeltaTTG`). It is fitted here, before any actor training: episodes of
the env's expert with each action replaced by a random one at several noise levels (noise 1 is a
random policy), the completed ones kept, and a Huber regression on their token-to-go targets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import types
from agentrl_jax.credit import deltattg
from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib

# Recording seeds sit apart from training (0…) and held-out evaluation (1e9…) seeds.
SEED_BASE = 700_000_000
NOISE_LEVELS = (0.0, 0.2, 0.5, 1.0)


class MeterFit(NamedTuple):
  """A fitted meter and its held-out Huber loss beside the best constant prediction's."""

  params: dict[str, jax.Array]
  config: deltattg.MeterConfig
  held_out_loss: float
  constant_loss: float


def record_episodes(env_name: str, env_kwargs: Mapping[str, Any], *,
                    noise_levels: Sequence[float] = NOISE_LEVELS, episodes_per_policy: int = 192,
                    max_turns: int = 10, max_len: int = 384, seed: int = 0,
                    log: Callable[[str], None] = print) -> types.Trajectories:
  """Completed episodes of the noisy expert at every noise level, concatenated along the batch.

  `max_turns` must be the training rollout's: the meter reads the turn index as a share of it.
  """
  tok = tokenizer_lib.load_tokenizer(None)
  model = transformer.tiny(tok.vocab_size)
  graphdef, _ = transformer.create(model, seed)  # the scripted actors never call the policy
  runner = loop_lib.RolloutRunner(graphdef, model, tok, loop_lib.RolloutConfig(
      max_turns=max_turns, max_len=max_len))
  actor_rng = np.random.default_rng(seed)
  batches = []
  n = episodes_per_policy
  for p, noise in enumerate(float(x) for x in noise_levels):
    seeds = [SEED_BASE + p * n + i for i in range(n)]
    envs = [registry.make(env_name, **dict(env_kwargs)) for _ in seeds]
    traj, _ = runner.collect(envs, seeds, list(range(n)), actor=loop_lib.noisy_expert(noise),
                             actor_rng=actor_rng)
    keep = np.flatnonzero(np.asarray(traj.success))
    log(f"noise {noise:.2f}: {len(keep)}/{n} episodes completed")
    batches.append(jax.tree.map(lambda x, keep=keep: np.asarray(x)[keep], traj))
  return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)


def fit_meter(data: types.Trajectories, *, steps: int = 400, batch_size: int = 64,
              learning_rate: float = 3e-3, holdout_fraction: float = 0.2, seed: int = 0,
              log: Callable[[str], None] = print) -> MeterFit:
  """Fits the meter by minibatch Adam on all but a held-out share of `data`'s episodes.

  Raises:
    ValueError: fewer than 2 episodes (one to fit, one to hold out).
  """
  if data.batch_size < 2:
    raise ValueError(f"the DeltaTTG meter needs >= 2 completed episodes, got {data.batch_size}; "
                     "record more episodes per policy")
  rng = np.random.default_rng(seed)
  order = rng.permutation(data.batch_size)
  n_hold = min(max(1, int(holdout_fraction * data.batch_size)), data.batch_size - 1)
  hold = jax.tree.map(lambda x: jnp.asarray(x[order[:n_hold]]), data)
  fit = jax.tree.map(lambda x: x[order[n_hold:]], data)
  config = deltattg.MeterConfig()
  params = deltattg.init_meter(config, jax.random.key(seed))
  optimizer = optax.adam(learning_rate)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(deltattg.meter_loss)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  for i in range(steps):
    idx = rng.choice(fit.batch_size, size=min(batch_size, fit.batch_size), replace=False)
    params, opt_state, loss = step(params, opt_state,
                                   jax.tree.map(lambda x, idx=idx: jnp.asarray(x[idx]), fit))
    if (i + 1) % 100 == 0:
      log(f"step {i + 1}: train Huber {float(loss):.4f}")
  held_out = float(deltattg.meter_loss(params, hold))
  targets = deltattg.ttg_targets(hold)
  mask = jnp.asarray(hold.turn_mask, bool)
  constant = jnp.sum(jnp.where(mask, targets, 0.0)) / jnp.sum(mask)
  constant_loss = jnp.sum(jnp.where(mask, optax.huber_loss(constant, targets), 0.0)) / jnp.sum(mask)
  return MeterFit(params, config, held_out, float(constant_loss))


def save(out: str | os.PathLike[str], fit: MeterFit) -> None:
  """Writes `fit`'s meter to `out`, making its directory."""
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  deltattg.save_meter(os.fspath(out), fit.params, fit.config)


def train_meter(out: str | os.PathLike[str], env_name: str, env_kwargs: Mapping[str, Any], *,
                max_turns: int, max_len: int, seed: int = 0,
                episodes_per_policy: int = 192, steps: int = 400,
                log: Callable[[str], None] = print) -> MeterFit:
  """Records, fits and saves a meter to `out` (a `.npz` that `DeltaTTG(meter_path=...)` reads)."""
  data = record_episodes(env_name, env_kwargs, episodes_per_policy=episodes_per_policy,
                         max_turns=max_turns, max_len=max_len, seed=seed, log=log)
  result = fit_meter(data, steps=steps, seed=seed, log=log)
  save(out, result)
  log(f"held-out Huber loss {result.held_out_loss:.4f} (best constant: "
      f"{result.constant_loss:.4f}); saved {out}")
  return result
