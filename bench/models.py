"""Model benchmarks, reported against anchors measured in the same run.

1. Greedy generation on one tiny random Qwen2 checkpoint (written by
   experiments/make_tiny_hf_checkpoint.py: 2 layers, width 64, vocabulary 512), batch 32:
   our jitted turn sampler (prefill + `lax.scan` decode over a KV cache) against HF
   `generate(do_sample=False)` on torch CPU. The tokens must be identical; the figure is the
   tokens/s ratio (target ≥ 3×).
2. One learner update (`learner.step.make_update_fn`, GRPO, Adam) of the `small` preset on a batch
   of random trajectories: achieved FLOP/s (analytic FLOPs of the step ÷ its wall time) against the
   machine's matmul peak, measured here as the best float32 [n, n] @ [n, n] rate.

Run from the repository root (needs the hf extra for part 1):

    python bench/models.py            # batch 32, 64 new tokens; small preset, 16 x 256 tokens
    python bench/models.py --quick    # smaller, a few seconds after compilation
    python bench/models.py --skip_generation --batch 32 --length 512 [--default_malloc]
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrl_jax.parallel import host_memory  # noqa: E402

# As experiments/run.py does, before JAX starts its threads (so it is read from argv directly).
kept = "--default_malloc" not in sys.argv and host_memory.keep_freed_memory()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))

from agentrl_jax import types  # noqa: E402
from agentrl_jax.advantages import estimators  # noqa: E402
from agentrl_jax.learner import step as step_lib  # noqa: E402
from agentrl_jax.models import hf  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402
import make_tiny_hf_checkpoint  # noqa: E402


def _block(x):
  return jax.tree.map(lambda a: a.block_until_ready() if isinstance(a, jax.Array) else a, x)


def best_time(fn, repeats: int) -> float:
  """Best wall time of `repeats` calls after one warm-up call (compilation excluded)."""
  _block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - start)
  return min(times)


def bench_generation(batch: int, prompt_len: int, new_tokens: int, repeats: int) -> None:
  import torch
  import transformers

  with tempfile.TemporaryDirectory() as path:
    make_tiny_hf_checkpoint.write(path, "qwen2")
    config, graphdef, params = hf.load(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  prompt = np.random.default_rng(0).integers(4, config.vocab_size, (batch, prompt_len)).astype(np.int32)

  sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=new_tokens)
  turn = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  obs, obs_len = jnp.asarray(prompt), jnp.full((batch,), prompt_len, jnp.int32)
  active, key = jnp.ones((batch,), bool), jax.random.key(0)

  def ours():
    cache = transformer.init_cache(config, batch, prompt_len + new_tokens)
    return turn(params, cache, obs, obs_len, active, jnp.int32(0), key).tokens

  torch_prompt = torch.tensor(prompt, dtype=torch.long)

  def reference():
    with torch.no_grad():
      return model.generate(torch_prompt, do_sample=False, max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens)[:, prompt_len:].numpy()

  same = np.array_equal(np.asarray(ours()), reference())
  t_ours, t_ref = best_time(ours, repeats), best_time(reference, repeats)
  n = batch * new_tokens
  print(f"\nGreedy generation, tiny Qwen2 ({transformer.num_params(config):,} params), batch {batch}, "
        f"prompt {prompt_len}, {new_tokens} new tokens; torch threads {torch.get_num_threads()}")
  print(f"  identical tokens: {same}")
  print(f"  ours (jit sampler)   {n / t_ours:>12,.0f} tokens/s  ({1e3 * t_ours:.1f} ms)")
  print(f"  HF generate (torch)  {n / t_ref:>12,.0f} tokens/s  ({1e3 * t_ref:.1f} ms)")
  print(f"  ratio ours / HF      {t_ref / t_ours:>12.2f}x  (target >= 3x)")


def matmul_peak(n: int, repeats: int, dtype=jnp.float32) -> float:
  """Best FLOP/s of an [n, n] @ [n, n] matmul with `dtype` operands (float32 unless told),
  summed in float32 as the model's matmuls are (XLA:CPU runs bfloat16 operands with a
  bfloat16 result on a path about 4x slower than with a float32 one)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  mm = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  return 2 * n ** 3 / best_time(lambda: mm(a, b), repeats)


def block_matmul_params(config: transformer.TransformerConfig) -> int:
  """Weights of the decoder layers' matmuls (attention projections and the gated MLP), all layers."""
  c = config
  q, kv = c.num_heads * c.dim_per_head, c.kv_heads * c.dim_per_head
  return c.num_layers * (c.d_model * (q + 2 * kv) + q * c.d_model + 3 * c.d_model * c.hidden_dim)


