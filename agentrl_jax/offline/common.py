"""What the offline, batch-online and distillation methods share, on top of the run seam.

Each method (`drift.train`, `iterative_grpo.train`, `ahead.train`, `rtpo.train`) assembles its
run with `learner.assembly` and runs its iterations in `learner.driver`, like the online learner;
only its state and its iteration differ. `drive` is the call they share.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.envs import registry
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import warm_start as warm_start_lib
from agentrl_jax.models import transformer
from agentrl_jax.parallel import multihost
from agentrl_jax.rollout import loop as loop_lib

Setup = assembly.Run


def resolve(config: configs.TrainConfig, model: transformer.TransformerConfig | None,
            rollout: loop_lib.RolloutConfig, tokenizer_path: str | None,
            loss=None) -> tuple[assembly.Run, Any]:
  """Checks the configs and builds the policy; returns (run, initial policy params).

  Raises:
    config_errors.ConfigError: a config conflicts with the env, the tokenizer or another config.
  """
  try:
    resolved = assembly.resolve(config, model, rollout, loss, tokenizer_path)
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise config_errors.ConfigError(f"{type(e).__name__}: {e}") from e
  graphdef, params = transformer.create(resolved.model, config.weights_seed)
  return assembly.build_run(resolved, graphdef), params


def collect(setup: assembly.Run, params, seeds: Sequence[int], groups: Sequence[int],
            rng: jax.Array, make_env: Callable[[], Any] | None = None):
  """Plays one episode per seed with the policy; returns (host Trajectories, envs, stats)."""
  envs = [(make_env or setup.make_env)() for _ in seeds]
  traj, stats = setup.runner.collect(envs, seeds, groups, params=params, rng=rng)
  registry.check_env_faults(envs[0].name if envs else "", stats.turns, stats.faults)
  return traj, envs, stats


def to_device(traj: types.Trajectories) -> types.Trajectories:
  return jax.tree.map(jnp.asarray, traj)


def drive(workdir: str, method: driver.Method, state: types.ActorCriticState, *,
          setup: assembly.Run, config: configs.TrainConfig, warm: configs.WarmStartConfig,
          evaluation: configs.EvalConfig, prepare: Callable[[Any], Any] | None = None,
          stateful: Sequence[driver.Stateful] = (),
          hooks: Sequence[hooks_lib.Hook] = ()) -> driver.Outcome:
  """Runs `method` in the driver with the evaluation, warm start and hooks every method shares."""
  demo_env = assembly.env_with(setup.make_env, warm.env_kwargs)
  try:
    warm_start_lib.check_noise(warm, demo_env)
    warm_start_lib.check_reuse(warm)
  except ValueError as e:
    raise config_errors.ConfigError(f"ValueError: {e}") from e
  files.makedirs(workdir)
  writer = metrics_lib.MetricsWriter(workdir, process_index=jax.process_index())
  eval_key = driver.evaluation_key(jax.random.key(config.seed))

  def evaluate(params, tag: int) -> dict[str, float]:
    return setup.evaluate(multihost.local_replica(params), evaluation,
                          jax.random.fold_in(eval_key, tag))

  def warm_start(state, session=None):
    return warm_start_lib.behaviour_cloning(
        state, setup.graphdef, setup.tokenizer, setup.rollout, warm, config, demo_env,
        setup.allowed, setup.temperature, setup.model, writer,
        conversation=setup.runner.conversation, session=session)

  outcome = driver.run(
      workdir, method, state,
      schedule=driver.Schedule.of(config, evaluation),
      evaluate=evaluate, writer=writer, warm_start=warm_start if warm.iterations else None,
      prepare=prepare, stateful=[*stateful, *(h for h in hooks if isinstance(h, driver.Stateful))],
      hooks=hooks, hook_context=dict(workdir=workdir, tokenizer=setup.tokenizer,
                                     env_name=config.env_name, writer=writer, pipeline=None))
  driver.print_summary(outcome, evaluation.num_tasks, evaluation.pass_k)
  return outcome


def policy_state(params, optimizer, seed: int, **fields) -> types.ActorCriticState:
  """Step 0 of a method's state: the policy, its optimizer state and the run's key."""
  return types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(seed)),
      policy_params=params, policy_opt_state=optimizer.init(params), **fields)


class PolicyMethod:
  """Defaults every offline method shares: evaluate the policy, nothing to restore or close."""

  name = "offline"

  def policy_params(self, state):
    return state.policy_params

  def progress(self, metrics) -> dict[str, float]:
    return {"success": metrics.get("train/success", float("nan")),
            "loss": metrics.get("loss/policy", float("nan"))}

  def restored(self, state) -> None:
    del state

  def close(self) -> None:
    pass
