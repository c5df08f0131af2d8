"""DeltaTTG — a frozen Token-to-Go progress meter redistributes the outcome advantage.

A small meter `M_φ`, trained once by regression on recorded trajectories from diverse policies,
predicts the remaining effort `m_k = M_φ(h_k) ≈ log(1 + TTG_k)` before each turn k, where
`TTG_k = Σ_{j≥k} ntok_j` counts the policy tokens still to be generated. During actor training
the meter's change across each turn moves the trajectory's advantage between its turns:

  m_{K_b+1} = 0 if the task completed, else m_{K_b}         (no progress at a failed end)
  Δ_k = m_k − m_{k+1}                                        (positive = closer to completion)
  z_k = clip((Δ_k − μ_b)/(σ_b + 1e-6), −z_max, z_max)        (ntok-weighted μ_b, σ_b)
  u_k = exp(τ·sign(A_b)·z_k)
  w̃_k = u_k·Σ_k ntok_k / Σ_k ntok_k·u_k                      (token-weighted mean 1)
  w_k = (1 − η) + η·w̃_k                                      (still mean 1, and ≥ 1 − η > 0)
  A'_t = A_t·w_{turn(t)}

Each trajectory keeps its sign and, for a trajectory-level advantage, its token average. The
meter here is deliberately small (hashed token embeddings and an MLP) and frozen: its params are
closed over by the jitted update. `experiments/train_deltattg_meter.py` trains it.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax import trajectory

Array = jax.Array
Params = dict[str, Any]

# Multiplier of the (token id, offset) bucket hash; any large odd number spreads the pairs.
_BUCKET_MIX = 1_000_003


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MeterConfig:
  """Size of the progress meter.

  Attributes:
    num_buckets: hash buckets of the token embeddings.
    width: embedding width.
    hidden: MLP hidden width.
  """

  num_buckets: int = 1024
  width: int = 32
  hidden: int = 64

  def __post_init__(self):
    config_errors.check_field_types(self)
    for name in ("num_buckets", "width", "hidden"):
      value = getattr(self, name)
      if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"MeterConfig.{name} must be an int >= 1, got {value!r}")


def init_meter(config: MeterConfig, key: jax.Array) -> Params:
  """Random meter parameters (small-scale normal embeddings, He-scaled MLP)."""
  keys = jax.random.split(key, 5)
  d, h = config.width, config.hidden
  n_in = 2 * d + 2
  return {
      "obs_embed": 0.1 * jax.random.normal(keys[0], (config.num_buckets, d)),
      "hist_embed": 0.1 * jax.random.normal(keys[1], (config.num_buckets, d)),
      "w1": jax.random.normal(keys[2], (n_in, h)) * np.sqrt(2.0 / n_in), "b1": jnp.zeros((h,)),
      "w2": jax.random.normal(keys[3], (h, h)) * np.sqrt(2.0 / h), "b2": jnp.zeros((h,)),
      "w3": jax.random.normal(keys[4], (h, 1)) * np.sqrt(1.0 / h), "b3": jnp.zeros((1,)),
  }


def meter_features(params: Params, traj: types.Trajectories) -> Array:
  """`[B, N, 2·width + 2]` features of the history before each turn's action.

  Three parts: the mean embedding of the observation that opened turn k, each token bucketed with
  its offset from the observation's end (the board or page sits at the end, so offsets line up
  across turns whose feedback lines differ in length); the mean embedding of every token before
  the turn's action; and the turn index (scaled and log).
  """
  tokens = jnp.asarray(traj.tokens)
  turn = jnp.asarray(traj.turn_of_token)
  action = jnp.asarray(traj.action_mask, bool)
  b, l = tokens.shape
  n = traj.turn_mask.shape[1]
  buckets = params["obs_embed"].shape[0]
  positions = jnp.arange(l)[None, :]
  in_turn = turn[:, :, None] == jnp.arange(n)[None, None, :]                      # [B, L, N]
  obs_tokens = in_turn & ~action[:, :, None]
  obs_end = jnp.max(jnp.where(obs_tokens, positions[:, :, None], -1), axis=1)    # [B, N]
  safe_turn = jnp.clip(turn, 0, n - 1)
  offset = jnp.take_along_axis(obs_end, safe_turn, axis=1) - positions
  obs_bucket = (tokens * _BUCKET_MIX + offset) % buckets
  obs_vectors = params["obs_embed"][obs_bucket]                                  # [B, L, d]
  obs_weight = obs_tokens.astype(jnp.float32)
  obs_count = jnp.maximum(jnp.sum(obs_weight, axis=1), 1.0)[..., None]
  obs_mean = jnp.einsum("bln,bld->bnd", obs_weight, obs_vectors) / obs_count
  hist_vectors = params["hist_embed"][tokens % buckets] * (turn >= 0)[..., None]
  cumulative = jnp.concatenate(
      [jnp.zeros((b, 1, hist_vectors.shape[-1])), jnp.cumsum(hist_vectors, axis=1)], axis=1)
  start = jnp.clip(jnp.asarray(traj.turn_start), 0, l)
  hist_sum = jnp.take_along_axis(cumulative, start[..., None], axis=1)
  hist_mean = hist_sum / jnp.maximum(start, 1)[..., None].astype(jnp.float32)
  k = jnp.broadcast_to(jnp.arange(n, dtype=jnp.float32)[None, :, None], (b, n, 1))
  return jnp.concatenate([obs_mean, hist_mean, k / n, jnp.log1p(k)], axis=-1)


def meter_apply(params: Params, traj: types.Trajectories) -> Array:
  """`[B, N]` predicted remaining effort `m_k ≈ log(1 + TTG_k)` (0 on missing turns)."""
  x = meter_features(params, traj)
  x = jax.nn.relu(x @ params["w1"] + params["b1"])
  x = jax.nn.relu(x @ params["w2"] + params["b2"])
  m = (x @ params["w3"] + params["b3"])[..., 0]
  return jnp.where(jnp.asarray(traj.turn_mask, bool), m, 0.0)


def ttg_targets(traj: types.Trajectories) -> Array:
  """`[B, N]` regression targets `log(1 + TTG_k)`, `TTG_k = Σ_{j≥k} ntok_j` (a reverse cumsum)."""
  ntok = trajectory.tokens_per_turn(traj)
  to_go = jnp.flip(jnp.cumsum(jnp.flip(ntok, axis=1), axis=1), axis=1)
  return jnp.where(jnp.asarray(traj.turn_mask, bool), jnp.log1p(to_go), 0.0)


def meter_loss(params: Params, traj: types.Trajectories, *, delta: float = 1.0) -> Array:
  """Mean Huber(δ) loss of the meter on the turns of completed (`success`) trajectories."""
  weight = (jnp.asarray(traj.turn_mask, bool) & jnp.asarray(traj.success, bool)[:, None])
  weight = weight.astype(jnp.float32)
  errors = optax.huber_loss(meter_apply(params, traj), ttg_targets(traj), delta=delta)
  return jnp.sum(errors * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def save_meter(path: str, params: Params, config: MeterConfig) -> None:
  """Writes the meter's params and config to one `.npz` file (atomically, via a buffer)."""
  buffer = io.BytesIO()
  np.savez(buffer, **{k: np.asarray(v) for k, v in params.items()},
           **{f"config.{f.name}": getattr(config, f.name) for f in dataclasses.fields(config)})
  with open(path, "wb") as f:
    f.write(buffer.getvalue())


