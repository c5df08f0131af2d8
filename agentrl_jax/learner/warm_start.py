"""Behaviour cloning on noisy scripted-expert episodes before RL, the same for every method.

Demonstration seeds sit in their own range (below `EvalConfig.seed_offset`), so training never
sees a held-out task; each demonstration's action noise is keyed by its global index, so a run
on several hosts clones the same demonstrations as one host.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax.learner import assembly
from agentrl_jax.learner import batches
from agentrl_jax.learner import clone_store
from agentrl_jax.learner import step as step_lib
from agentrl_jax.learner import warm_start_progress
from agentrl_jax.parallel import multihost
from agentrl_jax.rollout import loop as loop_lib

SEED_BASE = 500_000_000


def check_noise(warm_start, make_env) -> None:
  """Refuses action noise the demonstrations cannot have.

  The noise replaces an expert action by a random valid one (`env.random_action`); an env of
  free-text actions that lists no valid ones has none to draw, so the setting would silently
  clone noise-free episodes.

  Raises:
    ValueError: `expert_noise > 0` on an env without random actions.
  """
  if not (warm_start.iterations and warm_start.expert_noise):
    return
  env = make_env()
  if not env.has_random_actions:
    raise ValueError(
        f"WarmStartConfig.expert_noise={warm_start.expert_noise} replaces expert actions by random "
        f"valid ones, and env {env.name!r} has none to draw (free-text actions, no list of valid "
        f"ones): set it to 0.0")


def check_reuse(warm_start) -> None:
  """Refuses a `reuse_dir` the clone store cannot use (`clone_store.check_directory`)."""
  if warm_start.iterations and warm_start.reuse_dir is not None:
    clone_store.check_directory(warm_start.reuse_dir)


def _clone_parts(warm_start, cloned_temperature, initial_params, first_demonstrations, allowed,
                 max_actions) -> dict:
  """What determines a clone, as the clone store and the saved progress key it."""
  return {"warm_start": dataclasses.replace(warm_start, reuse_dir=None),
          "cloned_temperature": cloned_temperature,
          "initial_weights": clone_store.digest(initial_params),
          "first_demonstrations": clone_store.digest(first_demonstrations),
          "allowed": None if allowed is None else clone_store.digest(allowed),
          "max_actions": max_actions}


def behaviour_cloning(state, graphdef, tok, rollout, warm_start, config, make_env, allowed,
                      temperature, model, writer, device_mesh=None, *, conversation=None,
                      session: warm_start_progress.Session | None = None):
  """Behaviour cloning on noisy scripted-expert episodes; returns the state with new policy params.

  `temperature` is the sampler's; `warm_start.temperature`, where set, is the one cloned. With
  `warm_start.reuse_dir` a clone saved there by a run with the same key is loaded instead
  (`clone_store`); the key covers the warm start's settings, the initial weights, the tokens of
  the first batch of demonstrations (so the env, its expert and noise, the tokenizer and the
  conversation format) and the token restriction. With a `session` the cloning resumes from the
  progress a stopped launch saved, and saves its own (`warm_start_progress`).

  Returns:
    The state with the cloned policy (and, with a KL term, the clone as its reference); None
    when `session.stop()` turned true first (the progress is saved).
  """
  cloned_temperature = temperature if warm_start.temperature is None else warm_start.temperature
  optimizer = optax.adam(warm_start.learning_rate)
  sft = step_lib.make_sft_fn(policy_graphdef=graphdef, optimizer=optimizer, allowed=allowed,
                             temperature=cloned_temperature,
                             max_actions=assembly.max_actions(rollout),
                             micro_batches=warm_start.micro_batches)
  demo_runner = loop_lib.RolloutRunner(graphdef, model, tok, rollout, conversation)
  actor = loop_lib.noisy_expert(warm_start.expert_noise)
  n = warm_start.episodes_per_iteration
  share = multihost.host_share(n)
  session = session or warm_start_progress.Session()

  def demonstrations(i):
    rows = range(share.start, share.stop)
    seeds = [SEED_BASE + i * n + j for j in rows]
    # One generator per demonstration, keyed by its global index: the same demos on any host count.
    actor_rngs = [np.random.default_rng((config.weights_seed, i, j)) for j in rows]
    traj, _ = demo_runner.collect([make_env() for _ in seeds], seeds, list(rows), actor=actor,
                                  actor_rng=actor_rngs)
    return traj

  first = demonstrations(0)
  parts = _clone_parts(warm_start, cloned_temperature, state.policy_params, first, allowed,
                       assembly.max_actions(rollout))
  key = clone_store.key_of(parts)

  def clone():
    params, opt_state = state.policy_params, optimizer.init(state.policy_params)
    start = 0
    restored = session.restore(key, (params, opt_state))
    if restored is not None:
      (params, opt_state), start = restored
      print(f"Resuming the warm start at step {start} of {warm_start.iterations}", flush=True)
    saved_at = written_at = time.monotonic()
    written_step = start
    for i in range(start, warm_start.iterations):
      if session.stop():
        session.save(key, (params, opt_state), i)
        print(f"Stopped the warm start at step {i} of {warm_start.iterations}"
              + ("; its progress is saved" if session.saves else ""), flush=True)
        return None
      traj = first if i == 0 else demonstrations(i)
      params, opt_state, m = sft(params, opt_state, batches.global_batch(traj, device_mesh))
      if (i + 1) % 10 == 0 or i + 1 == warm_start.iterations:
        now = time.monotonic()
        # Demonstrations and update together, since the last write (the first includes compiles).
        per_step = (now - written_at) / (i + 1 - written_step)
        writer.write(0, {"warm_start/nll": float(m["sft/nll"]), "warm_start/iteration": i + 1,
                         "time/warm_start_step_s": per_step})
        written_at, written_step = now, i + 1
      if (i + 1 < warm_start.iterations
          and time.monotonic() - saved_at >= session.save_every_s):
        session.save(key, (params, opt_state), i + 1)
        saved_at = time.monotonic()
    return params

  if warm_start.reuse_dir is None:
    params = clone()
  else:
    params, loaded = clone_store.reuse_or_clone(warm_start.reuse_dir, parts, state.policy_params,
                                                clone, stop=session.stop)
    if loaded:
      writer.write(0, {"warm_start/reused": 1.0})
  if params is None:
    return None
  # The KL reference is the cloned policy, in buffers of its own: the update donates the state,
  # and one buffer donated as two arguments is refused.
  return state.replace(policy_params=params,
                       ref_params=None if state.ref_params is None else jax.tree.map(jnp.copy, params))
