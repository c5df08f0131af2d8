"""Rollout benchmarks; every figure is a ratio against an anchor measured in the same run.

1. Per-turn cost vs turn index over 20 turns at equal new tokens per turn, with the KV cache held
   across turns (each turn prefills only its new observation), against re-prefilling the whole
   conversation every turn. The cached run is measured twice: over the whole cache every turn,
   and in the smallest cache window that holds the conversation (`RolloutConfig.cache_windows`).
2. Env-step overlap: slow envs (a sleep per step) stepped by the thread pool vs one after another.
3. GIL-bound envs (a busy loop per step): one after another vs threads vs worker processes.

  python bench/rollout.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrl_jax.parallel import host_memory  # noqa: E402

host_memory.keep_freed_memory()  # as experiments/run.py does, before JAX starts its threads

import jax  # noqa: E402
import numpy as np  # noqa: E402

from agentrl_jax.envs import base  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402
from agentrl_jax.rollout import workers  # noqa: E402

BATCH, TURNS, OBS_TOKENS, ACTION_TOKENS, VOCAB = 32, 20, 24, 8, 512
# Each figure is the fastest of REPEATS runs, the variants interleaved, so load from other
# processes on a shared machine inflates none of them selectively.
REPEATS = 5


def _timed(fn, *args):
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


WINDOWS = (64, 128, 256, 512)


def _window(turn: int, capacity: int, windows) -> int | None:
  need = (turn + 1) * (OBS_TOKENS + ACTION_TOKENS)
  return next((w for w in windows if need <= w < capacity), None)


def _cached_turn_costs(graphdef, params, cfg, sample, windows=()):
  """Seconds per turn of one 20-turn episode batch with the cache held across turns."""
  capacity = TURNS * (OBS_TOKENS + ACTION_TOKENS) + OBS_TOKENS + ACTION_TOKENS
  obs = np.ones((BATCH, OBS_TOKENS), np.int32)
  obs_len = np.full((BATCH,), OBS_TOKENS, np.int32)
  active = np.ones((BATCH,), bool)
  cache = transformer.init_cache(cfg, BATCH, capacity)
  costs = []
  for turn in range(TURNS):
    start = time.perf_counter()
    out = sample(params, cache, obs, obs_len, active, np.int32(turn), jax.random.key(turn),
                 window=_window(turn, capacity, windows))
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


def _fastest(runs):
  """Per-turn minimum over repeated runs [[seconds per turn], ...]."""
  return [min(run[t] for run in runs) for t in range(TURNS)]


def bench_turn_costs():
  cfg = transformer.TransformerConfig(vocab_size=VOCAB, num_layers=2, d_model=64, num_heads=4,
                                      mlp_dim=256, position="turn_slot", alibi=True,
                                      max_turns=32, max_slots=64)
  graphdef, params = transformer.create(cfg, 0)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=ACTION_TOKENS)
  sample = sampler_lib.make_turn_sampler(graphdef, sampling, VOCAB)
  variants = {"whole cache": (), "windowed": WINDOWS}
  for windows in variants.values():
    _cached_turn_costs(graphdef, params, cfg, sample, windows)  # compile
  _reprefill_turn_costs(graphdef, params, cfg, sample)  # compile every length
  timings = {name: [] for name in list(variants) + ["re-prefill"]}
  for _ in range(REPEATS):
    for name, windows in variants.items():
      timings[name].append(_cached_turn_costs(graphdef, params, cfg, sample, windows))
    timings["re-prefill"].append(_reprefill_turn_costs(graphdef, params, cfg, sample))
  runs = {name: _fastest(timings[name]) for name in variants}
  reprefill = _fastest(timings["re-prefill"])
  print(f"## Per-turn cost, batch {BATCH}, {OBS_TOKENS} new observation tokens + "
        f"{ACTION_TOKENS} action tokens per turn; windows {WINDOWS}")
  print("| turn | cached, whole cache (ms) | cached, windowed (ms) | re-prefill (ms) |")
  print("|---|---|---|---|")
  for t in (0, 4, 9, 14, 19):
    print(f"| {t + 1} | {1e3 * runs['whole cache'][t]:.1f} | {1e3 * runs['windowed'][t]:.1f} | "
          f"{1e3 * reprefill[t]:.1f} |")
  for name, per_turn in runs.items():
    print(f"{name}: turn 20 / turn 1: {per_turn[-1] / per_turn[0]:.2f} (target <= 1.2); "
          f"total re-prefill / total cached: {sum(reprefill) / sum(per_turn):.2f} (target >= 5)")


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


class _BusyEnv:
  """Spends a fixed amount of pure-Python work per step, holding the GIL (a Python simulator).

  The work is counted in iterations, not wall time: a wall-clock busy-wait would also run out
  while its thread waits for the GIL, and so fake an overlap.
  """

  def __init__(self, iterations):
    self.iterations = iterations

  def reset(self, seed):
    return "start"

  def step(self, action):
    total = 0
    for i in range(self.iterations):
      total += i * i
    return base.StepResult(action, float(total % 2), False, {"action_valid": True})


def _iterations_for(seconds: float) -> int:
  probe = _BusyEnv(100_000)
  start = time.perf_counter()
  probe.step("a")
  return max(1, int(100_000 * seconds / (time.perf_counter() - start)))


def bench_gil_bound_envs(num_envs=16, seconds=0.01, steps=5):
  """Threads cannot overlap envs that hold the GIL; worker processes can (up to the cores)."""
  iterations = _iterations_for(seconds)
  timings = {}
  for name, config in [("sequential", workers.WorkerConfig(num_threads=0)),
                       ("16 threads", workers.WorkerConfig(num_threads=num_envs)),
                       ("2 processes", workers.WorkerConfig(kind="process", num_processes=2))]:
    stepper = workers.EnvStepper(config)
    envs = [stepper.make_env(_BusyEnv, iterations=iterations) for _ in range(num_envs)]
    for env in envs:
      env.reset(0)
    stepper.step(envs, ["a"] * num_envs)  # warm up (process start-up is not stepping)
    start = time.perf_counter()
    for _ in range(steps):
      stepper.step(envs, ["a"] * num_envs)
    timings[name] = time.perf_counter() - start
    stepper.close()
  print(f"## GIL-bound envs: {num_envs} envs, ~{1e3 * seconds:.0f} ms of Python work per step, "
        f"{steps} steps, {os.cpu_count()} cores")
  for name, value in timings.items():
    print(f"{name}: {value:.2f} s ({timings['sequential'] / value:.1f}x)")


if __name__ == "__main__":
  print(f"devices: {jax.devices()}")
  bench_turn_costs()
  bench_env_overlap()
  bench_gil_bound_envs()
