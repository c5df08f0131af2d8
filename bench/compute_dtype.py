"""The learner update in bfloat16 against float32, interleaved in one process.

SmolLM2-135M's shape (random weights), the full GRPO + Adam update of `learner_memory`
(`--batch` rows of `--length` tokens, per-layer remat unless told), compiled once per compute
dtype and then timed in turns, so both see the same load. Prints each update's best time, the
ratio float32 ÷ bfloat16, and the anchor beside it: the same ratio for an [n, n] @ [n, n]
matmul (float32 operands against bfloat16 operands summed in float32), the most the update
could gain if it were all matmul.

Run from the repository root:

    python bench/compute_dtype.py                 # 30 layers, 4 x 768 tokens
    python bench/compute_dtype.py --layers 4      # a 4-layer cut: minutes, not a quarter hour
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import learner_memory  # noqa: E402  (sets up host malloc before JAX starts its threads)
import models as bench_models  # noqa: E402

import jax  # noqa: E402

import jax.numpy as jnp  # noqa: E402

DTYPES = ("float32", "bfloat16")


def build(dtype: str, args):
  config = learner_memory.smollm2_135m(dtype=dtype, remat=args.remat)
  if args.layers:
    config = dataclasses.replace(config, num_layers=args.layers)
  update, state, traj = learner_memory.build_update(
      config, args.batch, args.length, args.actions_per_turn, args.micro_batches)
  holder = {"state": state}

  def step():
    holder["state"], metrics = update(holder["state"], traj)  # the state is donated
    return metrics

  step()  # compiles
  return step


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--layers", type=int, default=0, help="0: all 30")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--length", type=int, default=768)
  parser.add_argument("--actions_per_turn", type=int, default=48)
  parser.add_argument("--micro_batches", type=int, default=1)
  parser.add_argument("--remat", default="layer", choices=("none", "layer", "layer_dots"))
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--peak_n", type=int, default=2048)
  args = parser.parse_args(argv)

  steps = {dtype: build(dtype, args) for dtype in DTYPES}
  best = {dtype: float("inf") for dtype in DTYPES}
  for _ in range(args.repeats):
    for dtype, step in steps.items():
      start = time.perf_counter()
      jax.block_until_ready(step())
      best[dtype] = min(best[dtype], time.perf_counter() - start)
  peaks = {dtype: bench_models.matmul_peak(args.peak_n, args.repeats, jnp.dtype(dtype))
           for dtype in DTYPES}
  layers = args.layers or 30
  print(f"SmolLM2-135M shape, {layers} layers, update of {args.batch} x {args.length} tokens, "
        f"remat {args.remat}; best of {args.repeats}, interleaved")
  for dtype in DTYPES:
    print(f"  {dtype:9s} update {best[dtype]:8.2f} s   matmul {peaks[dtype] / 1e9:6.0f} GFLOP/s")
  print(f"float32 / bfloat16: update {best['float32'] / best['bfloat16']:.2f}x, "
        f"matmul anchor {peaks['bfloat16'] / peaks['float32']:.2f}x")


if __name__ == "__main__":
  main()
