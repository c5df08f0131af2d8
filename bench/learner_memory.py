"""Peak host memory and seconds of one learner update of SmolLM2-135M's shape (random weights).

The model: 30 layers, width 576, 9 query / 3 key-value heads, MLP 1536, vocabulary 49,152, tied
embeddings (134.5M parameters). The batch: `--batch` rows of `--length` tokens in 4 turns, the
last `--actions_per_turn` tokens of each turn sampled by the policy. One GRPO update with Adam
(`learner.step.make_update_fn`), timed after a first call that compiles it; the peak is the
process's resident high-water mark (`ru_maxrss`), which includes compilation and the weights.

Run from the repository root, one configuration per process (the peak is per process):

    python bench/learner_memory.py                                # remat='layer', micro_batches=4
    python bench/learner_memory.py --remat none --micro_batches 1 --batch 4   # the old path
    python bench/learner_memory.py --dtype bfloat16
    python bench/learner_memory.py --micro_batches 1 --head_chunk 32    # the LM head in chunks
    python bench/learner_memory.py --first_moment_dtype bfloat16        # Adam's mu in bf16
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from agentrl_jax.parallel import host_memory  # noqa: E402

# As experiments/run.py does, before JAX starts its threads.
host_memory.keep_freed_memory()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from agentrl_jax import types  # noqa: E402
from agentrl_jax.advantages import estimators  # noqa: E402
from agentrl_jax.learner import assembly  # noqa: E402
from agentrl_jax.learner import configs  # noqa: E402
from agentrl_jax.learner import step as step_lib  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402

TURNS = 4


def smollm2_135m(**overrides) -> transformer.TransformerConfig:
  """SmolLM2-135M's architecture (its config.json), random weights."""
  return transformer.TransformerConfig(
      vocab_size=49152, num_layers=30, d_model=576, num_heads=9, num_kv_heads=3, mlp_dim=1536,
      position="rope", rope_theta=100000.0, tie_embeddings=True, norm_eps=1e-5, **overrides)


def random_batch(batch: int, length: int, vocab: int, actions_per_turn: int) -> types.Trajectories:
  rng = np.random.default_rng(0)
  per_turn = length // TURNS
  traj = types.empty_trajectories(batch, length, TURNS)
  turn_of_token = np.repeat(np.arange(TURNS), per_turn).astype(np.int32)
  act = np.zeros(length, bool)
  for k in range(TURNS):
    act[(k + 1) * per_turn - actions_per_turn:(k + 1) * per_turn] = True
  return traj.replace(
      tokens=rng.integers(0, vocab, (batch, length)).astype(np.int32),
      action_mask=np.broadcast_to(act, (batch, length)).copy(),
      turn_of_token=np.broadcast_to(turn_of_token, (batch, length)).copy(),
      turn_mask=np.ones((batch, TURNS), bool),
      group_id=(np.arange(batch) // 4).astype(np.int32),
      outcome=rng.normal(size=batch).astype(np.float32))


def build_update(config: transformer.TransformerConfig, batch: int, length: int,
                 actions_per_turn: int, micro_batches: int, learning_rate: float = 1e-5,
                 head_chunk: int | None = None, first_moment_dtype: str = "float32"):
  """(update, state, trajectories) of one GRPO + Adam learner update on a random batch.

  `update(state, trajectories)` returns (state, metrics) and donates the state.
  """
  graphdef, params = transformer.create(config, 0)
  # The learner's own optimizer (clipping + AdamW), as the runs build it.
  optimizer = assembly.make_optimizer(
      configs.OptimConfig(learning_rate=learning_rate, first_moment_dtype=first_moment_dtype), 1)
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optimizer,
      critic_optimizer=None,
      advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=batch // 4),
      loss=step_lib.LossConfig(micro_batches=micro_batches, head_chunk=head_chunk), allowed=None,
      max_actions=TURNS * actions_per_turn)
  traj = jax.tree.map(jnp.asarray, random_batch(batch, length, config.vocab_size,
                                                actions_per_turn))
  state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                 rng=jax.random.key_data(jax.random.key(0)),
                                 policy_params=params, policy_opt_state=optimizer.init(params))
  return update, state, traj


def peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=768)
  parser.add_argument("--actions_per_turn", type=int, default=48)
  parser.add_argument("--remat", default="layer", choices=transformer.REMAT_MODES)
  parser.add_argument("--micro_batches", type=int, default=4)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--head_chunk", type=int, default=None,
                      help="LossConfig.head_chunk: action positions per LM-head chunk")
  parser.add_argument("--first_moment_dtype", default="float32", choices=("float32", "bfloat16"),
                      help="OptimConfig.first_moment_dtype: Adam's first moment in bf16")
  parser.add_argument("--repeats", type=int, default=1, help="timed updates after the first")
  args = parser.parse_args()
  config = smollm2_135m(remat=args.remat, dtype=args.dtype)
  device = jax.devices()[0]
  print(f"jax {jax.__version__} on {device.platform}, {os.cpu_count()} CPU cores; "
        f"{transformer.num_params(config):,} params; batch {args.batch} x {args.length} tokens, "
        f"{TURNS * args.actions_per_turn} action tokens per row; remat={args.remat} "
        f"micro_batches={args.micro_batches} dtype={args.dtype} head_chunk={args.head_chunk} "
        f"first_moment_dtype={args.first_moment_dtype}", flush=True)
  update, state, traj = build_update(config, args.batch, args.length, args.actions_per_turn,
                                     args.micro_batches, head_chunk=args.head_chunk,
                                     first_moment_dtype=args.first_moment_dtype)
  start = time.perf_counter()
  state, metrics = update(state, traj)  # the state is donated
  jax.block_until_ready(metrics)
  first = time.perf_counter() - start
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    state, metrics = update(state, traj)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  loss = float(metrics["loss/policy"])
  print(f"  first update (compiles) {first:8.1f} s")
  print(f"  update                  {min(times):8.1f} s  ({args.batch * args.length / min(times):,.0f} "
        f"tokens/s)")
  print(f"  peak RSS                {peak_rss_gb():8.2f} GB  (memory/peak_rss_gb)")
  print(f"  loss/policy             {loss:8.4f}  finite: {np.isfinite(loss)}")


if __name__ == "__main__":
  main()
