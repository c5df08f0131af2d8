"""Learner MFU and sampling tokens/s per model shape, for one short run on an accelerator.

For the tiny preset, SmolLM2-135M's and Qwen2.5-0.5B's shapes (random weights: nothing is
downloaded or read from disk), in the compute dtype `--dtype` and attention `--attention`:

  * learner update (GRPO + Adam, `learner_memory.build_update`) on `--batch` random rows of
    `--length` tokens: wall time (best of `--repeats` after a compiling call), analytic FLOPs
    (`models.update_flops`: 3 × forward, so remat's recomputation is not credited), and the MFU
    those give against two peaks: an [n, n] @ [n, n] matmul on compute-dtype operands summed in
    float32, measured in this process (`models.matmul_peak`), and `--nominal_tflops` (default:
    H200 bf16 dense, 989).
  * greedy sampling of our jitted turn sampler (`smollm2_sampling.our_sampler`: prefill of a
    `--prompt`-token prompt, then `--new_tokens` decode steps over a KV cache) on
    `--sample_batch` rows: sampled tokens/s.

A shape that runs out of memory (or fails otherwise, e.g. a kernel that refuses its shape) is
reported as such in its row and the run goes on. One table is printed; `--out` writes the same
as JSON.

Run from the repository root:

    python bench/accelerator.py --out accelerator.json       # on the GPU: sized for < 8 minutes
    nice -n 10 python bench/accelerator.py --quick           # 2-layer cuts, small batch: on CPU
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Each sets up host malloc as experiments/run.py does, before JAX starts its threads.
import learner_memory  # noqa: E402
import models as bench_models  # noqa: E402
import smollm2_sampling  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from agentrl_jax.models import attention  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402

SHAPES = {
    "tiny": lambda **kw: transformer.tiny(512, **kw),
    "smollm2-135m": learner_memory.smollm2_135m,
    "qwen2.5-0.5b": transformer.qwen2_5_0_5b,
}
H200_BF16_DENSE_TFLOPS = 989.0


def _failure(error: Exception) -> str:
  """'OOM' for an allocation failure, else the error's type and first line."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower():
    return "OOM"
  return f"{type(error).__name__}: {text.strip().splitlines()[0][:160] if text.strip() else ''}"


def bench_update(config, args, peak: float) -> dict:
  update, state, traj = learner_memory.build_update(
      config, args.batch, args.length, args.actions_per_turn, args.micro_batches)
  holder = {"state": state}
  del state

  def one_step():
    holder["state"], metrics = update(holder["state"], traj)  # the state is donated
    return metrics

  seconds = bench_models.best_time(one_step, args.repeats)
  flops = bench_models.update_flops(config, args.batch, args.length,
                                    learner_memory.TURNS * args.actions_per_turn)
  achieved = flops / seconds
  return {"update_ms": 1e3 * seconds, "update_tokens_per_s": args.batch * args.length / seconds,
          "update_tflop": flops / 1e12, "achieved_tflops": achieved / 1e12,
          "mfu_measured_peak": achieved / peak,
          "mfu_nominal_peak": achieved / (1e12 * args.nominal_tflops)}


def bench_sampling(config, args) -> dict:
  graphdef, params = transformer.create(config, 0)
  # Ids from 17 on, as smollm2_sampling does (no control tokens of a real vocabulary).
  prompt = np.random.default_rng(0).integers(
      17, config.vocab_size, (args.sample_batch, args.prompt)).astype(np.int32)
  run = smollm2_sampling.our_sampler(config, graphdef, params, prompt, args.new_tokens)
  seconds, _ = smollm2_sampling.best_time(run, args.repeats)
  return {"sample_ms": 1e3 * seconds,
          "sample_tokens_per_s": args.sample_batch * args.new_tokens / seconds}


def bench_shape(name: str, args, peak: float) -> dict:
  config = SHAPES[name](dtype=args.dtype, remat=args.remat, attention=args.attention)
  if args.quick:
    config = dataclasses.replace(config, num_layers=2)
  resolve = lambda t, s: attention.resolve_implementation(
      config.attention, config.compute_dtype, config.alibi, shape=(t, s, config.dim_per_head))
  row = {"shape": name + (" (2 layers)" if args.quick else ""),
         "params": transformer.num_params(config), "layers": config.num_layers,
         "attention_learner": resolve(args.length, args.length),
         "attention_decode": resolve(1, args.prompt + args.new_tokens)}
  for part, fn in (("update", lambda: bench_update(config, args, peak)),
                   ("sampling", lambda: bench_sampling(config, args))):
    start = time.perf_counter()
    try:
      row.update(fn())
    except Exception as error:  # noqa: BLE001: any failure is this shape's row, not the run's
      row[f"{part}_failed"] = _failure(error)
    row[f"{part}_wall_s"] = time.perf_counter() - start  # compilation included
    gc.collect()
    jax.clear_caches()
  return row


def _cell(row: dict, key: str, fmt: str, part: str) -> str:
  if f"{part}_failed" in row:
    return "OOM" if row[f"{part}_failed"] == "OOM" else "error"
  return format(row[key], fmt)


