"""Pieces the offline, batch-online and distillation entries share.

Each entry (`drift.train`, `iterative_grpo.train`, `ahead.train`) resolves the same configs the
online learner takes, builds the same policy and rollout runners, warm-starts and evaluates the
same way; only its update differs. Those shared steps live here as small functions.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.envs import base as envs_base
from agentrl_jax.envs import registry
from agentrl_jax.learner import configs
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import learner as learner_lib
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

# Kept apart from the online learner's warm-start seeds and below EvalConfig.seed_offset.
WARM_START_SEED_BASE = 600_000_000


@dataclasses.dataclass(frozen=True)
class Setup:
  """A resolved run: tokenizer, env factory, policy structure and the rollout runners."""

  tokenizer: tokenizer_lib.Tokenizer
  make_env: Callable[[], envs_base.TextEnv]
  model: transformer.TransformerConfig
  rollout: loop_lib.RolloutConfig
  graphdef: Any
  allowed: jax.Array | None
  temperature: float
  runner: loop_lib.RolloutRunner
  greedy_runner: loop_lib.RolloutRunner

  @property
  def max_actions(self) -> int:
    return self.rollout.max_turns * self.rollout.sampling.max_action_tokens


def resolve(config: configs.TrainConfig, model: transformer.TransformerConfig | None,
            rollout: loop_lib.RolloutConfig, tokenizer_path: str | None,
            make_env: Callable[[], envs_base.TextEnv] | None = None) -> tuple[Setup, Any]:
  """Checks the configs against the env and tokenizer and builds the policy; returns (setup, params).

  Raises:
    config_errors.ConfigError: a config conflicts with the env, the tokenizer or another config.
  """
  try:
    tok = tokenizer_lib.load_tokenizer(tokenizer_path)
    make_env = make_env or functools.partial(registry.make, config.env_name, **config.env_kwargs)
    probe = make_env()
    if probe.max_turns > rollout.max_turns:
      raise ValueError(f"env {config.env_name!r} runs up to {probe.max_turns} turns but "
                       f"RolloutConfig.max_turns={rollout.max_turns}")
    model = dataclasses.replace(model or transformer.tiny(tok.vocab_size), vocab_size=tok.vocab_size)
    if config.restrict_to_action_words:
      if not probe.action_words:
        raise ValueError(f"TrainConfig.restrict_to_action_words: env {config.env_name!r} has no "
                         "finite action set")
      ids = tuple(tok.single_token_id(word) for word in probe.action_words)
      rollout = dataclasses.replace(rollout, sampling=dataclasses.replace(
          rollout.sampling, allowed_token_ids=ids, max_action_tokens=1))
    if model.position == "turn_slot" and model.max_turns < rollout.max_turns:
      raise ValueError(f"TransformerConfig.max_turns={model.max_turns} is below "
                       f"RolloutConfig.max_turns={rollout.max_turns}")
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise config_errors.ConfigError(f"{type(e).__name__}: {e}") from e
  graphdef, params = transformer.create(model, config.seed)
  greedy = dataclasses.replace(rollout, sampling=dataclasses.replace(rollout.sampling, temperature=0.0))
  setup = Setup(
      tokenizer=tok, make_env=make_env, model=model, rollout=rollout, graphdef=graphdef,
      allowed=sampler_lib.vocabulary_mask(model.vocab_size, rollout.sampling.allowed_token_ids),
      temperature=rollout.sampling.temperature or 1.0,
      runner=loop_lib.RolloutRunner(graphdef, model, tok, rollout),
      greedy_runner=loop_lib.RolloutRunner(graphdef, model, tok, greedy))
  return setup, params


class Start(NamedTuple):
  """What every entry has before its first update."""

  setup: Setup
  params: Any
  writer: metrics_lib.MetricsWriter
  base_key: jax.Array
  before: dict[str, float]


def start(workdir: str, config: configs.TrainConfig, model: transformer.TransformerConfig | None,
          rollout: loop_lib.RolloutConfig, warm: configs.WarmStartConfig,
          evaluation: configs.EvalConfig, tokenizer_path: str | None) -> Start:
  """Resolves the run, opens its metrics, warm-starts and records held-out success before RL."""
  setup, params = resolve(config, model, rollout, tokenizer_path)
  files.makedirs(workdir)
  writer = metrics_lib.MetricsWriter(workdir, process_index=jax.process_index())
  base_key = jax.random.key(config.seed)
  params = warm_start(setup, params, warm, config.seed)
  before = evaluate(setup, params, evaluation, jax.random.fold_in(base_key, 0))
  writer.write(0, {f"{k}_before": v for k, v in before.items()})
  return Start(setup, params, writer, base_key, before)


def task_batch(config: configs.TrainConfig, iteration: int, first_seed: int = 0
               ) -> tuple[list[int], list[int]]:
  """Seeds and group ids of one batch: `tasks_per_iteration` tasks, each `group_size` times."""
  first = first_seed + iteration * config.tasks_per_iteration
  seeds = [first + t for t in range(config.tasks_per_iteration) for _ in range(config.group_size)]
  groups = [t for t in range(config.tasks_per_iteration) for _ in range(config.group_size)]
  return seeds, groups


def collect(setup: Setup, params, seeds: Sequence[int], groups: Sequence[int], rng: jax.Array,
            make_env: Callable[[], envs_base.TextEnv] | None = None):
  """Plays one episode per seed with the policy; returns (host Trajectories, envs, stats)."""
  envs = [(make_env or setup.make_env)() for _ in seeds]
  traj, stats = setup.runner.collect(envs, seeds, groups, params=params, rng=rng)
  return traj, envs, stats


def to_device(traj: types.Trajectories) -> types.Trajectories:
  return jax.tree.map(jnp.asarray, traj)


def evaluate(setup: Setup, params, evaluation: configs.EvalConfig, rng: jax.Array) -> dict[str, float]:
  return evaluate_lib.evaluate(params, greedy=setup.greedy_runner, sampled=setup.runner,
                               make_env=setup.make_env, config=evaluation, rng=rng)


def warm_start(setup: Setup, params, warm: configs.WarmStartConfig, seed: int):
  """Behaviour cloning on noisy scripted-expert episodes (as the online learner's warm start)."""
  if not warm.iterations:
    return params
  optimizer = optax.adam(warm.learning_rate)
  sft = step_lib.make_sft_fn(policy_graphdef=setup.graphdef, optimizer=optimizer,
                             allowed=setup.allowed, temperature=setup.temperature,
                             max_actions=setup.max_actions)
  actor = loop_lib.noisy_expert(warm.expert_noise)
  actor_rng = np.random.default_rng(seed)
  opt_state = optimizer.init(params)
  n = warm.episodes_per_iteration
  for i in range(warm.iterations):
    seeds = [WARM_START_SEED_BASE + i * n + j for j in range(n)]
    traj, _ = setup.runner.collect([setup.make_env() for _ in seeds], seeds, list(range(n)),
                                   actor=actor, actor_rng=actor_rng)
    params, opt_state, _ = sft(params, opt_state, to_device(traj))
  return params


def make_optimizer(optim: configs.OptimConfig, total_steps: int) -> optax.GradientTransformation:
  """The online learner's optimizer (AdamW, clipping, warmup and linear decay over `total_steps`)."""
  return learner_lib.make_optimizer(optim, total_steps)


@dataclasses.dataclass
class Summary:
  """What an offline or batch-online run reports at its end."""

  method: str
  iterations: int
  success_before: float
  success_after: float
  final_metrics: dict[str, float]


def print_summary(summary: Summary, evaluation: configs.EvalConfig) -> None:
  print(f"Done: {summary.method}, {summary.iterations} iterations\n"
        f"  held-out greedy success before: {summary.success_before:.3f}\n"
        f"  after: {summary.success_after:.3f}  ({evaluation.num_tasks} held-out tasks)", flush=True)


def finish(method: str, setup: Setup, params, metrics: dict[str, float], before: dict[str, float],
           iterations: int, evaluation: configs.EvalConfig, base_key: jax.Array,
           writer) -> Summary:
  """Evaluates once more if the last iteration did not, closes the writer, prints the summary."""
  if "eval/greedy_success" not in metrics:
    metrics.update(evaluate(setup, params, evaluation, jax.random.fold_in(base_key, iterations)))
  writer.close()
  summary = Summary(method=method, iterations=iterations,
                    success_before=before["eval/greedy_success"],
                    success_after=metrics["eval/greedy_success"], final_metrics=metrics)
  print_summary(summary, evaluation)
  return summary
