"""Credit-assignment methods trained side by side with `learner.train` (notebooks/credit_comparison).

A method is an advantage estimator from `advantages.estimators.ESTIMATORS`, optionally with a critic
(PPO-GAE), a reward shaper (GRPO + the curiosity duplicate-observation penalty), a correction (GRPO
gated to the decision turns that DD-Chain reports: the oracle turn-level reference; C³'s confidence
correction on repeated and rejected moves; DeltaTTG's progress-weighted credit, its meter fitted per
run before training), or the loss
settings its paper pairs it with (Dr.GRPO's length-independent aggregation, GAGPO's turn-level
ratio). Each run
is a plain `learner.train` call with Python configs (no gin); its per-iteration training success
and invalid-action rate come from `<workdir>/metrics.jsonl`, and its repeated-action rate from
`ActionRateProbe`, a reward shaper that records `viewer.report.action_rates` of every training
batch and changes nothing.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import inspect
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import numpy as np

from agentrl_jax import files
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.credit import c3 as c3_lib
from agentrl_jax.credit import decision_gate
from agentrl_jax.credit import deltattg
from agentrl_jax.envs import base
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import step
from agentrl_jax.models import transformer
from agentrl_jax.offline import deltattg_meter
from agentrl_jax.rewards import curiosity
from agentrl_jax.rollout import loop
from agentrl_jax.rollout import sampler
from agentrl_jax.studies import fits
from agentrl_jax.viewer import report


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Method:
  """One credit-assignment method.

  Attributes:
    name: label in plots and tables.
    estimator: a key of `advantages.estimators.ESTIMATORS`.
    use_critic: train a value critic (needed by "gae").
    curiosity: add the duplicate-observation penalty before the estimator.
    oracle_gate: keep the advantage on decision turns only (`credit.decision_gate`): turn-level
      credit with an oracle critic, the reference on chains that report their decision turns.
    c3: apply C³ after the estimator (`credit.c3.c3`, its defaults): positive credit shrinks on
      moves repeated from the same state and on rejected moves, more where the sampler was sure.
    deltattg: apply DeltaTTG after the estimator (`credit.deltattg.DeltaTTG`, its defaults): each
      trajectory's credit is spread over its turns by the progress a frozen meter sees in them;
      the meter is fitted on the setting's noisy-expert episodes in the run's directory first.
    loss_overrides: `step.LossConfig` fields that differ from the comparison's shared loss
      (`SHARED_LOSS`), e.g. `{"ratio_level": "turn"}`.
    estimator_kwargs: hyperparameters bound to the estimator, e.g. `{"lambda_": 0.95}`.
  """

  name: str
  estimator: str
  use_critic: bool = False
  curiosity: bool = False
  oracle_gate: bool = False
  c3: bool = False
  deltattg: bool = False
  loss_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  estimator_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not self.name:
      raise ValueError(f"Method.name must be non-empty, got {self.name!r}")
    spec = estimators.get_estimator(self.estimator)  # Raises on an unknown name.
    if spec.needs_critic and not self.use_critic:
      raise ValueError(f"Method {self.name!r}: estimator {self.estimator!r} needs use_critic=True")
    known = {field.name for field in dataclasses.fields(step.LossConfig)}
    unknown = sorted(set(self.loss_overrides) - known)
    if unknown:
      raise ValueError(f"Method {self.name!r}: loss_overrides {unknown} are not LossConfig fields")
    takes = inspect.signature(spec.fn).parameters
    unknown = sorted(set(self.estimator_kwargs) - set(takes))
    if unknown:
      raise ValueError(f"Method {self.name!r}: estimator_kwargs {unknown} are not arguments of "
                       f"{self.estimator!r}")
    # Frozen like the rest of the method, and checked now rather than at the run's start.
    object.__setattr__(self, "loss_overrides", MappingProxyType(dict(self.loss_overrides)))
    object.__setattr__(self, "estimator_kwargs", MappingProxyType(dict(self.estimator_kwargs)))
    loss_config(self)

  def estimator_fn(self) -> str | Callable[..., Any]:
    """The registry name, or its function with `estimator_kwargs` bound."""
    if not self.estimator_kwargs:
      return self.estimator
    return functools.partial(estimators.get_estimator(self.estimator).fn, **self.estimator_kwargs)


# The loss every method trains with unless it overrides a field.
SHARED_LOSS: Mapping[str, Any] = MappingProxyType({"entropy_coef": 0.01, "agg_mode": "token-mean"})
# Rollout length of every run; Dr.GRPO's constant normaliser L_max is this same budget.
MAX_LEN = 384
RESULT_FILE = "comparison_result.json"  # written when a run finishes; read back on a rerun
# The benchmark's settings: low decision densities on a 32-turn chain, and longer FrozenLake
# episodes; every applicable method on each, with the same episodes per iteration and iterations.
BENCHMARK_SETTINGS = ("dd_chain_t32_m1", "dd_chain_t32_m2", "dd_chain_t32_m4", "dd_chain_t32_m8",
                      "frozenlake_6x6", "dd_chain_t32_m1_sgd", "dd_chain_t32_m2_sgd",
                      "dd_chain_t32_m4_sgd", "dd_chain_t32_m8_sgd", "dd_chain_t32_m4_b8",
                      "dd_chain_t32_m4_b4", "dd_chain_t32_m1_b8", "dd_chain_t32_m2_b8",
                      "dd_chain_t32_m8_b8", "frozenlake_6x6_fresh")
# The chains again under clipped SGD instead of Adam (`benchmark_spec`): whether the
# gradient-SNR advantage of turn-level credit turns into speed when the optimizer does not
# rescale each parameter by its own gradient history.
SGD_CHAINS = ("dd_chain_t32_m1_sgd", "dd_chain_t32_m2_sgd", "dd_chain_t32_m4_sgd",
              "dd_chain_t32_m8_sgd")
# 8 or 4 episodes an iteration instead of 64: whether it does when the batch gradient is itself
# noisy (a batch of 64 has √64 = 8 times the SNR of one trajectory); 8 episodes at every
# density, 4 at m = 4. Each is (tasks per iteration, group size, iterations): 480 or 400
# episodes against the 1280 of the 64-episode chains, since small batches learn more per
# episode; 800 at m = 8, which learns slowest.
SMALL_BATCHES: Mapping[str, tuple[int, int, int]] = MappingProxyType({
    "dd_chain_t32_m4_b8": (2, 4, 60), "dd_chain_t32_m4_b4": (1, 4, 100),
    "dd_chain_t32_m1_b8": (2, 4, 60), "dd_chain_t32_m2_b8": (2, 4, 60),
    "dd_chain_t32_m8_b8": (2, 4, 100)})
SMALL_BATCH_CHAINS = tuple(SMALL_BATCHES)
# On those settings GRPO and its oracle-gated version run: the question is their gap.
GATE_SETTINGS = SGD_CHAINS + SMALL_BATCH_CHAINS
GATE_METHODS = ("grpo", "grpo_oracle_turn")
# Where the gap was first found (ρ = 1/8 at 8 and 4 episodes), and at 8 episodes on either side
# of it (ρ = 1/16 and 1/4), the learned step- and turn-level methods run too: whether any recovers
# part of what the oracle gate gains over GRPO, on more than one setting.
LEARNED_SETTINGS = ("dd_chain_t32_m4_b8", "dd_chain_t32_m4_b4", "dd_chain_t32_m2_b8",
                    "dd_chain_t32_m8_b8")
LEARNED_METHODS = ("gigpo", "mt_grpo", "ppo_turn_gae_l95")
# A confirmatory rerun of the one held-out difference the 6x6 FrozenLake comparison found (MT-GRPO
# above GRPO at p = 0.028, one of many comparisons): the same setting and sizes on seeds none of
# its runs used, only the two methods in question.
class Replication(NamedTuple):
  """A rerun of `of` (its env and sizes) with only `methods`, on `seeds` that `of` never used."""

  of: str
  methods: tuple[str, ...]
  seeds: tuple[int, ...]


REPLICATIONS: Mapping[str, Replication] = MappingProxyType({
    "frozenlake_6x6_fresh": Replication("frozenlake_6x6", ("grpo", "mt_grpo"), (5, 6, 7, 8, 9))})
# SGD's rate on these chains: at 0.1 GRPO reached 0.9 training success at m = 4 by iteration 5
# (Adam's median is 8), at 0.03 by iteration 10 (seed 0), leaving room for a gap.
SGD_LEARNING_RATE = 0.03


def loss_config(method: Method) -> step.LossConfig:
  """The method's loss: `SHARED_LOSS` with its `loss_overrides`."""
  return step.LossConfig(**{**SHARED_LOSS, **method.loss_overrides})


