"""Host-side multi-turn rollout loop: steps a batch of text envs turn by turn.

Each turn: every live env's new observation is tokenized once on arrival and appended to its
conversation; one jitted call prefills those tokens into the per-row KV cache and samples the
actions; each action is cut on the host at its first stop string and at the trajectory's token
budget (the cache is rolled back to the kept tokens); the kept ids are written to the trajectory
exactly as drawn (TITO), decoded to text, and sent to the envs. A context-window policy
(`rollout/context.py`) masks old turns through per-turn attention floors, recorded for the
learner. The result is one `Trajectories` with static shapes.

With a thinking intervention (`SamplingConfig.thinking`) the close tokens it forced stay in the
conversation and the action span but out of `action_mask` (the policy did not sample them), and
the env sees the action without its thinking blocks.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import jax
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.envs import base as envs_base
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import context as context_lib
from agentrl_jax.rollout import low_precision
from agentrl_jax.rollout import conversation as conversation_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers as workers_lib


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RolloutConfig:
  """Static shapes and budgets of a rollout.

  Attributes:
    max_turns: N, turn slots per trajectory (the env's own step cap should not exceed it).
    max_len: L, token budget per trajectory; a conversation that would overflow it is ended as
      truncated (done, not successful).
    obs_buckets: chunk lengths an observation is padded to, so the sampler compiles once per bucket.
    length_buckets: lengths a finished batch is trimmed to (the smallest that holds its longest
      conversation), so the learner compiles once per bucket instead of always paying for
      `max_len`. Empty = always `max_len`.
    sampling: how actions are drawn.
    workers: how envs are stepped (threads, per-step timeout).
    max_trajectory_action_tokens: action tokens one trajectory may sample over all its turns
      (0 = no limit). A turn is cut to what is left; a trajectory that spends it all and is
      not ended by its env is ended as truncated (done, not successful).
    context: the context-window policy; anything but 'full' records the per-turn floors in
      `traj.extras['context_floor']` for the learner (`context.floor_per_token`).
    cache_windows: ascending cache sizes a turn may be run in: each turn reads and writes only
      the smallest window that holds every live row's conversation plus the turn (`sample_turn`
      `window`), so short conversations do not pay for the whole cache. Each window is one more
      compile per observation bucket. Empty = always the whole cache.
    grow_cache: the KV cache starts at 64 slots and grows (copied once) whenever a turn would
      outgrow it, through `sampler.cache_sizes` up to `cache_capacity`, so a turn's attention
      reads about the conversation so far rather than the whole capacity, with the same
      samples; each size is one more compile per observation bucket, so it pays for long
      conversations and long runs, not short ones. False (the default): one cache of
      `cache_capacity` from the first turn, one compile.
    cache_steps_per_doubling: sizes of the growing cache per doubling: 2 (each about √2 times
      the last; 8 sizes up to 672 slots) or 1 (doubling: 5 sizes, fewer compiles, up to twice
      the slots a turn needs).
    sampling_dtype: None (the default): the sampler runs the policy's parameters as they are,
      so the learner's log-probs equal the sampler's. 'bfloat16': it runs a bfloat16 copy, cast
      once per rollout, with a bfloat16 KV cache (`rollout/low_precision.py`: about half the
      weight reads of a decode step); the learner still trains the float32 policy, and
      `LossConfig.tis_cap` corrects for the gap. Plain `RolloutRunner.collect` only (the
      rollout strategies reject it); held-out evaluation stays in the policy's own precision.
  """

  max_turns: int = 10
  max_len: int = 384
  obs_buckets: tuple[int, ...] = (48, 96, 192)
  length_buckets: tuple[int, ...] = ()
  sampling: sampler_lib.SamplingConfig = sampler_lib.SamplingConfig()
  workers: workers_lib.WorkerConfig = workers_lib.WorkerConfig()
  max_trajectory_action_tokens: int = 0
  context: context_lib.ContextConfig = context_lib.ContextConfig()
  cache_windows: tuple[int, ...] = ()
  grow_cache: bool = False
  cache_steps_per_doubling: int = 2
  sampling_dtype: str | None = None

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.max_turns <= 0 or self.max_len <= 0:
      raise ValueError(f"RolloutConfig: max_turns and max_len must be positive, got "
                       f"{self.max_turns}, {self.max_len}")
    if not self.obs_buckets or list(self.obs_buckets) != sorted(self.obs_buckets):
      raise ValueError(f"RolloutConfig.obs_buckets must be non-empty and ascending, got {self.obs_buckets}")
    if list(self.length_buckets) != sorted(self.length_buckets) or any(
        not 0 < n <= self.max_len for n in self.length_buckets):
      raise ValueError(f"RolloutConfig.length_buckets must be ascending and within max_len="
                       f"{self.max_len}, got {self.length_buckets}")
    if self.max_trajectory_action_tokens < 0:
      raise ValueError(f"RolloutConfig.max_trajectory_action_tokens must be >= 0, got "
                       f"{self.max_trajectory_action_tokens}")
    if list(self.cache_windows) != sorted(set(self.cache_windows)) or any(
        w <= 0 for w in self.cache_windows):
      raise ValueError(f"RolloutConfig.cache_windows must be positive and strictly ascending, got "
                       f"{self.cache_windows}")
    if self.cache_steps_per_doubling < 1:
      raise ValueError(f"RolloutConfig.cache_steps_per_doubling must be >= 1, got "
                       f"{self.cache_steps_per_doubling}")
    low_precision.check_sampling_dtype(self.sampling_dtype)
    turn_size = self.obs_buckets[-1] + self.sampling.max_action_tokens
    if self.context.policy == "truncate_oldest" and self.context.max_context_tokens < turn_size:
      raise ValueError(
          f"RolloutConfig.context.max_context_tokens={self.context.max_context_tokens} cannot hold "
          f"one turn (largest observation bucket + max_action_tokens = {turn_size})")

  def trimmed_length(self, used: int) -> int:
    """The bucket a batch whose longest conversation has `used` tokens is trimmed to."""
    for size in self.length_buckets:
      if used <= size:
        return size
    return self.max_len

  @property
  def cache_capacity(self) -> int:
    # Headroom of one full chunk: a padded chunk written at the end of a full row must not clamp.
    return self.max_len + self.obs_buckets[-1] + self.sampling.max_action_tokens


@dataclasses.dataclass
class RolloutStats:
  """Host-side counters of one rollout."""

  episodes: int = 0
  turns: int = 0
  sampled_tokens: int = 0
  env_errors: int = 0
  env_timeouts: int = 0
  invalid_actions: int = 0
  truncated: int = 0
  budget_truncated: int = 0
  stop_string_cuts: int = 0
  seconds: float = 0.0
  # The faults themselves (`workers.StepFault`), so a run whose env fails every step can stop
  # with the env's own error (`registry.check_env_faults`); not a metric.
  faults: list = dataclasses.field(default_factory=list)

  def as_metrics(self, prefix: str = "rollout/") -> dict[str, float]:
    secs = max(self.seconds, 1e-9)
    return {
        f"{prefix}episodes": self.episodes, f"{prefix}turns": self.turns,
        f"{prefix}env_errors": self.env_errors, f"{prefix}env_timeouts": self.env_timeouts,
        f"{prefix}invalid_action_rate":
            self.invalid_actions / max(self.turns, 1),
        f"{prefix}truncated": self.truncated, f"{prefix}budget_truncated": self.budget_truncated,
        f"{prefix}stop_string_rate": self.stop_string_cuts / max(self.turns, 1),
        f"{prefix}action_tokens_per_turn": self.sampled_tokens / max(self.turns, 1),
        f"{prefix}tokens_per_s": self.sampled_tokens / secs,
        f"{prefix}turns_per_s": self.turns / secs, f"{prefix}seconds": self.seconds,
    }


# An actor maps (env, turn) to an action text; used for scripted demonstrations.
ScriptedActor = Callable[[envs_base.TextEnv, np.random.Generator], str]


def noisy_expert(noise: float) -> ScriptedActor:
  """The env's expert action, replaced by a uniformly random valid action with prob. `noise`
  (`env.random_action`; envs without one get the expert's)."""

  def act(env: envs_base.TextEnv, rng: np.random.Generator) -> str:
    if noise > 0 and env.has_random_actions and rng.random() < noise:
      action = env.random_action(rng)
      if action is not None:
        return action
    return env.expert_action()

  return act


# Info keys with a dedicated place in the contract; every other bool/number per-step key goes to
# `traj.extras[key]` as a [B, N] float32 array (e.g. search_turn, sql_score) for the methods that
# read them.
_CONTRACT_INFO_KEYS = frozenset({"action_valid", "success", "sub_outcomes"})


def _scalar_info(info: dict, prefix: str = ""):
  """(key, float) for every bool/number in `info`; nested dicts flatten to 'outer.inner'."""
  for key, value in info.items():
    if not prefix and key in _CONTRACT_INFO_KEYS:
      continue
    if isinstance(value, dict):
      yield from _scalar_info(value, f"{prefix}{key}.")
    elif not isinstance(value, str) and np.isscalar(value):
      yield f"{prefix}{key}", float(value)


def record_step_info(traj: types.Trajectories, info: dict, row: int, turn: int) -> None:
  """Writes every bool/number of a step's `info` (outside the contract's own fields) to
  `traj.extras[key][row, turn]`; shared by the loop and the rollout strategies."""
  for key, value in _scalar_info(info):
    if key not in traj.extras:
      traj.extras[key] = np.zeros(traj.reward.shape, np.float32)
    traj.extras[key][row, turn] = value


def trim_tokens(traj: types.Trajectories, length: int) -> types.Trajectories:
  """Drops token columns from `length` on (they must be padding)."""
  cut = lambda x: x[:, :length]
  extras = dict(traj.extras)
  if extra_keys.ROUTING_KEY in extras:
    extras[extra_keys.ROUTING_KEY] = cut(extras[extra_keys.ROUTING_KEY])
  return traj.replace(tokens=cut(traj.tokens), action_mask=cut(traj.action_mask),
                      turn_of_token=cut(traj.turn_of_token), sample_logprob=cut(traj.sample_logprob),
                      extras=extras)


def bucket(n: int, buckets: Sequence[int]) -> int:
  """The smallest observation bucket that holds `n` tokens."""
  for size in buckets:
    if n <= size:
      return size
  raise ValueError(f"observation of {n} tokens exceeds the largest bucket {buckets[-1]}; "
                   f"raise RolloutConfig.obs_buckets")


def chunk_arrays(chunks: Sequence[Sequence[int]], buckets: Sequence[int]
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Observation chunks padded to one bucket width `[B, W]`, and their lengths `[B]`."""
  width = bucket(max(1, max(len(c) for c in chunks)), buckets)
  obs = np.zeros((len(chunks), width), np.int32)
  obs_len = np.zeros((len(chunks),), np.int32)
  for i, ids in enumerate(chunks):
    obs[i, :len(ids)] = ids
    obs_len[i] = len(ids)
  return obs, obs_len


def observation_fits(config: RolloutConfig, cursor: int, ids: Sequence[int]) -> bool:
  """Whether an observation of `ids` at `cursor`, plus a whole action, fits the row and a bucket."""
  return (cursor + len(ids) + config.sampling.max_action_tokens <= config.max_len
          and len(ids) <= config.obs_buckets[-1])


def end_truncated(traj: types.Trajectories, row: int, turn: int, stats: RolloutStats) -> None:
  """Ends a row cut off before turn `turn` (no room): its last played turn is its last."""
  stats.truncated += 1
  if turn > 0:
    traj.done[row, turn - 1] = True


def write_observation(traj: types.Trajectories, row: int, ids: Sequence[int], cursor: int,
                      turn: int) -> int:
  """Writes turn `turn`'s observation tokens of `row` at `cursor`; returns the new cursor."""
  traj.tokens[row, cursor:cursor + len(ids)] = ids
  traj.turn_of_token[row, cursor:cursor + len(ids)] = turn
  return cursor + len(ids)


def write_action(traj: types.Trajectories, row: int, ids: Sequence[int], logprobs: Sequence[float],
                 cursor: int, turn: int, stats: RolloutStats,
                 forced: Sequence[bool] | None = None) -> int:
  """Writes turn `turn`'s action tokens of `row` with their sampler log-probs (TITO).

  `forced` marks tokens written, not sampled (a thinking close): context for the learner, never
  a sample, so they stay out of `action_mask`. Returns the new cursor.
  """
  n = len(ids)
  traj.tokens[row, cursor:cursor + n] = ids
  traj.action_mask[row, cursor:cursor + n] = (
      True if forced is None else ~np.asarray(forced, bool))
  traj.turn_of_token[row, cursor:cursor + n] = turn
  traj.sample_logprob[row, cursor:cursor + n] = logprobs
  traj.turn_start[row, turn] = cursor
  traj.turn_end[row, turn] = cursor + n
  stats.sampled_tokens += n
  return cursor + n


def record_step(traj: types.Trajectories, row: int, result, turn: int,
                stats: RolloutStats) -> bool:
  """Writes one env step's outcome (a `StepResult` or a `StepFault`) into `row`.

  Returns whether the row plays on: False once the episode is done, or when the env faulted (a
  faulted env ends only its own trajectory, which is excluded from the loss downstream).
  """
  stats.turns += 1
  if isinstance(result, workers_lib.StepFault):
    stats.faults.append(result)
    traj.env_error[row, turn] = True
    traj.done[row, turn] = True
    stats.env_errors += 1
    stats.env_timeouts += int(result.kind == "timeout")
    return False
  valid = bool(result.info.get("action_valid", True))
  stats.invalid_actions += int(not valid)
  traj.reward[row, turn] = result.reward
  traj.action_valid[row, turn] = valid
  traj.obs_hash[row, turn] = envs_base.observation_hash(result.observation)
  record_step_info(traj, result.info, row, turn)
  traj.outcome[row] += result.reward
  if not result.done:
    return True
  traj.done[row, turn] = True
  traj.success[row] = bool(result.info.get("success", False))
  for name, value in result.info.get("sub_outcomes", {}).items():
    traj.sub_outcomes.setdefault(name, np.zeros(traj.reward.shape[0], np.float32))[row] = value
  return False


def env_instructions(env) -> str:
  """The env's rules for a system message; "" for an env (or a worker handle) without them."""
  return getattr(env, "instructions", "") or ""


def last_token(traj: types.Trajectories, row: int, cursor: int) -> int | None:
  """The last id of `row`'s conversation before `cursor`, or None when it is empty."""
  return int(traj.tokens[row, cursor - 1]) if cursor > 0 else None


def _with_stop_tokens(config: RolloutConfig, stop_ids: Sequence[int]) -> RolloutConfig:
  """`config` whose sampling also stops at `stop_ids` (placed first; already present: kept)."""
  have = tuple(config.sampling.stop_token_ids)
  merged = tuple(stop_ids) + tuple(i for i in have if i not in stop_ids)
  if merged == have:
    return config
  return dataclasses.replace(config, sampling=dataclasses.replace(config.sampling,
                                                                  stop_token_ids=merged))


class RolloutRunner:
  """Collects batches of trajectories from text envs with a policy or a scripted actor."""

  def __init__(self, graphdef, model_config: transformer.TransformerConfig,
               tokenizer: tokenizer_lib.Tokenizer, config: RolloutConfig,
               conversation: conversation_lib.Conversation | None = None):
    """Builds the runner and its jitted sampler.

    Args:
      graphdef: the policy's module structure.
      model_config: the policy's architecture.
      tokenizer: exact `encode`/`decode` of the policy's vocabulary.
      config: shapes and sampling; the conversation's stop tokens are added to its sampling's
        (first, so a scripted action ends with the conversation's own end token).
      conversation: how observations are framed; default `ObsActConversation(tokenizer)`.
    """
    self.conversation = conversation or conversation_lib.ObsActConversation(tokenizer)
    config = _with_stop_tokens(config, self.conversation.stop_token_ids)
    self.config = config
    self.tokenizer = tokenizer
    self.model_config = model_config
    self.graphdef = graphdef  # public: strategies build their own jitted pieces from it
    sampler_lib.check_thinking(config.sampling.thinking, model_config.vocab_size)
    # What the sampler runs: the policy itself, or its low-precision twin (sampling_dtype).
    self._sampling_graphdef, self._sampling_model = low_precision.sampling_model(
        graphdef, model_config, config.sampling_dtype)
    self._sample_turn = sampler_lib.make_turn_sampler(self._sampling_graphdef, config.sampling,
                                                      model_config.vocab_size)
    self._stop_ids = set(config.sampling.stop_token_ids)
    self._stepper = workers_lib.EnvStepper(config.workers)

  def make_env(self, factory: workers_lib.EnvFactory, **kwargs):
    """An env stepped by this runner's workers: a local env, or with `WorkerConfig(kind=
    'process')` a handle to one built in a worker process (factory: registry name or callable)."""
    return self._stepper.make_env(factory, **kwargs)

  def close(self) -> None:
    """Stops the env workers (threads are abandoned, processes are ended)."""
    self._stepper.close()

  def observation_tokens(self, text: str, *, turn: int = 0, instructions: str = "",
                         last_token: int | None = None) -> list[int]:
    """The chunk an observation becomes (`Conversation.observation`; <|obs|> text <|act|> by
    default, where the other arguments do not matter).

    Args:
      text: the observation.
      turn: the turn it opens.
      instructions: the env's rules (`TextEnv.instructions`), for the system message.
      last_token: the row's last id so far (None at turn 0).
    """
    return self.conversation.observation(text, turn=turn, instructions=instructions,
                                         last_token=last_token)

  def action_text(self, ids: Sequence[int]) -> str:
    """The text the env receives: the action without stop tokens and thinking blocks."""
    ids = sampler_lib.outside_thinking(ids, self.config.sampling.thinking)
    return self.tokenizer.decode([i for i in ids if i not in self._stop_ids])

  def collect(self, envs: Sequence[envs_base.TextEnv], seeds: Sequence[int],
              group_ids: Sequence[int], *, params=None, rng: jax.Array | None = None,
              actor: ScriptedActor | None = None,
              actor_rng: np.random.Generator | Sequence[np.random.Generator] | None = None,
              row_ids: Sequence[int] | None = None) -> tuple[types.Trajectories, RolloutStats]:
    """Plays one episode per env and returns them as a batch.

    Args:
      envs: B environments (reset here with `seeds`).
      seeds: B episode seeds.
      group_ids: B group ids in [0, B) (same task and seed => same group).
      params, rng: the policy parameters and sampling key (policy rollout).
      actor, actor_rng: a scripted actor instead of the policy (demonstrations); `actor_rng` is
        one generator for all rows or one per row.
      row_ids: B global row ids that seed each row's sampling (default 0..B-1). A host that plays
        rows 64..127 of a global batch passes those ids and samples what one host would.
    """
    if (params is None) == (actor is None):
      raise ValueError("collect: pass exactly one of `params` (policy) or `actor` (scripted)")
    cfg = self.config
    b = len(envs)
    if not len(seeds) == len(group_ids) == b:
      raise ValueError(f"collect: {b} envs, {len(seeds)} seeds, {len(group_ids)} group ids")
    start_time = time.perf_counter()
    traj = types.empty_trajectories(b, cfg.max_len, cfg.max_turns)
    traj.group_id[:] = np.asarray(group_ids, np.int32)
    stats = RolloutStats(episodes=b)
    observations: list[str | None] = [None] * b
    traj.extras[extra_keys.INITIAL_OBS_HASH_KEY] = np.zeros((b,), np.int32)
    for i, (env, seed) in enumerate(zip(envs, seeds)):
      observations[i] = env.reset(int(seed))
      traj.extras[extra_keys.INITIAL_OBS_HASH_KEY][i] = envs_base.observation_hash(observations[i])
    active = np.ones(b, bool)
    cursor = np.zeros(b, np.int32)
    row_ids = np.arange(b, dtype=np.int32) if row_ids is None else np.asarray(row_ids, np.int32)
    if row_ids.shape != (b,):
      raise ValueError(f"collect: {b} envs but row_ids has shape {row_ids.shape}")
    cache = None
    if actor is None:
      kv_dtype = low_precision.cache_dtype(cfg.sampling_dtype)
      if cfg.sampling_dtype is not None:  # cast once here, not in every decode step
        params = low_precision.sampling_params(params, self.model_config)
      if cfg.grow_cache:
        cache = sampler_lib.growing_cache(self._sampling_model, b, cfg.cache_capacity,
                                          cfg.cache_steps_per_doubling, dtype=kv_dtype)
      else:
        cache = transformer.init_cache(self._sampling_model, b, cfg.cache_capacity, kv_dtype)
    turn_open = np.zeros((b, cfg.max_turns), np.int32)  # where each turn's observation starts
    spent = np.zeros(b, np.int32)  # action tokens sampled so far
    if cfg.context.masks:
      traj.extras[extra_keys.FLOOR_KEY] = np.zeros((b, cfg.max_turns), np.float32)
    for turn in range(cfg.max_turns):
      turn_open[:, turn] = cursor
      chunks = self._append_observations(traj, envs, observations, active, cursor, turn, stats)
      if not active.any():
        break
      floor = (self._context_floors(traj, turn_open, cursor, spent, active, turn)
               if cfg.context.masks else None)
      if actor is None:
        actions, cache = self._policy_actions(params, cache, chunks, active, turn,
                                              jax.random.fold_in(rng, turn), row_ids, floor=floor,
                                              history=turn_open[:, turn], traj=traj)
      else:
        actions = self._scripted_actions(envs, actor, actor_rng, active)
      drop = self._cut_actions(actions, active, spent, stats)
      if cache is not None and drop.any():
        cache = sampler_lib.rolled_back(cache, drop)
      self._write_actions(traj, actions, active, cursor, turn, stats)
      spent += traj.turn_end[:, turn] - traj.turn_start[:, turn]
      self._step_envs(envs, traj, actions, observations, active, turn, stats)
      self._end_spent_trajectories(traj, active, spent, turn, stats)
    for i in np.flatnonzero(active):  # still playing at the turn budget: cut off, not a success
      stats.truncated += 1
      traj.done[i, cfg.max_turns - 1] = True
    traj.turn_mask[:] = traj.turn_end > traj.turn_start
    traj = trim_tokens(traj, cfg.trimmed_length(int(cursor.max())))
    stats.seconds = time.perf_counter() - start_time
    return traj, stats

  def _append_observations(self, traj, envs, observations, active, cursor, turn, stats):
    """Tokenizes each live row's observation once and writes it; ends rows that would overflow."""
    chunks: list[list[int]] = [[] for _ in observations]
    for i in np.flatnonzero(active):
      ids = self.observation_tokens(observations[i], turn=turn,
                                    instructions=env_instructions(envs[i]),
                                    last_token=last_token(traj, i, cursor[i]))
      if not observation_fits(self.config, cursor[i], ids):
        active[i] = False
        end_truncated(traj, i, turn, stats)
        continue
      cursor[i] = write_observation(traj, i, ids, cursor[i], turn)
      chunks[i] = ids
    return chunks

  def _action_budget(self, spent: np.ndarray) -> np.ndarray:
    """[B] action tokens each row may sample this turn."""
    cap = self.config.sampling.max_action_tokens
    total = self.config.max_trajectory_action_tokens
    return np.minimum(cap, total - spent) if total else np.full(spent.shape, cap)

  def _context_floors(self, traj, turn_open, cursor, spent, active, turn):
    """[B] context floor of this turn for every live row; recorded for the learner."""
    budget = self._action_budget(spent)
    floor = np.zeros(len(cursor), np.int32)
    for i in np.flatnonzero(active):
      floor[i] = context_lib.turn_floor(self.config.context, turn_open[i, :turn + 1],
                                        int(cursor[i] + budget[i]))
    traj.extras[extra_keys.FLOOR_KEY][:, turn] = floor
    return floor

  def _policy_actions(self, params, cache, chunks, active, turn, key, row_ids, *, floor=None,
                      history=None, traj=None):
    """Samples this turn's actions; `history` [B] is each row's cache length before its chunk.

    With a mixture-of-experts policy and `traj`, the chunk's and the sampled tokens' experts
    are written to `traj.extras[extra_keys.ROUTING_KEY]` (tokens a stop string cuts later sit past the
    kept action, where the next chunk overwrites them or padding ignores them).
    """
    obs, obs_len = chunk_arrays(chunks, self.config.obs_buckets)
    width = obs.shape[1]
    # Every live row's cache holds its conversation before this chunk; the turn adds at most
    # width + max_action_tokens (a padded chunk is written whole).
    window = None
    if history is not None:
      need = int(np.max(np.where(active, history, 0))) + width + self.config.sampling.max_action_tokens
      cache = sampler_lib.fit_cache(cache, need, self.config.cache_capacity,
                                    self.config.cache_steps_per_doubling)
      window = next((w for w in self.config.cache_windows if need <= w < cache.capacity), None)
    out = self._sample_turn(params, cache, obs, obs_len, active, np.int32(turn), key, row_ids,
                            floor=floor, window=window)
    tokens, logprobs, num = jax.device_get((out.tokens, out.logprobs, out.num_tokens))
    forced = np.zeros(tokens.shape, bool) if out.forced is None else jax.device_get(out.forced)
    actions = [(list(tokens[i, :num[i]]), list(logprobs[i, :num[i]]), list(forced[i, :num[i]]))
               for i in range(len(chunks))]
    if out.routing is not None and traj is not None and history is not None:
      self._record_routing(traj, chunks, history, num, *jax.device_get((out.obs_routing, out.routing)))
    return actions, out.cache

  def _record_routing(self, traj, chunks, history, num, obs_routing, routing):
    if extra_keys.ROUTING_KEY not in traj.extras:
      traj.extras[extra_keys.ROUTING_KEY] = np.zeros(traj.tokens.shape + routing.shape[2:], np.int32)
    table = traj.extras[extra_keys.ROUTING_KEY]
    for i, ids in enumerate(chunks):
      if not ids:
        continue
      start = int(history[i])
      table[i, start:start + len(ids)] = obs_routing[i, :len(ids)]
      table[i, start + len(ids):start + len(ids) + num[i]] = routing[i, :num[i]]

  def _scripted_actions(self, envs, actor, actor_rng, active):
    """Tokenized scripted actions, ended by the first stop token the way the policy must end them.

    When every turn opens inside a thinking block, a demonstration first closes it (an empty
    thought), so the env is shown the scripted action rather than nothing.
    """
    sampling = self.config.sampling
    stop = list(sampling.stop_token_ids[:1])
    thinking = sampling.thinking
    opening = [thinking.close_token_id] if thinking is not None and thinking.start_thinking else []
    room = sampling.max_action_tokens - len(stop) - len(opening)
    actions = [([], [], []) for _ in envs]
    for i in np.flatnonzero(active):
      rng = actor_rng if isinstance(actor_rng, np.random.Generator) else actor_rng[i]
      ids = opening + self.tokenizer.encode(actor(envs[i], rng))[:max(room, 0)] + stop
      actions[i] = (ids, [0.0] * len(ids), [False] * len(ids))
    return actions

  def _cut_actions(self, actions, active, spent, stats) -> np.ndarray:
    """Ends each action at its first stop string and at the trajectory's budget, in place.

    Returns [B] how many sampled tokens each row dropped (the cache must forget them).
    """
    stop_strings = self.config.sampling.stop_strings
    budget = self._action_budget(spent)
    drop = np.zeros(len(actions), np.int32)
    for i in np.flatnonzero(active):
      ids, logps, forced = actions[i]
      at_stop = sampler_lib.stop_string_cut(ids, stop_strings, self.action_text)
      stats.stop_string_cuts += int(at_stop < len(ids))
      keep = min(at_stop, int(budget[i]))
      drop[i] = len(ids) - keep
      actions[i] = (ids[:keep], logps[:keep], forced[:keep])
    return drop

  def _end_spent_trajectories(self, traj, active, spent, turn, stats):
    """A trajectory whose action budget is spent and whose env played on is cut off here."""
    total = self.config.max_trajectory_action_tokens
    if not total:
      return
    for i in np.flatnonzero(active & (spent >= total)):
      active[i] = False
      traj.done[i, turn] = True
      stats.truncated += 1
      stats.budget_truncated += 1

  def _write_actions(self, traj, actions, active, cursor, turn, stats):
    thinking = self.config.sampling.thinking is not None
    if thinking and extra_keys.THINK_FORCED_KEY not in traj.extras:
      traj.extras[extra_keys.THINK_FORCED_KEY] = np.zeros(traj.reward.shape, np.float32)
    for i in np.flatnonzero(active):
      ids, logps, forced = actions[i]
      if thinking:
        traj.extras[extra_keys.THINK_FORCED_KEY][i, turn] = float(np.sum(forced))
      cursor[i] = write_action(traj, i, ids, logps, cursor[i], turn, stats, forced=forced)

  def _step_envs(self, envs, traj, actions, observations, active, turn, stats):
    rows = np.flatnonzero(active)
    outcomes = self._stepper.step([envs[i] for i in rows],
                                  [self.action_text(actions[i][0]) for i in rows])
    for i, result in zip(rows, outcomes):
      active[i] = record_step(traj, i, result, turn, stats)
      if active[i]:
        observations[i] = result.observation