def load_meter(path: str) -> tuple[Params, MeterConfig]:
  """Reads a meter written by `save_meter`."""
  with np.load(path) as data:
    config = MeterConfig(**{k.split(".", 1)[1]: int(data[k]) for k in data.files if k.startswith("config.")})
    params = {k: jnp.asarray(data[k]) for k in data.files if not k.startswith("config.")}
  return params, config


def progress_weights(meter: Array, ntok: Array, turn_mask: Array, completed: Array, direction: Array,
                     *, temperature: float = 1.0, mix: float = 0.5, z_max: float = 3.0) -> Array:
  """`[B, N]` redistribution weights `w` (1 on missing turns); see the module docstring.

  Args:
    meter: `[B, N]` remaining effort `m_k` before each turn, turns [0, N).
    ntok: `[B, N]` action tokens of each turn.
    turn_mask: `[B, N]` bool; the existing turns form a prefix.
    completed: `[B]` bool, the task was completed (the meter ends at 0).
    direction: `[B]` sign of each trajectory's advantage (−1, 0 or 1).
    temperature: τ ≥ 0.
    mix: η in [0, 1).
    z_max: z clip > 0.
  """
  _check(temperature, mix, z_max)
  chex.assert_rank([meter, ntok, turn_mask, completed, direction], [2, 2, 2, 1, 1])
  turn_mask = turn_mask.astype(bool)
  last = trajectory.last_turn(turn_mask)
  m_last = jnp.sum(jnp.where(last, meter, 0.0), axis=1)
  terminal = jnp.where(completed.astype(bool), 0.0, m_last)
  following = jnp.concatenate([meter[:, 1:], jnp.zeros_like(meter[:, :1])], axis=1)
  following = jnp.where(last, terminal[:, None], following)
  delta = jnp.where(turn_mask, meter - following, 0.0)
  weight = jnp.where(turn_mask, ntok, 0.0)
  total = jnp.maximum(jnp.sum(weight, axis=1, keepdims=True), 1e-12)
  mean = jnp.sum(weight * delta, axis=1, keepdims=True) / total
  std = jnp.sqrt(jnp.sum(weight * (delta - mean) ** 2, axis=1, keepdims=True) / total)
  z = jnp.clip((delta - mean) / (std + 1e-6), -z_max, z_max)
  u = jnp.exp(temperature * direction[:, None] * z)
  tilde = u * total / jnp.maximum(jnp.sum(weight * u, axis=1, keepdims=True), 1e-12)
  w = (1.0 - mix) + mix * tilde
  return jnp.where(turn_mask & (jnp.sum(weight, axis=1, keepdims=True) > 0), w, 1.0)