def print_table(result: dict) -> None:
  a = result["anchors"]
  print(f"\n{result['device']}; jax {result['jax']}; dtype {result['dtype']}, remat "
        f"{result['remat']}, attention {result['attention']}")
  print(f"learner: batch {result['batch']} x {result['length']} tokens, "
        f"{result['action_tokens_per_row']} action tokens per row, micro-batches "
        f"{result['micro_batches']}; sampling: batch {result['sample_batch']}, prompt "
        f"{result['prompt']}, {result['new_tokens']} new tokens (greedy); best of "
        f"{result['repeats']}")
  print(f"anchors: measured matmul peak {a['measured_peak_tflops']:.2f} TFLOP/s ({result['dtype']} "
        f"{a['peak_n']}^3); nominal peak {a['nominal_tflops']:.0f} TFLOP/s")
  header = (f"{'shape':<24}{'params':>13}{'attn (learn/decode)':>21}{'update ms':>11}"
            f"{'TFLOP/s':>9}{'MFU meas':>10}{'MFU nom':>9}{'sample tok/s':>14}")
  print(header)
  print("-" * len(header))
  for row in result["rows"]:
    attn = f"{row['attention_learner']}/{row['attention_decode']}"
    print(f"{row['shape']:<24}{row['params']:>13,}{attn:>21}"
          f"{_cell(row, 'update_ms', '.1f', 'update'):>11}"
          f"{_cell(row, 'achieved_tflops', '.3f', 'update'):>9}"
          f"{_cell(row, 'mfu_measured_peak', '.1%', 'update'):>10}"
          f"{_cell(row, 'mfu_nominal_peak', '.2%', 'update'):>9}"
          f"{_cell(row, 'sample_tokens_per_s', ',.0f', 'sampling'):>14}")
  for row in result["rows"]:
    for part in ("update", "sampling"):
      if f"{part}_failed" in row:
        print(f"  {row['shape']} {part}: {row[f'{part}_failed']}")
  print(f"total wall time {result['wall_s']:.0f} s (compilation included)")


def main():
  on_cpu = jax.default_backend() == "cpu"
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dtype", default="float32" if on_cpu else "bfloat16",
                      choices=("bfloat16", "float32"))
  parser.add_argument("--remat", default="layer", choices=transformer.REMAT_MODES)
  parser.add_argument("--attention", default="auto", choices=attention.IMPLEMENTATIONS)
  parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of " +
                      ", ".join(SHAPES))
  parser.add_argument("--batch", type=int, default=16, help="learner rows")
  parser.add_argument("--length", type=int, default=1024, help="learner tokens per row")
  parser.add_argument("--actions_per_turn", type=int, default=48, help="of 4 turns per row")
  parser.add_argument("--micro_batches", type=int, default=1)
  parser.add_argument("--sample_batch", type=int, default=64)
  parser.add_argument("--prompt", type=int, default=smollm2_sampling.PROMPT)
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--peak_n", type=int, default=1024 if on_cpu else 8192)
  parser.add_argument("--nominal_tflops", type=float, default=H200_BF16_DENSE_TFLOPS,
                      help="nominal dense peak of the device in the compute dtype")
  parser.add_argument("--quick", action="store_true",
                      help="2-layer cuts of each shape, small batches: checks the script on CPU")
  parser.add_argument("--out", default=None, help="write the results as JSON here")
  args = parser.parse_args()
  if args.quick:
    args.batch, args.length, args.actions_per_turn = 4, 64, 4
    args.sample_batch, args.prompt, args.new_tokens = 4, 16, 8
    args.repeats, args.peak_n = 2, 512
  shapes = args.shapes.split(",")
  unknown = [s for s in shapes if s not in SHAPES]
  if unknown:
    parser.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")

  start = time.perf_counter()
  device = jax.devices()[0]
  peak = bench_models.matmul_peak(args.peak_n, args.repeats, jnp.dtype(args.dtype))
  result = {
      "device": f"{device.platform} ({device.device_kind}), {jax.device_count()} device(s)",
      "jax": jax.__version__, "dtype": args.dtype, "remat": args.remat,
      "attention": args.attention, "batch": args.batch, "length": args.length,
      "action_tokens_per_row": learner_memory.TURNS * args.actions_per_turn,
      "micro_batches": args.micro_batches, "sample_batch": args.sample_batch,
      "prompt": args.prompt, "new_tokens": args.new_tokens, "repeats": args.repeats,
      "quick": args.quick,
      "anchors": {"measured_peak_tflops": peak / 1e12, "peak_n": args.peak_n,
                  "nominal_tflops": args.nominal_tflops},
      "rows": []}
  for name in shapes:
    row = bench_shape(name, args, peak)
    result["rows"].append(row)
    print(f"[{time.perf_counter() - start:4.0f} s] {name}: update {row['update_wall_s']:.0f} s, "
          f"sampling {row['sampling_wall_s']:.0f} s (compilation included)", flush=True)
  result["wall_s"] = time.perf_counter() - start
  print_table(result)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
