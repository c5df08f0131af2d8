"""One training run: collect → score → update, with evaluation, checkpoints and resume.

`train` is the function `experiments/run.py` calls; every argument but `workdir` is bound in gin.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import registry
from agentrl_jax.learner import batches
from agentrl_jax.learner import checkpoint as checkpoint_lib
from agentrl_jax.learner import configs
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import preemption
from agentrl_jax.learner import rollouts as rollouts_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import hf
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import multihost
from agentrl_jax.parallel import rules as rules_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.viewer import report as viewer_report

# Seed ranges kept apart so training never sees a held-out task (EvalConfig.seed_offset is above).
_WARM_START_SEED_BASE = 500_000_000


@dataclasses.dataclass
class TrainSummary:
  """What a run reports at its end."""

  iterations: int
  resumed_from: int | None
  success_before: float | None
  success_after_warm_start: float | None
  success_after: float
  final_metrics: dict[str, float]
  preempted: bool = False


def make_optimizer(config: configs.OptimConfig, total_steps: int) -> optax.GradientTransformation:
  end = config.learning_rate if config.end_learning_rate is None else config.end_learning_rate
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, config.learning_rate, max(config.warmup_steps, 1)),
       optax.linear_schedule(config.learning_rate, end, max(total_steps - config.warmup_steps, 1))],
      [max(config.warmup_steps, 1)]) if config.warmup_steps else optax.linear_schedule(
          config.learning_rate, end, max(total_steps, 1))
  return optax.chain(
      optax.clip_by_global_norm(config.max_grad_norm),
      optax.adamw(schedule, b1=config.b1, b2=config.b2, weight_decay=config.weight_decay))


def _restricted_sampling(sampling: sampler_lib.SamplingConfig, env, tok: tokenizer_lib.Tokenizer):
  if not env.action_words:
    raise ValueError(f"TrainConfig.restrict_to_action_words: env {env.name!r} has no finite action set")
  if sampling.thinking is not None:
    raise ValueError("TrainConfig.restrict_to_action_words = True allows one-token actions, so "
                     "SamplingConfig.thinking needs restrict_to_action_words = False")
  ids = tuple(tok.single_token_id(word) for word in env.action_words)
  return dataclasses.replace(sampling, allowed_token_ids=ids, max_action_tokens=1)


def _credit_pipeline(config: configs.TrainConfig, reward_shapers, corrections) -> pipeline.CreditPipeline:
  estimator = estimators.get_estimator(config.estimator)
  if estimator.needs_critic and not config.use_critic:
    raise ValueError(f"TrainConfig.estimator={config.estimator!r} needs a critic; set "
                     f"TrainConfig.use_critic = True")
  kwargs = dict(config.estimator_kwargs)
  accepted = inspect.signature(estimator.fn).parameters
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise ValueError(f"TrainConfig.estimator_kwargs: estimator {config.estimator!r} has no "
                     f"argument(s) {unknown}; it takes {sorted(set(accepted) - {'traj', 'values'})}")
  if "num_groups" in accepted:
    kwargs.setdefault("num_groups", config.batch_size)
  return pipeline.CreditPipeline(estimator=functools.partial(estimator, **kwargs),
                                 reward_shapers=tuple(reward_shapers), corrections=tuple(corrections))


def _max_actions(rollout: loop_lib.RolloutConfig) -> int:
  """An upper bound on one trajectory's action tokens (the learner's head reads only these)."""
  bound = rollout.max_turns * rollout.sampling.max_action_tokens
  if rollout.max_trajectory_action_tokens:
    bound = min(bound, rollout.max_trajectory_action_tokens)
  return bound


def train(workdir: str, *, config: configs.TrainConfig = configs.TrainConfig(),
          model: transformer.TransformerConfig | None = None,
          critic_model: transformer.TransformerConfig | None = None,
          rollout: loop_lib.RolloutConfig = loop_lib.RolloutConfig(),
          loss: step_lib.LossConfig = step_lib.LossConfig(),
          optim: configs.OptimConfig = configs.OptimConfig(),
          critic_optim: configs.OptimConfig = configs.OptimConfig(),
          warm_start: configs.WarmStartConfig = configs.WarmStartConfig(),
          evaluation: configs.EvalConfig = configs.EvalConfig(),
          reward_shapers: Sequence[pipeline.RewardShaper] = (),
          corrections: Sequence[pipeline.Correction] = (),
          viewer: viewer_report.ViewerConfig | None = None,
          tokenizer_path: str | None = None,
          init_from: str | None = None,
          mesh: mesh_lib.MeshConfig | None = None,
          strategy: Any = None) -> TrainSummary:
  """Trains a policy on one environment and returns the summary.

  Args:
    workdir: metrics, checkpoints and the operative config go here; an existing checkpoint
      there is resumed.
    config: the run (env, sizes, estimator).
    model: policy architecture; `vocab_size` is taken from the tokenizer. Default: `tiny`.
    critic_model: critic architecture when `config.use_critic` (default: the policy's, value head).
    rollout, loss, optim, critic_optim, warm_start, evaluation: see their classes.
    reward_shapers: turn-reward shaping functions applied before the estimator, in order.
    corrections: advantage corrections applied after the estimator, in order.
    viewer: write an HTML credit report of the iteration's batch at every evaluation, or None.
    tokenizer_path: a SentencePiece model; default: the one shipped with the package.
    init_from: a Hugging Face checkpoint directory (Qwen2/Llama) to start the policy from; its
      config.json gives the architecture (a `model` binding, if any, must agree with it).
    mesh: run the learner on a device mesh with these axis sizes (None: one device; several
      processes always use a mesh, all data-parallel unless given).
    strategy: a rollout strategy (TSR, T²PO, ARPO, ...) with
      `collect(runner, make_env, seeds, group_ids, *, params, rng, row_ids)`; None plays each
      episode once with the policy.

  Several processes (`jax.process_count() > 1`) each play their contiguous share of the batch
  (`multihost.host_share`) with a full local copy of the policy and join one global batch for
  the sharded update; only process 0 writes metrics, configs and reports.
  """
  try:
    tok, make_env, model, rollout, advantage_fn = _resolve(
        config, model, rollout, loss, reward_shapers, corrections, tokenizer_path, init_from)
    if mesh is None and jax.process_count() > 1:
      mesh = mesh_lib.MeshConfig()
    device_mesh = mesh_lib.make_mesh(mesh) if mesh is not None else None
    for name, count in (("TrainConfig batch", config.batch_size),
                        ("EvalConfig.num_tasks", evaluation.num_tasks),
                        ("WarmStartConfig.episodes_per_iteration", warm_start.episodes_per_iteration),
                        ("EvalConfig pass@k attempts", evaluation.pass_k * evaluation.pass_k_tasks)):
      if count % jax.process_count():
        raise ValueError(f"{name} of {count} episodes does not split over {jax.process_count()} processes")
    if device_mesh is not None:
      batch_shards = device_mesh.shape["data"] * device_mesh.shape["fsdp"]
      if (config.batch_size // loss.num_minibatches) % batch_shards:
        raise ValueError(
            f"a minibatch of {config.batch_size // loss.num_minibatches} episodes does not split "
            f"over the mesh's data x fsdp = {batch_shards} batch shards")
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise config_errors.ConfigError(f"{type(e).__name__}: {e}") from e
  files.makedirs(workdir)
  viewer_pipelines = None
  if viewer is not None:
    # The run's own pipeline first; a critic-based one cannot be re-scored without the critic.
    own = {} if config.use_critic else {f"run: {config.estimator}": advantage_fn}
    viewer_pipelines = viewer_report.make_pipelines(viewer, extra=own)

  rules = rules_lib.logical_rules("train")
  loaded_params = None
  if init_from:
    shardings = (None if device_mesh is None else
                 functools.partial(rules_lib.param_shardings, mesh=device_mesh, rules=rules))
    try:
      _, policy_graphdef, loaded_params = hf.load(init_from, shardings=shardings, expect=model)
    except ValueError as e:
      raise config_errors.ConfigError(f"learner.train.init_from: {e}") from e
  else:
    policy_graphdef = _graphdef(model, config.seed)
  critic_cfg = critic_graphdef = None
  if config.use_critic:
    critic_cfg = dataclasses.replace(critic_model or model, vocab_size=tok.vocab_size, head="value")
    critic_graphdef = _graphdef(critic_cfg, config.seed + 1)
  updates_per_iteration = loss.ppo_epochs * loss.num_minibatches
  policy_opt = make_optimizer(optim, config.num_iterations * updates_per_iteration)
  critic_opt = make_optimizer(critic_optim, config.num_iterations * updates_per_iteration) if config.use_critic else None
  init = functools.partial(_initial_state, model=model, critic_cfg=critic_cfg, seed=config.seed,
                           policy_opt=policy_opt, critic_opt=critic_opt, keep_ref=loss.kl_coef > 0)
  if device_mesh is None:
    state = init(loaded_params)
  else:
    state = rules_lib.create_sharded(init, device_mesh, rules, loaded_params)
    param_shardings = rules_lib.param_shardings(state.policy_params, device_mesh, rules)
    if multihost.is_writer():
      print(rules_lib.sharding_table(state.policy_params, param_shardings), flush=True)
    rules_lib.check_sufficiently_sharded(state.policy_params, param_shardings, device_mesh)

  allowed = sampler_lib.vocabulary_mask(model.vocab_size, rollout.sampling.allowed_token_ids)
  temperature = rollout.sampling.temperature or 1.0
  update = step_lib.make_update_fn(
      policy_graphdef=policy_graphdef, critic_graphdef=critic_graphdef, policy_optimizer=policy_opt,
      critic_optimizer=critic_opt, advantage_fn=advantage_fn, loss=loss, allowed=allowed,
      temperature=temperature, max_actions=_max_actions(rollout))
  runner = loop_lib.RolloutRunner(policy_graphdef, model, tok, rollout)
  if hasattr(strategy, "bind"):  # strategies that run the policy themselves (SERL's teacher)
    strategy = strategy.bind(graphdef=policy_graphdef, allowed=allowed, temperature=temperature,
                             max_actions=_max_actions(rollout))
  batch_envs = rollouts_lib.env_source(runner, rollout, config, make_env)
  sampling_params = rollouts_lib.sampling_layout(state.policy_params, device_mesh)
  greedy_runner = loop_lib.RolloutRunner(
      policy_graphdef, model, tok,
      dataclasses.replace(rollout, sampling=dataclasses.replace(rollout.sampling, temperature=0.0)))
  make_eval_env = functools.partial(registry.make, config.env_name,
                                    **{**config.env_kwargs, **evaluation.env_kwargs})
  run_eval = functools.partial(evaluate_lib.evaluate, greedy=greedy_runner, sampled=runner,
                               make_env=make_eval_env, config=evaluation)

  ckpt = checkpoint_lib.Checkpointer(workdir)
  writer = metrics_lib.MetricsWriter(workdir, process_index=jax.process_index())
  extra: dict[str, Any] = {"iteration": 0, "warm_start_done": False, "success_before": None,
                           "success_after_warm_start": None}
  # Methods that keep memory across iterations (PEARL) checkpoint it in `extra`.
  stateful = [f for f in (*reward_shapers, *corrections, strategy) if hasattr(f, "state_dict")]
  resumed_from = ckpt.latest_step()
  if resumed_from is not None:
    state, extra = ckpt.restore(target=state)
    resumed_from = ckpt.restored_step
    for method, saved in zip(stateful, extra.get("credit_state", [])):
      method.load_state_dict(saved)
    print(f"Resuming from the checkpoint at iteration {extra['iteration']} in {ckpt.directory}", flush=True)
  base_key = jax.random.key(config.seed)

  eval_key = jax.random.fold_in(base_key, 7)

  def evaluate_now(params, tag: int) -> dict[str, float]:
    # Tags: 0 before training, 1 after the warm start, 2 + iteration during RL.
    return run_eval(multihost.local_replica(params), rng=jax.random.fold_in(eval_key, tag))

  if extra["success_before"] is None:
    before = evaluate_now(state.policy_params, 0)
    extra["success_before"] = before["eval/greedy_success"]
    writer.write(0, {f"{k}_before": v for k, v in before.items()})
    print(f"Held-out greedy success before training: {extra['success_before']:.3f}", flush=True)

  if warm_start.iterations and not extra["warm_start_done"]:
    state = _warm_start(state, policy_graphdef, tok, rollout, warm_start, config, make_env, allowed,
                        temperature, model, writer, device_mesh)
    after_ws = evaluate_now(state.policy_params, 1)
    extra["success_after_warm_start"] = after_ws["eval/greedy_success"]
    extra["warm_start_done"] = True
    writer.write(0, {f"{k}_warm_start": v for k, v in after_ws.items()})
    print(f"Held-out greedy success after the warm start: {extra['success_after_warm_start']:.3f}",
          flush=True)
    # Memories filled during the warm start (SLEA's library) must survive a kill right after it.
    extra["credit_state"] = [_json_state(m.state_dict()) for m in stateful]
    ckpt.save(0, state, extra)

  rollouts = rollouts_lib.Rollouts(
      lambda it, params: rollouts_lib.collect_share(runner, strategy, make_env, batch_envs, config,
                                                    it, params, jax.random.fold_in(base_key, it)),
      sampling_params, config.max_staleness, config.num_iterations)
  progress = metrics_lib.ProgressBar(total=config.num_iterations, initial=extra["iteration"],
                                     enabled=jax.process_index() == 0)
  metrics: dict[str, float] = {}
  last_eval: dict[str, float] = {}
  preempted = False
  with preemption.StopRequest() as stop:
    for iteration in range(extra["iteration"], config.num_iterations):
      start = time.perf_counter()
      traj, stats, lag = rollouts.get(iteration, state.policy_params)
      metrics = batches.iteration_metrics(traj, stats)
      metrics["rollout/policy_lag"] = lag
      batch = batches.global_batch(traj, device_mesh)
      state, update_metrics = update(state, batch)
      metrics.update({k: float(v) for k, v in jax.device_get(update_metrics).items()})
      metrics["time/iteration_s"] = time.perf_counter() - start
      if iteration == extra["iteration"]:
        metrics_lib.write_operative_config(workdir, process_index=jax.process_index())
      done = extra["iteration"] = iteration + 1
      evaluating = done % evaluation.every == 0 or done == config.num_iterations
      if evaluating:
        last_eval = evaluate_now(state.policy_params, 2 + done)
        metrics.update(last_eval)
      if done % config.log_every == 0 or done == config.num_iterations:
        writer.write(done, metrics)
      if evaluating and viewer is not None and multihost.is_writer():
        viewer_report.write_report(workdir, done, traj, tok, viewer_pipelines,
                                   num_examples=viewer.num_examples, env_name=config.env_name,
                                   metrics=metrics, writer=writer)
      progress.update(done, {"success": metrics["train/success"],
                             "eval": last_eval.get("eval/greedy_success", float("nan")),
                             "loss": metrics.get("loss/policy", float("nan"))})
      preempted = stop.agreed(done) and done < config.num_iterations
      if done % config.checkpoint_every == 0 or done == config.num_iterations or preempted:
        extra["credit_state"] = [_json_state(m.state_dict()) for m in stateful]
        ckpt.save(done, state, extra)
      if preempted:
        print(f"Stopped at iteration {done}; checkpoint saved. Run the same command to resume.",
              flush=True)
        break
  progress.close()
  rollouts.close()
  if not last_eval and not preempted:  # a preempted host has seconds left: no extra evaluation
    last_eval = evaluate_now(state.policy_params, 2 + extra["iteration"])
  runner.close()
  writer.close()
  summary = TrainSummary(
      iterations=extra["iteration"], resumed_from=resumed_from,
      success_before=extra["success_before"],
      success_after_warm_start=extra["success_after_warm_start"],
      success_after=last_eval.get("eval/greedy_success", float("nan")),
      final_metrics={**metrics, **last_eval},
      preempted=preempted)
  _print_summary(summary, evaluation)
  return summary


def _graphdef(model: transformer.TransformerConfig, seed: int):
  """The module structure alone: built abstractly, so no parameter is allocated for it."""
  abstract = nnx.eval_shape(lambda: transformer.Transformer(model, nnx.Rngs(params=seed)))
  return nnx.split(abstract, nnx.Param)[0]


def _initial_state(policy_params, *, model, critic_cfg, seed: int, policy_opt, critic_opt,
                   keep_ref: bool) -> types.ActorCriticState:
  """Step 0 of a run (under jit on a mesh, so it is created sharded); `policy_params` are loaded
  weights, or None to initialise them from `seed`."""
  if policy_params is None:
    policy_params = transformer.create(model, seed)[1]
  critic_params = transformer.create(critic_cfg, seed + 1)[1] if critic_cfg is not None else None
  return types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(seed)),
      policy_params=policy_params, policy_opt_state=policy_opt.init(policy_params),
      critic_params=critic_params,
      critic_opt_state=critic_opt.init(critic_params) if critic_cfg is not None else None,
      ref_params=policy_params if keep_ref else None)


def _json_state(state: dict[str, Any]) -> dict[str, Any]:
  return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in state.items()}


def _resolve(config: configs.TrainConfig, model, rollout: loop_lib.RolloutConfig,
             loss: step_lib.LossConfig, reward_shapers, corrections, tokenizer_path,
             init_from=None):
  """Checks the configs against each other and the env/tokenizer; nothing is computed yet."""
  tok = tokenizer_lib.load_tokenizer(tokenizer_path)
  make_env = functools.partial(registry.make, config.env_name, **config.env_kwargs)
  probe_env = make_env()
  if probe_env.max_turns > rollout.max_turns:
    raise ValueError(f"env {config.env_name!r} runs up to {probe_env.max_turns} turns but "
                     f"RolloutConfig.max_turns={rollout.max_turns}")
  if config.max_staleness and loss.tis_cap is None:
    raise ValueError("TrainConfig.max_staleness=1 plays each batch with a policy one update old; "
                     "set LossConfig.tis_cap (e.g. 2.0) so the update corrects for the lag")
  if config.max_staleness and rollout.workers.kind == "process":
    raise ValueError("TrainConfig.max_staleness=1 with WorkerConfig.kind='process' is not "
                     "supported: the worker processes are stepped from one thread at a time")
  if config.batch_size % loss.num_minibatches:
    raise ValueError(f"TrainConfig batch of {config.batch_size} episodes is not divisible into "
                     f"LossConfig.num_minibatches={loss.num_minibatches}")
  if init_from:
    checkpoint_model, _ = hf.load_config(init_from)
    if model is not None:
      diffs = hf.architecture_diff(checkpoint_model, dataclasses.replace(model, vocab_size=tok.vocab_size))
      if diffs:
        raise ValueError(f"learner.train.init_from={init_from!r}: config.json differs from the "
                         "configured model: " + "; ".join(diffs))
    if checkpoint_model.vocab_size != tok.vocab_size:
      raise ValueError(f"learner.train.init_from={init_from!r}: vocab_size "
                       f"{checkpoint_model.vocab_size} differs from the tokenizer's {tok.vocab_size}")
    model = checkpoint_model
  model = dataclasses.replace(model or transformer.tiny(tok.vocab_size), vocab_size=tok.vocab_size)
  if config.restrict_to_action_words:
    rollout = dataclasses.replace(rollout, sampling=_restricted_sampling(rollout.sampling, probe_env, tok))
  if model.position == "turn_slot" and model.max_turns < rollout.max_turns:
    raise ValueError(f"TransformerConfig.max_turns={model.max_turns} is below "
                     f"RolloutConfig.max_turns={rollout.max_turns}: later turns would share an embedding")
  advantage_fn = _credit_pipeline(config, reward_shapers, corrections)
  return tok, make_env, model, rollout, advantage_fn


def _warm_start(state, graphdef, tok, rollout, warm_start, config, make_env, allowed, temperature,
                model, writer, device_mesh=None):
  """Behaviour cloning on noisy scripted-expert episodes; returns the state with new policy params."""
  optimizer = optax.adam(warm_start.learning_rate)
  sft = step_lib.make_sft_fn(policy_graphdef=graphdef, optimizer=optimizer, allowed=allowed,
                             temperature=temperature, max_actions=_max_actions(rollout))
  demo_runner = loop_lib.RolloutRunner(graphdef, model, tok, rollout)
  actor = loop_lib.noisy_expert(warm_start.expert_noise)
  params, opt_state = state.policy_params, optimizer.init(state.policy_params)
  n = warm_start.episodes_per_iteration
  share = multihost.host_share(n)
  for i in range(warm_start.iterations):
    rows = range(share.start, share.stop)
    seeds = [_WARM_START_SEED_BASE + i * n + j for j in rows]
    # One generator per demonstration, keyed by its global index: the same demos on any host count.
    actor_rngs = [np.random.default_rng((config.seed, i, j)) for j in rows]
    traj, _ = demo_runner.collect([make_env() for _ in seeds], seeds, list(rows), actor=actor,
                                  actor_rng=actor_rngs)
    params, opt_state, m = sft(params, opt_state, batches.global_batch(traj, device_mesh))
    if (i + 1) % 10 == 0 or i + 1 == warm_start.iterations:
      writer.write(0, {"warm_start/nll": float(m["sft/nll"]), "warm_start/iteration": i + 1})
  return state.replace(policy_params=params,
                       ref_params=params if state.ref_params is not None else None)


def _print_summary(summary: TrainSummary, evaluation: configs.EvalConfig) -> None:
  if summary.preempted:
    return  # the stop message already said where the run stands
  lines = [f"Done: {summary.iterations} iterations"
           + (f" (resumed from checkpoint {summary.resumed_from})" if summary.resumed_from is not None else "")]
  if summary.success_before is not None:
    lines.append(f"  held-out greedy success before training: {summary.success_before:.3f}")
  if summary.success_after_warm_start is not None:
    lines.append(f"  after the warm start (behaviour cloning): {summary.success_after_warm_start:.3f}")
  lines.append(f"  after RL: {summary.success_after:.3f}  ({evaluation.num_tasks} held-out tasks)")
  key = f"eval/pass@{evaluation.pass_k}"
  if key in summary.final_metrics:
    lines.append(f"  sampled pass@{evaluation.pass_k}: {summary.final_metrics[key]:.3f}")
  print("\n".join(lines), flush=True)


def run(workdir: str, *, entry: Callable[..., Any] = train) -> Any:
  """What `experiments/run.py` calls: `entry(workdir=workdir)`, online RL (`train`) by default.

  Other training loops (offline, distillation) are chosen in gin with
  `learner.run.entry = @drift.train`; their arguments are bound on them directly.
  """
  return entry(workdir=workdir)