METHODS: tuple[Method, ...] = (
    Method(name="grpo", estimator="grpo"),
    # Dr.GRPO is both halves: the std-free advantage and a length-independent aggregation.
    Method(name="dr_grpo", estimator="dr_grpo",
           loss_overrides={"agg_mode": "seq-mean-token-sum-norm", "max_len_norm": MAX_LEN}),
    Method(name="rloo", estimator="rloo"),
    Method(name="gigpo", estimator="gigpo"),
    # GAGPO clips one action-level ratio per turn (the mean log-ratio of its tokens).
    Method(name="gagpo", estimator="gagpo", loss_overrides={"ratio_level": "turn"}),
    Method(name="mt_grpo", estimator="mt_grpo"),
    Method(name="ppo_gae", estimator="gae", use_critic=True),
    # The same critic, bootstrapped once per turn instead of once per token.
    Method(name="ppo_turn_gae", estimator="turn_gae", use_critic=True),
    # λ = 1 credits every turn with the return minus its value; below 1 each turn's advantage
    # bootstraps from the next turn's value, so a critic that has found the decision turns gives
    # the routine ones little. (On one-token actions token-level GAE at the same λ is identical.)
    Method(name="ppo_turn_gae_l95", estimator="turn_gae", use_critic=True,
           estimator_kwargs={"lambda_": 0.95}),
    Method(name="grpo_curiosity", estimator="grpo", curiosity=True),
    # GRPO's advantage on the decision turns only: what an exact turn-level critic would give.
    Method(name="grpo_oracle_turn", estimator="grpo", oracle_gate=True),
    Method(name="grpo_c3", estimator="grpo", c3=True),
    Method(name="grpo_deltattg", estimator="grpo", deltattg=True),
)

