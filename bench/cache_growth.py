"""A turn's cost against the part of the KV cache in use: a growing cache vs one of full capacity.

Measures, in one process and against the former path ('capacity': one stacked cache of the
rollout's whole capacity from the first turn, so every decode step attends over every slot):

1. Turn 1 of an episode whose cache is sized for 5 turns vs one sized for 40 turns. The turn's
   tokens are the same; only the capacity differs, so the ratio is 1 when a turn's cost follows
   the tokens in use (goal: <= 1.3).
2. A 20-turn episode with the cache held across turns (each turn prefills its new observation
   and decodes its action), total time (goal: >= 1.5x faster than 'capacity').
3. How many programs each variant compiles for that episode (one observation width), counting
   the growing cache's copies.

Variants: 'capacity' (the former path, `RolloutConfig(grow_cache=False)`); 'growing' (the
default: `sampler.growing_cache` starts at 64 slots, per layer, and `sampler.fit_cache` grows it
by about √2 before a turn that would outgrow it; the copy is timed with that turn); 'growing x2'
(the same, doubling: `cache_steps_per_doubling=1`); 'windows' (the full-capacity cache run in
the smallest of the same sizes that holds the conversation, `RolloutConfig.cache_windows`).

Models: the tiny policy of `bench/rollout.py` (turn/slot embeddings and ALiBi) at batch 32, and a
SmolLM2-135M-shaped Llama (RoPE, 9 query / 3 KV heads) with random weights. Each figure is the
sum of per-turn minima over `--repeats` rounds, the variants interleaved within a round, so load
from other processes inflates none of them selectively. Greedy decoding; the script checks that
every variant samples the same tokens as 'capacity'.

  python bench/cache_growth.py [--repeats 5] [--smollm-layers 30] [--smollm-batch 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrl_jax.parallel import host_memory  # noqa: E402

host_memory.keep_freed_memory()  # as experiments/run.py does, before JAX starts its threads

import jax  # noqa: E402
import numpy as np  # noqa: E402

from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402

OBS_TOKENS, ACTION_TOKENS, TURNS = 24, 8, 20
TURN_TOKENS = OBS_TOKENS + ACTION_TOKENS
SHORT_TURNS, LONG_TURNS = 5, 40
VARIANTS = ("capacity", "growing", "growing x2", "windows")
STEPS = {"growing": 2, "growing x2": 1}  # cache sizes per doubling


def capacity_for(turns: int) -> int:
  # As `RolloutConfig.cache_capacity`: the conversation plus one whole turn of headroom.
  return turns * TURN_TOKENS + TURN_TOKENS


class Case:
  """One model and batch, with a jitted turn sampler per variant."""

  def __init__(self, name: str, config: transformer.TransformerConfig, batch: int):
    self.name, self.config, self.batch = name, config, batch
    self.graphdef, self.params = transformer.create(config, 0)
    sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=ACTION_TOKENS)
    # One sampler per variant, so each counts its own compiles.
    self.samplers = {v: sampler_lib.make_turn_sampler(self.graphdef, sampling, config.vocab_size)
                     for v in VARIANTS}
    rng = np.random.default_rng(0)
    self.obs = rng.integers(4, config.vocab_size, (TURNS, batch, OBS_TOKENS)).astype(np.int32)
    self.obs_len = np.full((batch,), OBS_TOKENS, np.int32)
    self.active = np.ones((batch,), bool)

  def empty_cache(self, variant: str, capacity: int) -> transformer.KVCache:
    if variant in STEPS:
      cache = sampler_lib.growing_cache(self.config, self.batch, capacity, STEPS[variant])
    else:
      cache = transformer.init_cache(self.config, self.batch, capacity)
    return jax.block_until_ready(cache)

  def turn(self, variant: str, cache, turn: int, capacity: int):
    need = turn * TURN_TOKENS + TURN_TOKENS  # as the rollout loop computes it
    window = None
    if variant in STEPS:
      cache = sampler_lib.fit_cache(cache, need, capacity, STEPS[variant])
    elif variant == "windows":
      window = next((w for w in sampler_lib.cache_sizes(capacity)[:-1] if need <= w), None)
    return self.samplers[variant](self.params, cache, self.obs[turn], self.obs_len, self.active,
                                  np.int32(turn), jax.random.key(turn), window=window)

  def first_turn_seconds(self, variant: str, capacity: int) -> float:
    cache = self.empty_cache(variant, capacity)
    start = time.perf_counter()
    jax.block_until_ready(self.turn(variant, cache, 0, capacity))
    return time.perf_counter() - start

  def episode(self, variant: str) -> tuple[list[float], np.ndarray, int]:
    """Seconds per turn of a TURNS-turn episode, its sampled tokens [TURNS, B, A], and how many
    times its cache grew."""
    capacity = capacity_for(TURNS)
    cache = self.empty_cache(variant, capacity)
    seconds, tokens, sizes = [], [], [cache.capacity]
    for turn in range(TURNS):
      start = time.perf_counter()
      out = jax.block_until_ready(self.turn(variant, cache, turn, capacity))
      seconds.append(time.perf_counter() - start)
      tokens.append(np.asarray(out.tokens))
      cache = out.cache
      sizes.append(cache.capacity)
    return seconds, np.stack(tokens), len(set(sizes)) - 1


def run_case(case: Case, repeats: int) -> dict:
  caps = (capacity_for(SHORT_TURNS), capacity_for(LONG_TURNS))
  tokens, compiles = {}, {}
  for v in VARIANTS:  # compile every shape outside the timings
    before = case.samplers[v]._cache_size()
    _, tokens[v], growths = case.episode(v)
    # Each growth is a (small) program too: a copy into the next size.
    compiles[v] = case.samplers[v]._cache_size() - before + growths
    for cap in caps:
      case.first_turn_seconds(v, cap)
  first = {(v, cap): [] for v in VARIANTS for cap in caps}
  turns = {v: [] for v in VARIANTS}
  for _ in range(repeats):
    for v in VARIANTS:
      for cap in caps:
        first[v, cap].append(case.first_turn_seconds(v, cap))
      turns[v].append(case.episode(v)[0])
  per_turn = {v: [min(run[t] for run in turns[v]) for t in range(TURNS)] for v in VARIANTS}
  return dict(first={key: min(value) for key, value in first.items()}, per_turn=per_turn,
              episode={v: sum(per_turn[v]) for v in VARIANTS}, compiles=compiles,
              same_tokens={v: bool(np.array_equal(tokens[v], tokens["capacity"]))
                           for v in VARIANTS}, caps=caps)


def report(case: Case, r: dict) -> None:
  short_cap, long_cap = r["caps"]
  ms = lambda s: f"{1e3 * s:.1f}"
  print(f"\n## {case.name}, batch {case.batch}, {OBS_TOKENS} observation + {ACTION_TOKENS} action "
        f"tokens per turn, greedy")
  print(f"| variant | turn 1, {SHORT_TURNS}-turn cache ({short_cap} slots), ms | turn 1, "
        f"{LONG_TURNS}-turn cache ({long_cap}), ms | {LONG_TURNS}-turn / {SHORT_TURNS}-turn | "
        f"{TURNS}-turn episode, ms | episode speed-up vs capacity | turn {TURNS} / turn 1 | "
        f"programs the episode compiled (copies included) | same tokens as capacity |")
  print("|---|---|---|---|---|---|---|---|---|")
  base = r["episode"]["capacity"]
  for v in VARIANTS:
    short, long = r["first"][v, short_cap], r["first"][v, long_cap]
    turns = r["per_turn"][v]
    print(f"| {v} | {ms(short)} | {ms(long)} | {long / short:.2f} | {ms(r['episode'][v])} | "
          f"{base / r['episode'][v]:.2f}x | {turns[-1] / turns[0]:.2f} | {r['compiles'][v]} | "
          f"{r['same_tokens'][v]} |")
  ratio = r["first"]["growing", long_cap] / r["first"]["growing", short_cap]
  speedup = base / r["episode"]["growing"]
  print(f"growing: turn 1 {LONG_TURNS}-turn / {SHORT_TURNS}-turn cache {ratio:.2f} (goal <= 1.3: "
        f"{'met' if ratio <= 1.3 else 'missed'}); {TURNS}-turn episode {speedup:.2f}x faster than "
        f"capacity (goal >= 1.5x: {'met' if speedup >= 1.5 else 'missed'})")
  print("per-turn ms (minimum over rounds):")
  for v in VARIANTS:
    print(f"  {v}: " + " ".join(ms(s) for s in r["per_turn"][v]))


def tiny_case() -> Case:
  config = transformer.TransformerConfig(
      vocab_size=512, num_layers=2, d_model=64, num_heads=4, mlp_dim=256, position="turn_slot",
      alibi=True, max_turns=64, max_slots=64)
  return Case("tiny policy (turn/slot + ALiBi)", config, 32)


def smollm2_case(layers: int, batch: int) -> Case:
  config = transformer.TransformerConfig(
      vocab_size=49152, num_layers=layers, d_model=576, num_heads=9, num_kv_heads=3,
      mlp_dim=1536, position="rope", rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True)
  return Case(f"SmolLM2-135M shape, {layers} layers, random weights (RoPE, GQA 9/3)", config,
              batch)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5, help="rounds per figure (minimum kept)")
  parser.add_argument("--smollm-layers", type=int, default=30, help="0 skips the SmolLM2 case")
  parser.add_argument("--smollm-batch", type=int, default=8)
  parser.add_argument("--smollm-repeats", type=int, default=2)
  parser.add_argument("--skip-tiny", action="store_true")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}")
  if not args.skip_tiny:
    case = tiny_case()
    report(case, run_case(case, args.repeats))
  if args.smollm_layers:
    case = smollm2_case(args.smollm_layers, args.smollm_batch)
    report(case, run_case(case, args.smollm_repeats))


if __name__ == "__main__":
  main()