def trajectory_direction(traj: types.Trajectories, advantages: Array) -> Array:
  """`[B]` sign of each trajectory's token-average advantage (its `A_b` for outcome estimators)."""
  mask = jnp.asarray(traj.action_mask, bool)
  total = jnp.sum(jnp.where(mask, advantages.astype(jnp.float32), 0.0), axis=1)
  return jnp.sign(total)


def ttg_redistribution(traj: types.Trajectories, advantages: Array, meter: Array, *,
                       temperature: float = 1.0, mix: float = 0.5, z_max: float = 3.0) -> Array:
  """`A'_t = A_t·w_{turn(t)}` on action tokens, with `w` from `progress_weights`."""
  chex.assert_rank(advantages, 2)
  w = progress_weights(meter.astype(jnp.float32), trajectory.tokens_per_turn(traj),
                       jnp.asarray(traj.turn_mask), jnp.asarray(traj.success),
                       trajectory_direction(traj, advantages), temperature=temperature, mix=mix,
                       z_max=z_max)
  token_w = jnp.take_along_axis(w, jnp.clip(jnp.asarray(traj.turn_of_token), 0, w.shape[1] - 1), axis=1)
  policy = jnp.asarray(traj.action_mask, bool)
  scaled = (advantages.astype(jnp.float32) * token_w).astype(advantages.dtype)
  return jnp.where(policy, scaled, advantages)


def ttg_progress_credit(traj: types.Trajectories, advantages: Array, *, temperature: float = 1.0,
                        mix: float = 0.5, z_max: float = 3.0) -> Array:
  """Correction: DeltaTTG with meter values the rollout recorded.

  Needs `traj.extras["ttg_meter"]` (`[B, N]` float32, `m_k` before each turn). Use `DeltaTTG`
  to compute the meter in the update instead.
  """
  meter = trajectory.require(traj.extras, extra_keys.METER_KEY, where="extras", method="ttg_progress_credit (DeltaTTG)",
                        meaning="[B, N] meter estimate of the remaining effort before each turn")
  return ttg_redistribution(traj, advantages, meter, temperature=temperature, mix=mix, z_max=z_max)


class DeltaTTG:
  """Correction: DeltaTTG with its frozen meter; `__call__(traj, advantages)` is pure.

  The meter's params are the only state; they never change during actor training, so the jitted
  update may close over them. `state_dict()` returns them for the checkpoint.
  """

  def __init__(self, meter_path: str | None = None, *, params: Params | None = None,
               config: MeterConfig | None = None, temperature: float = 1.0, mix: float = 0.5,
               z_max: float = 3.0):
    """Loads the meter from `meter_path` (written by `save_meter`), or takes `params` directly.

    Args:
      meter_path: a `.npz` from `experiments/train_deltattg_meter.py`.
      params, config: the meter itself, instead of a path.
      temperature: τ ≥ 0 (default 1).
      mix: η in [0, 1) (default 0.5).
      z_max: z clip > 0 (default 3).
    """
    _check(temperature, mix, z_max)
    if (meter_path is None) == (params is None):
      raise ValueError("DeltaTTG needs exactly one of meter_path (a trained meter .npz, see "
                       "experiments/train_deltattg_meter.py) and params")
    if meter_path is not None:
      params, config = load_meter(meter_path)
    self.params, self.config = params, config or MeterConfig()
    self.temperature, self.mix, self.z_max = temperature, mix, z_max

  def meter(self, traj: types.Trajectories) -> Array:
    return meter_apply(self.params, traj)

  def __call__(self, traj: types.Trajectories, advantages: Array) -> Array:
    return ttg_redistribution(traj, advantages, self.meter(traj), temperature=self.temperature,
                              mix=self.mix, z_max=self.z_max)

  def state_dict(self) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in self.params.items()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    missing = sorted(set(self.params) - set(state))
    if missing:
      raise ValueError(f"DeltaTTG.load_state_dict: missing meter params {missing}")
    self.params = {k: jnp.asarray(state[k]) for k in self.params}


def _check(temperature: float, mix: float, z_max: float) -> None:
  if not temperature >= 0:
    raise ValueError(f"deltattg temperature must be >= 0, got {temperature!r}")
  if not 0.0 <= mix < 1.0:
    raise ValueError(f"deltattg mix must be in [0, 1) so that every weight stays positive, got {mix!r}")
  if not z_max > 0:
    raise ValueError(f"deltattg z_max must be > 0, got {z_max!r}")
