"""Held-out evaluation played in batches (`EvalConfig.batch_size`) gives the figures of one batch."""

import dataclasses
import functools

import jax
import pytest

from agentrl_jax import config_errors
from agentrl_jax.envs import registry
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import evaluate
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def _tiny_frozenlake_policy():
  """(tokenizer, model, graphdef, params, rollout sampling the four moves at temperature 1)."""
  tok = tokenizer_lib.load_tokenizer()
  model = transformer.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=64)
  graphdef, params = transformer.create(model, seed=0)
  sampling = sampler_lib.SamplingConfig(
      temperature=1.0, max_action_tokens=1,
      allowed_token_ids=tuple(tok.single_token_id(w) for w in ("left", "down", "right", "up")))
  return tok, model, graphdef, params, loop_lib.RolloutConfig(max_turns=6, max_len=192,
                                                              sampling=sampling)


def _greedy(rollout):
  return dataclasses.replace(rollout, sampling=dataclasses.replace(rollout.sampling,
                                                                   temperature=0.0))


def test_batched_evaluation_equals_one_batch():
  tok, model, graphdef, params, rollout = _tiny_frozenlake_policy()
  runners = dict(greedy=loop_lib.RolloutRunner(graphdef, model, tok, _greedy(rollout)),
                 sampled=loop_lib.RolloutRunner(graphdef, model, tok, rollout))
  make_env = lambda: registry.make("frozenlake", size=3, max_turns=6)
  whole = configs.EvalConfig(num_tasks=7, pass_k=2, pass_k_tasks=3)
  want = evaluate.evaluate(params, make_env=make_env, config=whole, rng=jax.random.key(1), **runners)
  got = evaluate.evaluate(params, make_env=make_env, config=dataclasses.replace(whole, batch_size=3),
                          rng=jax.random.key(1), **runners)
  assert got == want
  assert want["eval/mean_turns"] > 0 and "eval/pass@2" in want


def test_batch_size_below_one_is_refused():
  with pytest.raises(config_errors.ConfigError, match="batch_size must be >= 1"):
    configs.EvalConfig(batch_size=0)


def test_a_methods_evaluation_plays_the_eval_env_kwargs():
  # Every training loop evaluates through `assembly.Run.evaluate` (the offline ones too): held-out
  # games come from `EvalConfig.env_kwargs` over the training env's arguments.
  tok, model, graphdef, params, rollout = _tiny_frozenlake_policy()
  rollout = _greedy(rollout)
  runner = loop_lib.RolloutRunner(graphdef, model, tok, rollout)
  train_env = functools.partial(registry.make, "frozenlake", size=3, max_turns=6)
  run = assembly.Run(tokenizer=tok, make_env=train_env, model=model, rollout=rollout,
                     graphdef=graphdef, allowed=None, temperature=1.0, max_actions=1,
                     runner=runner, greedy_runner=runner)
  config = configs.EvalConfig(num_tasks=6, pass_k=0, env_kwargs={"max_turns": 4})
  got = run.evaluate(params, config, jax.random.key(1))
  want = evaluate.evaluate(params, greedy=runner, sampled=runner, config=config,
                           make_env=functools.partial(train_env, max_turns=4), rng=jax.random.key(1))
  assert got == want
  assert got != run.evaluate(params, configs.EvalConfig(num_tasks=6, pass_k=0), jax.random.key(1))
