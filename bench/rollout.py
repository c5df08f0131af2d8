"""Rollout benchmarks; every figure is a ratio against an anchor measured in the same run.

1. Per-turn cost vs turn index over 20 turns at equal new tokens per turn, with the KV cache held
   across turns (each turn prefills only its new observation), against re-prefilling the whole
   conversation every turn.
2. Env-step overlap: slow envs (a sleep per step) stepped by the thread pool vs one after another.

  python bench/rollout.py
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.models import transformer
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers

BATCH, TURNS, OBS_TOKENS, ACTION_TOKENS, VOCAB = 32, 20, 24, 8, 512
REPEATS = 3


def _timed(fn, *args):
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def _cached_turn_costs(graphdef, params, cfg, sample):
  """Seconds per turn of one 20-turn episode batch with the cache held across turns."""
  capacity = TURNS * (OBS_TOKENS + ACTION_TOKENS) + OBS_TOKENS + ACTION_TOKENS
  obs = np.ones((BATCH, OBS_TOKENS), np.int32)
  obs_len = np.full((BATCH,), OBS_TOKENS, np.int32)
  active = np.ones((BATCH,), bool)
  cache = transformer.init_cache(cfg, BATCH, capacity)
  costs = []
  for turn in range(TURNS):
    start = time.perf_counter()
    out = sample(params, cache, obs, obs_len, active, np.int32(turn), jax.random.key(turn))
    jax.block_until_ready(out.tokens)
    costs.append(time.perf_counter() - start)
    cache = out.cache
  return costs


def _reprefill_turn_costs(graphdef, params, cfg, sample):
  """Seconds per turn when every turn starts from an empty cache and prefills the whole history."""
  costs = []
  for turn in range(TURNS):
    length = (turn + 1) * OBS_TOKENS + turn * ACTION_TOKENS
    tokens = np.ones((BATCH, length), np.int32)
    cache = transformer.init_cache(cfg, BATCH, length + ACTION_TOKENS)
    args = (params, cache, tokens, np.full((BATCH,), length, np.int32), np.ones((BATCH,), bool),
            np.int32(turn), jax.random.key(turn))
    jax.block_until_ready(sample(*args).tokens)  # compile this length outside the timing
    cache = transformer.init_cache(cfg, BATCH, length + ACTION_TOKENS)
    args = (params, cache) + args[2:]
    costs.append(_timed(lambda *a: sample(*a).tokens, *args))
  return costs


def bench_turn_costs():
  cfg = transformer.TransformerConfig(vocab_size=VOCAB, num_layers=2, d_model=64, num_heads=4,
                                      mlp_dim=256, position="turn_slot", alibi=True,
                                      max_turns=32, max_slots=64)
  graphdef, params = transformer.create(cfg, 0)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=ACTION_TOKENS)
  sample = sampler_lib.make_turn_sampler(graphdef, sampling, VOCAB)
  _cached_turn_costs(graphdef, params, cfg, sample)  # compile
  cached = [_cached_turn_costs(graphdef, params, cfg, sample) for _ in range(REPEATS)]
  per_turn = [statistics.median(c[t] for c in cached) for t in range(TURNS)]
  reprefill = _reprefill_turn_costs(graphdef, params, cfg, sample)
  print(f"## Per-turn cost, batch {BATCH}, {OBS_TOKENS} new observation tokens + "
        f"{ACTION_TOKENS} action tokens per turn")
  print("| turn | cached (ms) | re-prefill (ms) |")
  print("|---|---|---|")
  for t in (0, 4, 9, 14, 19):
    print(f"| {t + 1} | {1e3 * per_turn[t]:.1f} | {1e3 * reprefill[t]:.1f} |")
  print(f"turn 20 / turn 1 (cached): {per_turn[-1] / per_turn[0]:.2f}  (target <= 1.2)")
  print(f"total re-prefill / total cached: {sum(reprefill) / sum(per_turn):.2f}  (target >= 5)")


class _SlowEnv:
  def __init__(self, seconds):
    self.seconds = seconds

  def step(self, action):
    time.sleep(self.seconds)
    return base.StepResult(action, 0.0, False, {"action_valid": True})


def bench_env_overlap(num_envs=32, seconds=0.02, steps=5):
  envs = [_SlowEnv(seconds) for _ in range(num_envs)]
  timings = {}
  for name, config in [("sequential", workers.WorkerConfig(num_threads=0)),
                       ("32 threads", workers.WorkerConfig(num_threads=num_envs))]:
    stepper = workers.EnvStepper(config)
    start = time.perf_counter()
    for _ in range(steps):
      stepper.step(envs, ["a"] * num_envs)
    timings[name] = time.perf_counter() - start
    stepper.close()
  print(f"## Env-step overlap: {num_envs} envs sleeping {1e3 * seconds:.0f} ms per step, {steps} steps")
  for name, value in timings.items():
    print(f"{name}: {value:.2f} s")
  print(f"speed-up: {timings['sequential'] / timings['32 threads']:.1f}x")


if __name__ == "__main__":
  print(f"devices: {jax.devices()}")
  bench_turn_costs()
  bench_env_overlap()
