"""Typed, validated hyperparameters of a training run (bound from gin by `experiments/run.py`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

from agentrl_jax import config_errors


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
  """What is trained on, for how long, and how the credit is assigned.

  Attributes:
    env_name, env_kwargs: the registered environment and its constructor arguments.
    seed: run seed (parameters, sampling keys).
    init_seed: the seed of the initial weights and of the warm start's demonstration noise;
      None: `seed`. Fixing it while `seed` varies trains several RL seeds from one starting
      policy (one clone), so the seeds' spread after RL is RL's own, not the clones'.
    num_iterations: RL iterations (collect → score → update).
    tasks_per_iteration: distinct tasks (episode seeds) per iteration.
    group_size: episodes per task; a task's episodes form one group (GRPO-style baselines).
    estimator: the advantage estimator: a function from `advantages/estimators.py` (or one of
      the same signature) with its hyperparameters bound (`@estimators.gigpo` in gin, binding
      `estimators.gigpo.<name>`; `functools.partial` in Python), or a registry name for its
      defaults.
    use_critic: train a separate critic (needed by critic-based estimators such as 'gae').
    decision_density_threshold: log `credit/decision_density`, the batch's share of turns whose
      action moves the group's mean return-to-go by more than this (`density.
      batch_decision_density`, no critic needed); None: not computed.
    critic_init: 'random' (the critic's own initialisation) or 'policy': a copy of the policy's
      trunk with a zero value head (T1's warm start), taken at the start and again after the
      behaviour-cloning warm start, so the critic starts from what the cloned policy learned.
    restrict_to_action_words: sample only the env's action words, one token each
      (constrained decoding; the learner uses the same restriction).
    example_turns: with a chat model (`init_from` a GGUF file), show every episode this many
      turns of the env's scripted expert on the task `example_seed` as user/assistant messages
      after the system message, so the model sees the reply format once (few-shot prompting;
      `conversation.expert_exchanges`); 0: none.
    example_seed: the example's task; the default sits below the held-out seeds
      (`EvalConfig.seed_offset`) and above the warm start's demonstrations.
    checkpoint_every: save a checkpoint every this many iterations (and at the end).
    log_every: write metrics every this many iterations.
    max_staleness: 0 plays each batch with the current policy (synchronous); 1 plays batch k+1
      while batch k trains, with the policy from before that update (one update stale). Use it
      with `LossConfig.tis_cap`, which corrects for the lag. A resumed pipelined run replays its
      first batch synchronously, so it is not bit-identical to an uninterrupted one.
  """

  env_name: str = "frozenlake"
  env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  seed: int = 0
  init_seed: int | None = None
  num_iterations: int = 100
  tasks_per_iteration: int = 16
  group_size: int = 8
  estimator: str | Callable[..., Any] = "grpo"
  use_critic: bool = False
  critic_init: Literal["random", "policy"] = "random"
  decision_density_threshold: float | None = None
  restrict_to_action_words: bool = True
  example_turns: int = 0
  example_seed: int = 999_999_999
  checkpoint_every: int = 25
  log_every: int = 1
  max_staleness: int = 0

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.max_staleness not in (0, 1):
      raise ValueError(f"TrainConfig.max_staleness must be 0 (synchronous) or 1 (one batch "
                       f"ahead), got {self.max_staleness}")
    for name in ("num_iterations", "tasks_per_iteration", "group_size", "checkpoint_every", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.num_iterations < 0:
      raise ValueError(f"TrainConfig.num_iterations must be >= 0, got {self.num_iterations}")
    if self.example_turns < 0:
      raise ValueError(f"TrainConfig.example_turns must be >= 0, got {self.example_turns}")
    if self.init_seed is not None and self.init_seed < 0:
      raise ValueError(f"TrainConfig.init_seed must be >= 0 or None (the run's seed), got "
                       f"{self.init_seed}")

  @property
  def batch_size(self) -> int:
    return self.tasks_per_iteration * self.group_size

  @property
  def weights_seed(self) -> int:
    """The seed the initial weights and the warm start's demonstrations are drawn from."""
    return self.seed if self.init_seed is None else self.init_seed


OPTIMIZERS = ("adamw", "sgd")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OptimConfig:
  """AdamW (or SGD) with global-norm clipping and a linear decay from `learning_rate` to
  `end_learning_rate`.

  `optimizer = 'sgd'` is SGD with momentum `b1` (0 for none; `b2` and `first_moment_dtype` unused):
  for studies of what Adam's per-parameter scaling does to credit assignment. The clip makes it
  normalised SGD only on steps whose gradient norm exceeds `max_grad_norm`.
  """

  optimizer: str = "adamw"
  learning_rate: float = 1e-3
  end_learning_rate: float | None = None
  warmup_steps: int = 0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.99
  max_grad_norm: float = 1.0
  # Adam's first moment in bfloat16 halves its memory (a quarter of the optimizer's state, e.g.
  # 0.27 GB for a 135M model); the second moment stays float32, where bf16's 8-bit mantissa
  # would distort the per-parameter step size.
  first_moment_dtype: str = "float32"

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"OptimConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
    if not 0 <= self.b1 < 1:
      raise ValueError(f"OptimConfig.b1 must be in [0, 1), got {self.b1}")
    if self.first_moment_dtype not in ("float32", "bfloat16"):
      raise ValueError(f"OptimConfig.first_moment_dtype must be 'float32' or 'bfloat16', got "
                       f"{self.first_moment_dtype!r}")
    if self.learning_rate <= 0:
      raise ValueError(f"OptimConfig.learning_rate must be > 0, got {self.learning_rate}")
    if self.end_learning_rate is not None and self.end_learning_rate < 0:
      raise ValueError(f"OptimConfig.end_learning_rate must be >= 0, got {self.end_learning_rate}")
    if self.max_grad_norm <= 0:
      raise ValueError(f"OptimConfig.max_grad_norm must be > 0, got {self.max_grad_norm}")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WarmStartConfig:
  """Behaviour cloning on scripted demonstrations before RL (0 iterations = start from random init).

  Attributes:
    iterations: SFT iterations, each on a fresh batch of demonstrations.
    episodes_per_iteration: demonstration episodes per SFT iteration.
    expert_noise: probability that a demonstrated action is replaced by a random one, so the
      demonstrations visit the states a learner's mistakes lead to.
    learning_rate: constant SFT learning rate.
    micro_batches: slices of the demonstration batch whose gradients are accumulated one at a
      time (the step is the whole batch's; peak memory is one slice's activations).
    temperature: the softmax temperature of the distribution cloned. None: the sampler's, so
      the clone fits the tempered policy that RL samples (sampling at 0.5 after such a clone
      draws about what sampling at 1 after an untempered one draws). 1.0: the model's own
      softmax, as SFT before RL usually is, so a lower sampling temperature in RL samples a
      sharper policy than the one cloned. Greedy actions are the same either way.
    env_kwargs: constructor arguments that override TrainConfig.env_kwargs for the
      demonstrations only (e.g. SFT on a few search corpora, RL on many).
    reuse_dir: a local directory of finished clones (`learner.clone_store`): a run whose clone
      is saved there (same warm-start settings, initial weights and first demonstrations)
      loads it instead of cloning again, and a run whose clone is not saves it there. For
      several RL seeds from one clone (`TrainConfig.init_seed`). None: always clone.
  """

  iterations: int = 0
  episodes_per_iteration: int = 128
  expert_noise: float = 0.3
  learning_rate: float = 1e-3
  micro_batches: int = 1
  temperature: float | None = None
  env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  reuse_dir: str | None = None

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.iterations < 0 or self.episodes_per_iteration < 1:
      raise ValueError(f"WarmStartConfig: iterations >= 0 and episodes_per_iteration >= 1, got "
                       f"{self.iterations}, {self.episodes_per_iteration}")
    if not 0 <= self.expert_noise <= 1:
      raise ValueError(f"WarmStartConfig.expert_noise must be in [0, 1], got {self.expert_noise}")
    if self.temperature is not None and not self.temperature > 0:
      raise ValueError(f"WarmStartConfig.temperature must be > 0 or None (the sampler's), got "
                       f"{self.temperature}")
    if self.micro_batches < 1 or self.episodes_per_iteration % self.micro_batches:
      raise ValueError(f"WarmStartConfig.micro_batches must be >= 1 and divide "
                       f"episodes_per_iteration={self.episodes_per_iteration}, got "
                       f"{self.micro_batches}")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EvalConfig:
  """Held-out evaluation: greedy success on `num_tasks` unseen seeds and sampled pass@k.

  Attributes:
    every: evaluate every this many iterations (also before training and at the end).
    num_tasks: held-out tasks for greedy success.
    pass_k, pass_k_tasks: sampled attempts per task, and how many tasks, for pass@k (0 = off).
    seed_offset: first held-out seed; training seeds stay below it.
    env_kwargs: constructor arguments that override TrainConfig.env_kwargs for evaluation only
      (e.g. {'fold': 'dev'} where an engine keeps its own held-out games).
    batch_size: episodes played at once (None: a process's whole share). The KV cache is
      batch x capacity, so a large model evaluates in batches; the figures do not depend on it
      (each episode keeps its global row's sampling key).
    before: evaluate before any training. Off where that figure is already known and a large
      model's evaluation is the dearest part of a run.
  """

  every: int = 50
  num_tasks: int = 200
  pass_k: int = 4
  pass_k_tasks: int = 32
  seed_offset: int = 1_000_000_000
  env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
  batch_size: int | None = None
  before: bool = True

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.batch_size is not None and self.batch_size < 1:
      raise ValueError(f"EvalConfig.batch_size must be >= 1 or None, got {self.batch_size}")
    if self.every < 1 or self.num_tasks < 1 or self.pass_k < 0 or self.pass_k_tasks < 0:
      raise ValueError(f"EvalConfig: invalid sizes every={self.every}, num_tasks={self.num_tasks}, "
                       f"pass_k={self.pass_k}, pass_k_tasks={self.pass_k_tasks}")