class Setting(NamedTuple):
  """A task the methods are compared on: the env, its arguments and the episode's token budget."""

  env: str
  env_kwargs: Mapping[str, Any]
  max_turns: int
  max_len: int = MAX_LEN
  obs_buckets: tuple[int, ...] = (48, 64)
  length_buckets: tuple[int, ...] = (128, 192, 288)
  loops: bool = True  # repeated states can occur (where the curiosity penalty applies)
  # Episode lengths depend on the policy, so a tokens-to-go meter has progress to read (DeltaTTG).
  variable_length: bool = True


def _dd_chain(horizon: int, num_decisions: int) -> Setting:
  # "turn k of T" plus one action token a turn: about 9 tokens a turn with the instructions.
  length = 32 + 10 * horizon
  return Setting(env="dd_chain", env_kwargs={"horizon": horizon, "num_decisions": num_decisions,
                                             "noise_std": 0.0},
                 max_turns=horizon, max_len=length, obs_buckets=(32,),
                 length_buckets=(length // 2, length), loops=False, variable_length=False)


# Small multi-turn tasks, by name.
SETTINGS: Mapping[str, Setting] = MappingProxyType({
    # The quickstart's maps: 4x4, holes with probability 0.2, solvable within 10 moves.
    "frozenlake": Setting(env="frozenlake", env_kwargs={"size": 4, "hole_prob": 0.2,
                                                        "max_turns": 10}, max_turns=10),
    # ρ = 2/8: two decision turns among eight; success needs both right. Every state is visited
    # once per episode, so the curiosity penalty never fires here.
    "dd_chain": _dd_chain(8, 2),
    # The benchmark's low-density chains: T = 32 turns, m decisions (ρ = m/32).
    **{f"dd_chain_t32_m{m}": _dd_chain(32, m) for m in (1, 2, 4, 8)},
    **{f"dd_chain_t32_m{m}_sgd": _dd_chain(32, m) for m in (1, 2, 4, 8)},
    **{name: _dd_chain(32, 4) for name in ("dd_chain_t32_m4_b8", "dd_chain_t32_m4_b4")},
    **{f"dd_chain_t32_m{m}_b8": _dd_chain(32, m) for m in (1, 2, 8)},
    # Longer horizons where credit matters more: 6x6 maps, up to 18 moves.
    "frozenlake_6x6": Setting(env="frozenlake", env_kwargs={"size": 6, "hole_prob": 0.2,
                                                            "max_turns": 18},
                              max_turns=18, max_len=1280, obs_buckets=(64, 80),
                              length_buckets=(512, 896, 1280)),
})
# A replication runs on the very setting it reruns.
SETTINGS = MappingProxyType({**SETTINGS,
                             **{name: SETTINGS[r.of] for name, r in REPLICATIONS.items()}})
ENVS = SETTINGS  # the comparison's original name for them


def applies(method: Method, setting: str) -> bool:
  """Whether `method` is run on `setting`: the curiosity penalty and C³ only where states repeat
  (C³'s detectors flag a move repeated from an unchanged state or a rejected one: on the chains
  every state is new and every action valid, so it would equal GRPO), DeltaTTG only where episode
  lengths vary (every chain episode runs its T turns, so its meter reads the turn index alone),
  the oracle gate only where the env reports its decision turns (DD-Chain), and on
  `GATE_SETTINGS` only `GATE_METHODS` (with `LEARNED_METHODS` on `LEARNED_SETTINGS`), and on a
  replication only the methods it reruns."""
  if setting in REPLICATIONS:
    return method.name in REPLICATIONS[setting].methods
  if method.oracle_gate and SETTINGS[setting].env != "dd_chain":
    return False
  if setting in GATE_SETTINGS:
    learned = setting in LEARNED_SETTINGS and method.name in LEARNED_METHODS
    return method.name in GATE_METHODS or learned
  if method.deltattg and not SETTINGS[setting].variable_length:
    return False
  return not (method.curiosity or method.c3) or SETTINGS[setting].loops


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ComparisonSpec:
  """Sizes shared by every run of a comparison.

  Attributes:
    num_iterations: RL iterations per run.
    tasks_per_iteration, group_size: episodes per iteration = their product.
    learning_rate: learning rate of the policy (and critic).
    optimizer: `configs.OptimConfig.optimizer` of both ("adamw", or "sgd": momentum 0.9 on the
      gradient clipped to norm 1).
    num_layers, d_model: the tiny transformer (4 heads of d_model/4, MLP 4·d_model).
    eval_tasks: held-out tasks of the final greedy evaluation.
  """

  num_iterations: int = 50
  tasks_per_iteration: int = 8
  group_size: int = 8
  learning_rate: float = 3e-4
  optimizer: str = "adamw"
  num_layers: int = 2
  d_model: int = 64
  eval_tasks: int = 64

  def __post_init__(self):
    for name in ("num_iterations", "tasks_per_iteration", "num_layers", "d_model", "eval_tasks"):
      value = getattr(self, name)
      if not base.is_int(value) or value < 1:
        raise ValueError(f"ComparisonSpec.{name} must be an int >= 1, got {value!r}")
    if not base.is_int(self.group_size) or self.group_size < 2:
      raise ValueError(f"ComparisonSpec.group_size must be an int >= 2, got {self.group_size!r}")
    if self.d_model % 4:
      raise ValueError(f"ComparisonSpec.d_model must be divisible by 4 heads, got {self.d_model}")
    if not base.is_number(self.learning_rate) or self.learning_rate <= 0:
      raise ValueError(f"ComparisonSpec.learning_rate must be > 0, got {self.learning_rate!r}")
    if self.optimizer not in configs.OPTIMIZERS:
      raise ValueError(f"ComparisonSpec.optimizer must be one of {configs.OPTIMIZERS}, got "
                       f"{self.optimizer!r}")


# The benchmark's sizes: every method solves a T = 32 chain within about 10 iterations at this
# learning rate (GRPO, GiGPO, MT-GRPO and PPO-GAE reached 0.9 training success at iteration 7-8 at
# m = 8), so 20 iterations cover the part where speed can differ; 6x6 FrozenLake keeps 50.
BENCHMARK_SPEC = ComparisonSpec(num_iterations=20, tasks_per_iteration=8, group_size=8)
_BENCHMARK_ITERATIONS = MappingProxyType({"frozenlake_6x6": 50})


def benchmark_spec(setting: str) -> ComparisonSpec:
  """The credit benchmark's `ComparisonSpec` for `setting` (equal environment steps within it)."""
  if setting not in SETTINGS:
    raise ValueError(f"unknown env setting {setting!r}; known: {sorted(SETTINGS)}")
  if setting in REPLICATIONS:
    return benchmark_spec(REPLICATIONS[setting].of)
  iterations = _BENCHMARK_ITERATIONS.get(setting, BENCHMARK_SPEC.num_iterations)
  spec = dataclasses.replace(BENCHMARK_SPEC, num_iterations=iterations)
  if setting in SGD_CHAINS:
    spec = dataclasses.replace(spec, optimizer="sgd", learning_rate=SGD_LEARNING_RATE)
  if setting in SMALL_BATCHES:
    tasks, group, iterations = SMALL_BATCHES[setting]
    spec = dataclasses.replace(spec, tasks_per_iteration=tasks, group_size=group,
                               num_iterations=iterations)
  return spec


def benchmark_seeds(setting: str) -> tuple[int, ...]:
  """The credit benchmark's seeds on `setting`: 5, and 20 on the small-batch chains, whose runs
  take under a minute and whose iterations to threshold spread too widely for 5 to tell a gap
  of 1.4 from none; a replication's own, none of which the setting it reruns used."""
  if setting not in SETTINGS:
    raise ValueError(f"unknown env setting {setting!r}; known: {sorted(SETTINGS)}")
  if setting in REPLICATIONS:
    return REPLICATIONS[setting].seeds
  return tuple(range(20 if setting in SMALL_BATCHES else 5))


def spec_record(spec: ComparisonSpec) -> dict[str, Any]:
  """`spec` as the JSON-ready dict a results file keys its runs' validity on."""
  return dataclasses.asdict(spec)


class RunResult(NamedTuple):
  """One (method, env, seed) run; per-iteration arrays `[num_iterations]`."""

  method: str
  env: str
  seed: int
  success: np.ndarray
  invalid_action_rate: np.ndarray
  repeated_action_rate: np.ndarray
  eval_success: float
  # The update's global gradient norm before clipping (None in runs recorded before it was kept).
  grad_norm: np.ndarray | None = None


class Summary(NamedTuple):
  """Over seeds for one (method, env): mean curves with 95% t-bands `[num_iterations]`, and the
  table entries (final held-out success, mean training success over the run, iterations to
  `SUCCESS_THRESHOLD`, rates over the last quarter of training), each a `(mean, low, high)`
  triple."""

  method: str
  env: str
  num_seeds: int
  success: tuple[np.ndarray, np.ndarray, np.ndarray]
  repeated_action_rate: tuple[np.ndarray, np.ndarray, np.ndarray]
  invalid_action_rate: tuple[np.ndarray, np.ndarray, np.ndarray]
  final_eval_success: tuple[float, float, float]
  mean_train_success: tuple[float, float, float]
  iterations_to_threshold: tuple[float, float, float]
  late_train_success: tuple[float, float, float]
  late_repeated_action_rate: tuple[float, float, float]
  late_invalid_action_rate: tuple[float, float, float]


class ActionRateProbe:
  """A reward shaper that returns the batch unchanged and records its action rates on the host.

  The credit pipeline runs once per update inside the jitted step, so the rates leave through
  `jax.debug.callback` (ordered: one record per iteration, in order). Use it on a single device:
  under a multi-device mesh the callback would see shards.
  """

  def __init__(self):
    self.records: list[dict[str, float]] = []

  def _record(self, traj: types.Trajectories) -> None:
    self.records.append(report.action_rates(traj))

  def __call__(self, traj: types.Trajectories) -> types.Trajectories:
    jax.debug.callback(self._record, traj, ordered=True)
    return traj


def train_kwargs(method: Method, env: str, seed: int, spec: ComparisonSpec) -> dict[str, Any]:
  """The `learner.train` keyword arguments (all but workdir and reward shapers) of one run."""
  if env not in SETTINGS:
    raise ValueError(f"unknown env setting {env!r}; known: {sorted(SETTINGS)}")
  setting = SETTINGS[env]
  optim = configs.OptimConfig(optimizer=spec.optimizer, learning_rate=spec.learning_rate,
                              max_grad_norm=1.0)
  return dict(
      config=configs.TrainConfig(
          env_name=setting.env, env_kwargs=dict(setting.env_kwargs), seed=seed,
          num_iterations=spec.num_iterations, tasks_per_iteration=spec.tasks_per_iteration,
          group_size=spec.group_size, estimator=method.estimator_fn(),
          use_critic=method.use_critic,
          restrict_to_action_words=True, checkpoint_every=max(spec.num_iterations, 1)),
      model=transformer.TransformerConfig(
          vocab_size=1, num_layers=spec.num_layers, d_model=spec.d_model, num_heads=4,
          mlp_dim=4 * spec.d_model, position="turn_slot", alibi=True,
          max_turns=max(16, setting.max_turns), max_slots=64),
      rollout=loop.RolloutConfig(
          max_turns=setting.max_turns, max_len=setting.max_len, obs_buckets=setting.obs_buckets,
          length_buckets=setting.length_buckets, sampling=sampler.SamplingConfig(temperature=1.0)),
      loss=loss_config(method),
      optim=optim,
      critic_optim=optim,
      warm_start=configs.WarmStartConfig(iterations=0),
      evaluation=configs.EvalConfig(every=spec.num_iterations, num_tasks=spec.eval_tasks,
                                    pass_k=0))


METER_FILE = "meter.npz"  # DeltaTTG's fitted meter, in the run's directory


def corrections_of(method: Method, workdir: str | os.PathLike[str] = "") -> list[Callable[..., Any]]:
  """The post-advantage corrections `method` trains with, in the order they apply (DeltaTTG reads
  its meter from `workdir`, see `prepare_meter`)."""
  if method.deltattg and not workdir:
    raise ValueError(f"method {method.name!r} reads its DeltaTTG meter from the run's workdir; "
                     "pass it (after prepare_meter)")
  return (([decision_gate.oracle_decision_gate] if method.oracle_gate else [])
          + ([c3_lib.c3] if method.c3 else [])
          + ([deltattg.DeltaTTG(os.path.join(workdir, METER_FILE))] if method.deltattg else []))


def prepare_meter(workdir: str | os.PathLike[str], env: str, seed: int, **fit_sizes) -> str:
  """Fits DeltaTTG's meter for `env` into `workdir` (kept if already there); returns its path.

  Seeded by the run's seed; its episodes are sized like the setting's rollouts (the meter reads
  the turn index as a share of `max_turns`). `fit_sizes`: `episodes_per_policy`, `steps`.
  """
  setting = SETTINGS[env]
  path = os.path.join(workdir, METER_FILE)
  if not os.path.exists(path):
    deltattg_meter.train_meter(path, setting.env, setting.env_kwargs, max_turns=setting.max_turns,
                               max_len=setting.max_len, seed=seed, log=lambda line: None,
                               **fit_sizes)
  return path


def run_method(workdir: str, *, method: Method, env: str, seed: int,
               spec: ComparisonSpec) -> RunResult:
  """Trains one method from scratch in `workdir` (which must hold no earlier run).

  Args:
    workdir: fresh directory for metrics and the final checkpoint.
    method: the credit method.
    env: a key of `SETTINGS`.
    seed: model initialisation and sampling seed.
    spec: the shared sizes.

  Returns:
    `RunResult` with per-iteration training success and action rates.
  """
  saved = os.path.join(workdir, RESULT_FILE)
  if os.path.exists(saved):  # finished earlier: the study resumes run by run
    return _read_result(saved)
  if metrics_lib.read_metrics(workdir):
    raise ValueError(f"workdir {workdir!r} holds an unfinished run; remove it to run again")
  probe = ActionRateProbe()
  shapers = [probe] + ([curiosity.duplicate_observation_penalty] if method.curiosity else [])
  if method.deltattg:
    prepare_meter(workdir, env, seed)
  summary = learner.train(os.fspath(workdir), reward_shapers=shapers,
                          corrections=corrections_of(method, workdir),
                          **train_kwargs(method, env, seed, spec))
  records = [r for r in metrics_lib.read_metrics(workdir) if "train/success" in r]
  records = sorted({int(r["step"]): r for r in records}.items())
  if len(records) != spec.num_iterations or len(probe.records) != spec.num_iterations:
    raise RuntimeError(f"expected {spec.num_iterations} iterations, got {len(records)} metric "
                       f"records and {len(probe.records)} probe records in {workdir!r}")
  result = RunResult(
      method=method.name, env=env, seed=seed,
      success=np.array([r["train/success"] for _, r in records]),
      invalid_action_rate=np.array([r["rollout/invalid_action_rate"] for _, r in records]),
      repeated_action_rate=np.array([p["repeated_action_rate"] for p in probe.records]),
      eval_success=float(summary.success_after),
      grad_norm=np.array([r["loss/grad_norm"] for _, r in records]))
  with open(saved, "w", encoding="utf-8") as f:
    json.dump(result_record(result), f)
  return result


def result_record(result: RunResult) -> dict[str, Any]:
  """`result` as JSON-ready values (arrays as lists); `result_from_record` inverts it."""
  return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in result._asdict().items()}


def result_from_record(record: Mapping[str, Any]) -> RunResult:
  """The `RunResult` of a `result_record` (extra keys are ignored; a missing optional field
  takes its default)."""
  return RunResult(**{k: np.asarray(record[k]) if isinstance(record[k], list) else record[k]
                      for k in RunResult._fields if k in record})


def merge_results_file(path: str, results: Sequence[RunResult], specs: Mapping[str, Any],
                       *, fresh: bool = False, **fields: Any) -> dict[str, Any]:
  """Adds `results` to the study's results JSON at `path` and returns what it now holds.

  Runs already in the file are kept unless `results` has the same (env, method, seed). The
  writer speaks for the settings in `specs` only: per-setting fields merge, so a study run in
  parts (one setting at a time) keeps the other settings' analysis. A mapping field (`specs`,
  `seeds`, `plan`: keyed by setting) is merged key by key; a list of records with an "env"
  (`against_grpo`, `step_gap`) replaces only the records of the settings in `specs`; any other
  field replaces the file's. The read-merge-write runs
  under an exclusive lock on `path + ".lock"` and the file is replaced atomically, so several
  processes can work through one study's runs (each its own methods or settings) without
  dropping each other's. `fresh=True` replaces the file's content instead (a study whose runs
  must not mix with the file's, e.g. the CI size).
  """
  files.makedirs(os.path.dirname(path) or ".")
  with open(path + ".lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    payload: dict[str, Any] = {}
    if os.path.exists(path) and not fresh:
      with open(path, encoding="utf-8") as f:
        payload = json.load(f)
    runs = {(r["env"], r["method"], r["seed"]): r for r in payload.get("runs", [])}
    runs.update({(r.env, r.method, r.seed): result_record(r) for r in results})
    for name, value in {**fields, "specs": specs}.items():
      payload[name] = _merged_field(payload.get(name), value, set(specs))
    payload["runs"] = list(runs.values())
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(payload, f, indent=2)
    os.replace(tmp, path)
  return payload


def _merged_field(old: Any, new: Any, settings: set[str]) -> Any:
  """`new` merged into `old` for the writer of `settings` (see `merge_results_file`)."""
  if isinstance(old, Mapping) and isinstance(new, Mapping):
    return {**old, **new}
  if _setting_records(old) and _setting_records(new):
    return [r for r in old if r["env"] not in settings] + list(new)
  return new


def _setting_records(value: Any) -> bool:
  return isinstance(value, list) and all(isinstance(r, Mapping) and "env" in r for r in value)


def read_results_file(path: str, specs: Mapping[str, ComparisonSpec]
                      ) -> dict[tuple[str, str, int], RunResult]:
  """The finished runs in a results JSON whose setting is in `specs` with the same spec, keyed by
  (env, method, seed); `{}` when there is no file."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    payload = json.load(f)
  # A field added to the spec after a file was written reads as its default, the behaviour the
  # file's runs had (Adam before `optimizer` existed).
  defaults = spec_record(ComparisonSpec())
  recorded = {env: {**defaults, **spec} for env, spec in payload.get("specs", {}).items()}
  return {(r["env"], r["method"], int(r["seed"])): result_from_record(r)
          for r in payload.get("runs", [])
          if r["env"] in specs and recorded.get(r["env"]) == spec_record(specs[r["env"]])}


def complete_plan(runs: Mapping[tuple[str, str, int], RunResult],
                  seeds: Mapping[str, Sequence[int]]) -> dict[str, list[str]]:
  """The settings and methods of `runs` (keyed as `read_results_file` keys them) that have every
  seed `seeds[setting]` names, in `SETTINGS` and `METHODS` order (settings not in `seeds`: none).

  A study's tables and tests are made from these, whatever part of it one launch trained: a launch
  of one method on one setting must not drop the other finished rows from the results.
  """
  plan: dict[str, list[str]] = {}
  for setting in (s for s in SETTINGS if s in seeds):
    names = [m.name for m in METHODS
             if any(key[:2] == (setting, m.name) for key in runs)
             and all((setting, m.name, seed) in runs for seed in seeds[setting])]
    if names:
      plan[setting] = names
  return plan


def step_gaps(results: Sequence[RunResult], baseline: str = "grpo",
              turn: str = "grpo_oracle_turn") -> list[dict[str, Any]]:
  """Iterations to `SUCCESS_THRESHOLD` (over the setting's `threshold_window`), trajectory-level
  ÷ oracle turn-level, per chain setting.

  For each setting with runs of both `baseline` and `turn` on the same seeds: both medians, their
  ratio and the one-sided Mann–Whitney p of "the gated runs need fewer" (`fits.step_gap`), with
  ρ = m/T of the chain.
  """
  steps: dict[tuple[str, str], dict[int, int]] = {}
  for r in results:
    if r.method in (baseline, turn):
      steps.setdefault((r.env, r.method), {})[int(r.seed)] = iterations_to_threshold(
          r.success, window=threshold_window(r.env))
  out = []
  for env in dict.fromkeys(r.env for r in results):
    traj, gated = steps.get((env, baseline)), steps.get((env, turn))
    if not traj or not gated or set(traj) != set(gated):
      continue
    seeds = sorted(traj)
    gap = fits.step_gap(np.array([[traj[k] for k in seeds]]), np.array([[gated[k] for k in seeds]]))
    kwargs = SETTINGS[env].env_kwargs
    out.append({"env": env, "rho": kwargs["num_decisions"] / kwargs["horizon"],
                "num_seeds": len(seeds), "median_" + baseline: float(gap.median_traj[0]),
                "median_" + turn: float(gap.median_turn[0]), "gap": float(gap.gap[0]),
                "p_value": float(gap.p_value[0])})
  return out


def first_gradient_parts(results: Sequence[RunResult], baseline: str = "grpo",
                         turn: str = "grpo_oracle_turn") -> list[dict[str, Any]]:
  """How much of the first update's gradient the routine turns make, per setting.

  Both methods' first update is on the same batch (same seed, same first samples), and the gate
  only removes the routine turns' terms, so per seed the routine part is
  √(max(‖g_all‖² − ‖g_gated‖², 0)) (treating the two parts as orthogonal). Returns, for each
  setting with recorded gradient norms of both methods on common seeds, the means over seeds of
  ‖g_all‖, ‖g_gated‖ and that routine part.
  """
  norms: dict[tuple[str, str], dict[int, float]] = {}
  for r in results:
    if r.method in (baseline, turn) and r.grad_norm is not None:
      norms.setdefault((r.env, r.method), {})[int(r.seed)] = float(np.asarray(r.grad_norm)[0])
  out = []
  for env in dict.fromkeys(r.env for r in results):
    every, gated = norms.get((env, baseline), {}), norms.get((env, turn), {})
    seeds = sorted(set(every) & set(gated))
    if not seeds:
      continue
    a, g = np.array([every[k] for k in seeds]), np.array([gated[k] for k in seeds])
    out.append({"env": env, "num_seeds": len(seeds), "every_turn": float(a.mean()),
                "gated": float(g.mean()),
                "routine": float(np.sqrt(np.maximum(a ** 2 - g ** 2, 0.0)).mean())})
  return out


def _read_result(path: str) -> RunResult:
  with open(path, encoding="utf-8") as f:
    return result_from_record(json.load(f))


def summarize(results: Sequence[RunResult]) -> list[Summary]:
  """Groups runs by (method, env), in first-seen order, and reduces over seeds.

  "Late" values average each run's last quarter of iterations (at least one) before the
  across-seed mean and band.
  """
  groups: dict[tuple[str, str], list[RunResult]] = {}
  for result in results:
    groups.setdefault((result.method, result.env), []).append(result)
  summaries = []
  for (method, env), runs in groups.items():
    lengths = {r.success.shape[0] for r in runs}
    if len(lengths) != 1:
      raise ValueError(f"{method} on {env}: runs of different lengths {sorted(lengths)}")
    tail = max(lengths.pop() // 4, 1)

    def band(name):
      return fits.mean_confidence_band(np.stack([getattr(r, name) for r in runs]))

    def late(name):
      values = np.array([np.mean(getattr(r, name)[-tail:]) for r in runs])
      return tuple(float(v) for v in fits.mean_confidence_band(values))

    final = np.array([r.eval_success for r in runs])
    mean_train = np.array([run_statistic(r, "mean_train_success") for r in runs])
    steps = np.array([run_statistic(r, "iterations_to_threshold") for r in runs])
    summaries.append(Summary(
        method=method, env=env, num_seeds=len(runs),
        success=band("success"), repeated_action_rate=band("repeated_action_rate"),
        invalid_action_rate=band("invalid_action_rate"),
        final_eval_success=tuple(float(v) for v in fits.mean_confidence_band(final)),
        mean_train_success=tuple(float(v) for v in fits.mean_confidence_band(mean_train)),
        iterations_to_threshold=tuple(float(v) for v in fits.mean_confidence_band(steps)),
        late_train_success=late("success"),
        late_repeated_action_rate=late("repeated_action_rate"),
        late_invalid_action_rate=late("invalid_action_rate")))
  return summaries


def results_table(summaries: Sequence[Summary]) -> str:
  """A Markdown table: one row per (env, method), mean ± 95% half-width over seeds."""

  def cell(triple):
    mean, low, high = triple
    return f"{mean:.3f}" if not np.isfinite(high - low) else f"{mean:.3f} ± {(high - low) / 2:.3f}"

  lines = ["| env | method | seeds | held-out greedy success | train success (mean over the run) | "
           f"iterations to train success ≥ {SUCCESS_THRESHOLD} | train success (last 25%) | "
           "repeated-action rate | invalid-action rate |",
           "|---|---|---|---|---|---|---|---|---|"]
  for s in sorted(summaries, key=lambda s: s.env):
    lines.append(f"| {s.env} | {s.method} | {s.num_seeds} | {cell(s.final_eval_success)} | "
                 f"{cell(s.mean_train_success)} | {cell(s.iterations_to_threshold)} | "
                 f"{cell(s.late_train_success)} | {cell(s.late_repeated_action_rate)} | "
                 f"{cell(s.late_invalid_action_rate)} |")
  return "\n".join(lines)


class Comparison(NamedTuple):
  """One method against GRPO on one setting and one per-run statistic (see `STATISTICS`), over
  seeds: the one-sided Mann–Whitney test of "this method does better" (`p_value`), and the
  one-sided Wilcoxon signed-rank test of the same over the runs paired by seed
  (`paired_p_value`): runs of one seed start from the same policy and play the same first
  batch, so the seed is shared variation the paired test removes."""

  method: str
  env: str
  statistic: str
  num_seeds: int
  difference: float  # the method's mean statistic minus GRPO's
  p_value: float
  paired_p_value: float  # NaN without a seed in common


# Per-run statistics a method is compared on, and the Mann–Whitney alternative that means "better".
# DD-Chain's targets are one fixed task, so its greedy held-out success is 0 or 1 per run and says
# little once every method solves it; the speed of learning is what turn-level credit claims.
STATISTICS: Mapping[str, str] = MappingProxyType({
    "final_eval_success": "greater",       # held-out greedy success at the end
    "mean_train_success": "greater",       # area under the training-success curve
    "iterations_to_threshold": "less",     # first iteration with training success >= threshold
})
SUCCESS_THRESHOLD = 0.9
# Training success is judged over at least this many episodes: one iteration of a 64-episode
# batch, several of a small one (at 8 episodes, 0.9 would mean 8 of 8 in one lucky batch).
THRESHOLD_EPISODES = 64


def threshold_window(setting: str) -> int:
  """Iterations whose episodes make up `THRESHOLD_EPISODES` on `setting`: 1 but on the
  small-batch chains."""
  if setting not in SMALL_BATCHES:
    return 1
  tasks, group, _ = SMALL_BATCHES[setting]
  return -(-THRESHOLD_EPISODES // (tasks * group))


def iterations_to_threshold(success: np.ndarray, threshold: float = SUCCESS_THRESHOLD,
                            window: int = 1) -> int:
  """First iteration (1-based) from which the mean training success of `window` iterations is
  >= `threshold` (only windows inside the run count); `len(success) + 1` when none is (a
  censored run ranks behind every run that got there). The window looks forward, so it marks
  when the policy got there, not when enough evidence had piled up."""
  success = np.asarray(success, np.float64)
  if success.ndim != 1 or success.size == 0:
    raise ValueError(f"success must be a non-empty curve [num_iterations], got {success.shape}")
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  means = np.convolve(success, np.ones(window) / window, mode="valid")
  # A window mean equal to the threshold can round just below it (e.g. (0.8 + 1.0) / 2).
  hits = np.flatnonzero(means >= threshold - 1e-9)
  return int(hits[0]) + 1 if hits.size else success.size + 1


def run_statistic(result: RunResult, statistic: str) -> float:
  """One run's value of a `STATISTICS` entry."""
  if statistic == "final_eval_success":
    return float(result.eval_success)
  if statistic == "mean_train_success":
    return float(np.mean(result.success))
  if statistic == "iterations_to_threshold":
    return float(iterations_to_threshold(result.success, window=threshold_window(result.env)))
  raise ValueError(f"unknown statistic {statistic!r}; known: {sorted(STATISTICS)}")


def against_baseline(results: Sequence[RunResult], baseline: str = "grpo",
                     statistic: str = "final_eval_success") -> list[Comparison]:
  """Every (method, setting) with runs of `baseline` on the same setting, in first-seen order."""
  if statistic not in STATISTICS:
    raise ValueError(f"unknown statistic {statistic!r}; known: {sorted(STATISTICS)}")
  values: dict[tuple[str, str], dict[int, float]] = {}
  for r in results:
    values.setdefault((r.method, r.env), {})[int(r.seed)] = run_statistic(r, statistic)
  alternative = STATISTICS[statistic]
  out = []
  for (method, env), own in values.items():
    base = values.get((baseline, env))
    if method == baseline or not base:
      continue
    test = fits.mann_whitney_u(np.asarray(list(own.values())), np.asarray(list(base.values())),
                               alternative=alternative)
    seeds = sorted(set(own) & set(base))
    paired = (fits.wilcoxon_signed_rank([own[k] for k in seeds], [base[k] for k in seeds],
                                        alternative=alternative).p_value if seeds else math.nan)
    out.append(Comparison(method=method, env=env, statistic=statistic, num_seeds=len(own),
                          difference=float(np.mean(list(own.values()))
                                           - np.mean(list(base.values()))),
                          p_value=float(test.p_value), paired_p_value=float(paired)))
  return out
