r"""Writes a trajectory report from a run's latest checkpoint.

  python -m agentrl_jax.viewer --workdir=/tmp/quickstart
  python -m agentrl_jax.viewer --workdir=/tmp/quickstart \
      --gin_bindings="report.ViewerConfig.estimators = ('grpo', 'gigpo', 'rloo')"

The run is rebuilt from `<workdir>/config.gin` (the config `experiments/run.py` wrote), the
policy parameters are restored from the newest checkpoint, a few held-out tasks are played
`group_size` times each with the run's sampling settings, the episodes are scored by the run's own
credit pipeline and by `report.ViewerConfig`'s pipelines, and the report is written to
`<workdir>/viewer/iter_<n>.html` (n = the checkpoint's iteration) with `index.html` beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.envs import registry
from agentrl_jax.learner import assembly
from agentrl_jax.learner import checkpoint as checkpoint_lib
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import learner
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.viewer import report

DEFAULT_IMPORTS = ("from agentrl_jax.learner import learner",
                   "from agentrl_jax.viewer import report")


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m agentrl_jax.viewer",
      description="Write an HTML trajectory report from a run's latest checkpoint.")
  parser.add_argument("--workdir", required=True,
                      help="the run's workdir (holds config.gin and checkpoints/)")
  parser.add_argument("--gin_file", action="append", default=[],
                      help="extra gin file parsed after <workdir>/config.gin; repeatable")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="extra binding, e.g. \"report.ViewerConfig.num_examples = 6\"; "
                           "repeatable")
  parser.add_argument("--num_tasks", type=int, default=2,
                      help="held-out tasks played, each group_size times (default 2)")
  parser.add_argument("--seed", type=int, default=0, help="sampling seed")
  return parser.parse_args(argv)


def train_arguments() -> dict[str, Any]:
  """`learner.train`'s keyword arguments as the parsed gin config binds them (else defaults)."""
  arguments = {name: p.default for name, p in inspect.signature(learner.train).parameters.items()
               if p.default is not inspect.Parameter.empty}
  # gin evaluates `@configs.TrainConfig()`-style references when it reports the bindings.
  arguments.update(gin.get_bindings(learner.train))
  return arguments


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Run:
  """What the viewer needs of a run: its policy, how it samples, and how it scores."""

  tokenizer: Any
  model: Any
  rollout: Any
  config: Any
  evaluation: Any
  graphdef: Any
  state: Any
  iteration: int
  run_pipeline: Any


def _state_template(arguments: dict[str, Any], model, tokenizer):
  """The policy graphdef and an `ActorCriticState` shaped as `learner.train` builds it."""
  config, loss = arguments["config"], arguments["loss"]
  graphdef, policy_params = transformer.create(model, config.seed)
  critic_params = None
  if config.use_critic:
    critic_cfg = dataclasses.replace(arguments.get("critic_model") or model,
                                     vocab_size=tokenizer.vocab_size, head="value")
    critic_params = transformer.create(critic_cfg, config.seed + 1)[1]
  # Only the optimizer states' structure matters for the restore target, not the schedule.
  policy_opt = assembly.make_optimizer(arguments["optim"], 1)
  critic_opt = assembly.make_optimizer(arguments["critic_optim"], 1)
  template = types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(config.seed)),
      policy_params=policy_params,
      policy_opt_state=jax.eval_shape(policy_opt.init, policy_params),
      critic_params=critic_params,
      critic_opt_state=(jax.eval_shape(critic_opt.init, critic_params)
                        if config.use_critic else None),
      ref_params=policy_params if loss.kl_coef > 0 else None)
  return graphdef, template