def update_flops(config: transformer.TransformerConfig, batch: int, length: int, actions: int) -> float:
  """Analytic FLOPs of one update: 3 × forward (backward = 2 × forward).

  Forward per token: 2 × (matmul parameters of the blocks) + attention scores and mixing over the
  full L × L grid the implementation computes (4 · L · H · Dh per layer); the LM head only at the
  `actions` action positions per row (2 · D · V each).
  """
  c = config
  q = c.num_heads * c.dim_per_head
  per_token = 2 * block_matmul_params(c) + c.num_layers * 4 * length * q
  forward = batch * length * per_token + batch * actions * 2 * c.d_model * c.vocab_size
  return 3.0 * forward


def _random_batch(batch: int, length: int, vocab: int, actions_per_turn: int) -> types.Trajectories:
  """Rows of 4 turns: an observation then `actions_per_turn` action tokens per turn."""
  rng = np.random.default_rng(0)
  turns = 4
  per_turn = length // turns
  traj = types.empty_trajectories(batch, length, turns)
  turn_of_token = np.repeat(np.arange(turns), per_turn).astype(np.int32)
  act = np.zeros(length, bool)
  for k in range(turns):
    act[(k + 1) * per_turn - actions_per_turn:(k + 1) * per_turn] = True
  return traj.replace(
      tokens=rng.integers(0, vocab, (batch, length)).astype(np.int32),
      action_mask=np.broadcast_to(act, (batch, length)).copy(),
      turn_of_token=np.broadcast_to(turn_of_token, (batch, length)).copy(),
      turn_mask=np.ones((batch, turns), bool),
      group_id=(np.arange(batch) // 4).astype(np.int32),
      outcome=rng.normal(size=batch).astype(np.float32))


def _minor_faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def bench_update(batch: int, length: int, repeats: int, peak_n: int) -> None:
  config = transformer.small(512)
  graphdef, params = transformer.create(config, 0)
  optimizer = optax.adam(1e-4)
  actions_per_turn = 8
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optimizer,
      critic_optimizer=None,
      advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=batch // 4),
      loss=step_lib.LossConfig(), allowed=None, max_actions=4 * actions_per_turn)
  traj = jax.tree.map(jnp.asarray, _random_batch(batch, length, config.vocab_size, actions_per_turn))
  state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                 rng=jax.random.key_data(jax.random.key(0)),
                                 policy_params=params, policy_opt_state=optimizer.init(params))
  holder = {"state": state}

  def one_step():
    holder["state"], metrics = update(holder["state"], traj)  # the state is donated
    return metrics

  t = best_time(one_step, repeats)
  faults = _minor_faults()
  _block(one_step())
  faults = _minor_faults() - faults
  flops = update_flops(config, batch, length, 4 * actions_per_turn)
  peak = matmul_peak(peak_n, repeats)
  print(f"\nLearner update, small preset ({transformer.num_params(config):,} params), batch "
        f"{batch} x {length} tokens, {4 * actions_per_turn} action tokens per row")
  print(f"  step time            {1e3 * t:>12.1f} ms  ({batch * length / t:,.0f} tokens/s)")
  print(f"  achieved             {flops / t / 1e9:>12.2f} GFLOP/s  ({flops / 1e9:.2f} GFLOP per step)")
  print(f"  matmul peak          {peak / 1e9:>12.2f} GFLOP/s  (float32 {peak_n}^3)")
  print(f"  achieved / peak      {flops / t / peak:>12.1%}")
  print(f"  host page faults     {faults:>12,d} per step  (keep_freed_memory: {kept})")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small shapes")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--skip_generation", action="store_true", help="no torch/transformers needed")
  parser.add_argument("--skip_update", action="store_true", help="generation only")
  parser.add_argument("--default_malloc", action="store_true",
                      help="leave glibc malloc as it is (shows what keep_freed_memory saves)")
  parser.add_argument("--batch", type=int, default=16, help="learner update: rows")
  parser.add_argument("--length", type=int, default=256, help="learner update: tokens per row")
  args = parser.parse_args()
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), "
        f"{jax.device_count()} device(s), {os.cpu_count()} CPU cores")
  if not args.skip_generation:
    bench_generation(batch=32, prompt_len=16, new_tokens=16 if args.quick else 64,
                     repeats=args.repeats)
  if args.skip_update:
    return
  if args.quick:
    bench_update(batch=8, length=128, repeats=args.repeats, peak_n=512)
  else:
    bench_update(batch=args.batch, length=args.length, repeats=args.repeats, peak_n=1024)


if __name__ == "__main__":
  main()