def restore_run(workdir: str, arguments: dict[str, Any]) -> _Run:
  """Rebuilds the run's state as `learner.train` does and restores the newest checkpoint.

  Raises:
    FileNotFoundError: the workdir has no checkpoint.
  """
  config, rollout = arguments["config"], arguments["rollout"]
  with checkpoint_lib.Checkpointer(workdir) as ckpt:
    step = ckpt.latest_step()
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {ckpt.directory}; train first")
    tokenizer = tokenizer_lib.load_tokenizer(arguments.get("tokenizer_path"))
    model = dataclasses.replace(arguments.get("model") or transformer.tiny(tokenizer.vocab_size),
                                vocab_size=tokenizer.vocab_size)
    graphdef, template = _state_template(arguments, model, tokenizer)
    # An explicit step: a corrupt checkpoint raises here instead of being moved aside.
    state, extra = ckpt.restore(step, target=template)
  if config.restrict_to_action_words:
    env = registry.make(config.env_name, **config.env_kwargs)
    rollout = dataclasses.replace(
        rollout, sampling=assembly.restricted_sampling(rollout.sampling, env, tokenizer))
  run_pipeline = assembly.credit_pipeline(config, arguments.get("reward_shapers") or (),
                                          arguments.get("corrections") or ())
  return _Run(tokenizer=tokenizer, model=model, rollout=rollout, config=config,
              evaluation=arguments["evaluation"], graphdef=graphdef, state=state,
              iteration=int(extra.get("iteration", step)), run_pipeline=run_pipeline)


def run_name(config, corrections: Sequence[Any]) -> str:
  """The run's own pipeline as shown in the report, e.g. `run: grpo + grounded_credit`."""
  names = [getattr(c, "__name__", None) or getattr(getattr(c, "func", None), "__name__", "correction")
           for c in corrections]
  return "run: " + " + ".join([config.estimator, *names])


def write_viewer_report(workdir: str, *, num_tasks: int = 2, seed: int = 0) -> str:
  """Restores the run of the parsed gin config, plays held-out tasks, writes the report."""
  if num_tasks < 1:
    raise ValueError(f"--num_tasks must be >= 1, got {num_tasks}")
  arguments = train_arguments()
  run = restore_run(workdir, arguments)
  viewer_config = _viewer_config()
  corrections = tuple(arguments.get("corrections") or ())
  pipelines = report.make_pipelines(
      viewer_config, extra={run_name(run.config, corrections): run.run_pipeline})

  group_size = run.config.group_size
  tasks = evaluate_lib.held_out_seeds(run.evaluation, num_tasks)
  seeds = [task for task in tasks for _ in range(group_size)]
  groups = [i for i in range(num_tasks) for _ in range(group_size)]
  envs = [registry.make(run.config.env_name, **run.config.env_kwargs) for _ in seeds]
  runner = loop_lib.RolloutRunner(run.graphdef, run.model, run.tokenizer, run.rollout)
  traj, _ = runner.collect(envs, seeds, groups, params=run.state.policy_params,
                           rng=jax.random.key(seed))
  return report.write_report(
      workdir, run.iteration, traj, run.tokenizer, pipelines,
      num_examples=viewer_config.num_examples, env_name=run.config.env_name,
      metrics=_metrics_at(workdir, run.iteration))


def _viewer_config() -> report.ViewerConfig:
  """`report.ViewerConfig` as bound in gin; its defaults when no binding names it."""
  try:
    return gin.get_configurable(report.ViewerConfig)()
  except ValueError:
    return report.ViewerConfig()


def _metrics_at(workdir: str, iteration: int) -> dict[str, float]:
  """The scalars `metrics.jsonl` recorded at `iteration` (later records win)."""
  merged: dict[str, float] = {}
  for record in metrics_lib.read_metrics(workdir):
    if record.get("step") == iteration:
      merged.update(record)
  return merged


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_flags(argv)
  config_file = os.path.join(args.workdir, metrics_lib.CONFIG_FILE)
  if not os.path.isfile(config_file):
    print(f"error: {config_file} not found; is --workdir a training run's workdir?",
          file=sys.stderr)
    return 2
  try:
    config_errors.parse_config([config_file, *args.gin_file], args.gin_bindings,
                               default_imports=DEFAULT_IMPORTS)
  except config_errors.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    path = write_viewer_report(args.workdir, num_tasks=args.num_tasks, seed=args.seed)
  except (FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"Wrote {path}")
  print(f"Index: {os.path.join(args.workdir, 'viewer', 'index.html')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
