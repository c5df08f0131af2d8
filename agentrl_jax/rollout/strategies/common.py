"""Shared machinery of the rollout strategies: a batch of episodes played turn by turn that can be
forked, re-sampled and merged row by row.

Every strategy (TSR search, T²PO turn resampling, ARPO branching) needs the same few moves beyond
the plain rollout loop: sample a turn again from the same prefix, copy a row (tokens so far, KV
cache, environment) into another slot, and score a turn's tokens. They live here once.

A `RowBatch` holds B rows mid-episode: the trajectory buffers at full `max_len` (so rows can be
copied between batches), the envs, the KV cache and each row's cursor. Moves:

  * `start` resets the envs; `append_observations` tokenizes each live row's new observation once
    (TITO) and keeps it as the row's pending chunk;
  * `sample_turn` samples the turn for chosen rows from a *copy* of the pre-turn cache, so the
    same prefix can be sampled again (the sampler donates its cache argument);
  * `turn_token_stats` scores the sampled tokens under the policy (entropy, confidence);
  * `write_actions` / `step_envs` / `record_step` commit a turn;
  * `copy_rows` forks rows (trajectory so far, deep-copied env, cache rows) into other slots;
  * `prefilled_cache` re-encodes token prefixes under new parameters (continuing after an update);
  * `finish` closes the batch into ordinary `Trajectories` exactly as `RolloutRunner.collect` does.

Played with plain sampling (`play`), a batch draws exactly what `RolloutRunner.collect` draws
(same keys per turn and row id, stop strings included). Rollout options the strategies do not
implement (context-window policies, per-trajectory action budgets, process workers) are rejected
by `check_supported` rather than silently ignored.

The KV cache layout is [layers, B, kv_heads, S, head_dim] for keys and values and [B] for lengths,
so the batch axis of `k`/`v` is 1, not 0: the row helpers below name it explicitly.
"""

from __future__ import annotations

import copy
import dataclasses
import time
import weakref
from typing import Any, Callable, NamedTuple, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.envs import base as envs_base
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers as workers_lib

# A factory of fresh environments (the learner's `make_env`).
MakeEnv = Callable[[], envs_base.TextEnv]


class Strategy(Protocol):
  """How a batch is sampled (`learner.train.strategy`): exactly `len(seeds)` rows back."""

  def collect(self, runner: loop_lib.RolloutRunner, make_env: MakeEnv, seeds: Sequence[int],
              group_ids: Sequence[int], *, params: Any, rng: jax.Array,
              row_ids: Sequence[int]) -> tuple[types.Trajectories, loop_lib.RolloutStats]: ...


@runtime_checkable
class PolicyBound(Protocol):
  """A strategy that runs the policy itself (a teacher pass): told its structure once."""

  def bind(self, *, graphdef: Any, allowed: jax.Array | None, temperature: float,
           max_actions: int) -> Strategy: ...


# ---------------------------------------------------------------------------------------------
# Per-runner jitted pieces


@dataclasses.dataclass
class Tools:
  """The jitted functions a strategy needs for one runner, built once and cached.

  Attributes:
    graphdef: the policy's module structure.
    sample_turn: `sampler.make_turn_sampler` for the runner's sampling config.
    greedy_turn: the same at temperature 0 (arg-max actions: lookahead, greedy follow-ups).
    token_stats: jitted `_token_stats` with the static parts bound.
    prefill: jitted `_prefill`: a fresh KV cache holding given token prefixes.
    stepper: steps envs with the runner's worker config (fault isolation, timeouts).
    obs_buckets: the runner's observation chunk widths.
    max_action_tokens: the runner's per-turn action cap.
    stop_strings: an action ends at the first token whose text completes one of these.
    action_text: ids -> the action text the env receives (as `RolloutRunner.action_text`).
  """

  graphdef: Any
  sample_turn: Callable
  greedy_turn: Callable
  token_stats: Callable
  prefill: Callable
  stepper: workers_lib.EnvStepper
  obs_buckets: tuple[int, ...]
  max_action_tokens: int
  stop_strings: tuple[str, ...]
  action_text: Callable[[Sequence[int]], str]


_TOOLS: "weakref.WeakKeyDictionary[loop_lib.RolloutRunner, Tools]" = weakref.WeakKeyDictionary()


def check_supported(config: loop_lib.RolloutConfig, *, thinking_ok: bool = False) -> None:
  """Rejects rollout options the strategies do not implement (rather than ignoring them).

  `thinking_ok`: the caller takes forced thinking-close tokens out of the loss itself (T²PO);
  other strategies would train on them as if sampled.
  """
  if not thinking_ok and getattr(getattr(config, "sampling", None), "thinking", None) is not None:
    raise ValueError("this rollout strategy does not handle SamplingConfig.thinking (forced "
                     "tokens would be trained as sampled); use t2po.TurnResampling or turn it off")
  workers = getattr(config, "workers", None)
  if getattr(workers, "kind", "thread") != "thread":
    raise ValueError(f"rollout strategies clone envs in this process: WorkerConfig.kind must be "
                     f"'thread', got {workers.kind!r}")
  context = getattr(config, "context", None)
  if context is not None and getattr(context, "masks", False):
    raise ValueError(f"rollout strategies play the full context: RolloutConfig.context.policy "
                     f"must be 'full', got {context.policy!r}")
  if getattr(config, "sampling_dtype", None) is not None:
    raise ValueError(f"rollout strategies sample with the policy's own parameters: "
                     f"RolloutConfig.sampling_dtype must be None, got {config.sampling_dtype!r}")
  if getattr(config, "max_trajectory_action_tokens", 0):
    raise ValueError(f"rollout strategies do not apply RolloutConfig.max_trajectory_action_tokens "
                     f"(got {config.max_trajectory_action_tokens}); set it to 0")


def tools(runner: loop_lib.RolloutRunner, *, thinking_ok: bool = False) -> Tools:
  """The cached `Tools` of `runner` (compiled functions survive across iterations).

  Raises:
    ValueError: the runner's config asks for something the strategies do not implement.
  """
  found = _TOOLS.get(runner)
  if found is None:
    check_supported(runner.config, thinking_ok=thinking_ok)
    graphdef = runner.graphdef
    sampling = runner.config.sampling
    vocab = runner.model_config.vocab_size
    stats_fn = jax.jit(lambda params, cache, tokens, obs_len, num_tokens, turn, top_k: _token_stats(
        graphdef, params, cache, tokens, obs_len, num_tokens, turn, sampling=sampling,
        vocab_size=vocab, top_k=top_k), static_argnums=(6,))
    model_config, capacity = runner.model_config, runner.config.cache_capacity
    prefill_fn = jax.jit(lambda params, tokens, turn_of_token, length: _prefill(
        graphdef, params, tokens, turn_of_token, length, model_config=model_config,
        capacity=capacity))
    found = Tools(graphdef=graphdef, prefill=prefill_fn,
                  sample_turn=sampler_lib.make_turn_sampler(graphdef, sampling, vocab),
                  greedy_turn=sampler_lib.make_turn_sampler(
                      graphdef, dataclasses.replace(sampling, temperature=0.0), vocab),
                  token_stats=stats_fn, stepper=workers_lib.EnvStepper(runner.config.workers),
                  obs_buckets=tuple(runner.config.obs_buckets),
                  max_action_tokens=sampling.max_action_tokens,
                  stop_strings=tuple(getattr(sampling, "stop_strings", ()) or ()),
                  action_text=_action_text(runner.tokenizer, sampling.stop_token_ids))
    _TOOLS[runner] = found
  return found


def _action_text(tokenizer, stop_token_ids):
  # Holds the tokenizer, not the runner: the tools cache is keyed weakly by the runner.
  stop = set(stop_token_ids)
  return lambda ids: tokenizer.decode([i for i in ids if i not in stop])


def _prefill(graphdef, params, tokens: jax.Array, turn_of_token: jax.Array, length: jax.Array, *,
             model_config: transformer.TransformerConfig, capacity: int) -> transformer.KVCache:
  """A KV cache holding each row's first `length[b]` tokens of `tokens` [B, P], laid out as in
  `Trajectories` (the turn and slot positions the sampler gave them). Columns past `length`
  are written but not counted, so the next chunk overwrites them."""
  cache = transformer.init_cache(model_config, tokens.shape[0], capacity)
  _, cache = nnx.merge(graphdef, params)(tokens, transformer.positions_from_turns(turn_of_token),
                                         cache)
  return cache.replace(length=length.astype(jnp.int32))


def prefilled_cache(tool: Tools, params, traj: types.Trajectories,
                    length: np.ndarray) -> transformer.KVCache:
  """The cache of each row's first `length[b]` tokens under `params` (e.g. after an update)."""
  turn_of_token = np.where(np.arange(traj.max_len)[None] < np.asarray(length)[:, None],
                           traj.turn_of_token, -1).astype(np.int32)
  return tool.prefill(params, np.asarray(traj.tokens), turn_of_token, np.asarray(length, np.int32))


# ---------------------------------------------------------------------------------------------
# Cache rows


def copy_cache(cache: transformer.KVCache) -> transformer.KVCache:
  """A fresh copy (the sampler donates the cache it is given)."""
  return jax.tree.map(jnp.copy, cache)


def gather_cache_rows(cache: transformer.KVCache, rows: np.ndarray) -> transformer.KVCache:
  """Cache of the given rows, in that order (a row may repeat)."""
  rows = jnp.asarray(rows, jnp.int32)
  return transformer.KVCache(k=cache.k[:, rows], v=cache.v[:, rows], length=cache.length[rows])


def set_cache_rows(cache: transformer.KVCache, rows: np.ndarray,
                   source: transformer.KVCache, source_rows: np.ndarray) -> transformer.KVCache:
  """`cache` with rows `rows` replaced by rows `source_rows` of `source`."""
  rows = jnp.asarray(rows, jnp.int32)
  src = jnp.asarray(source_rows, jnp.int32)
  return transformer.KVCache(k=cache.k.at[:, rows].set(source.k[:, src]),
                             v=cache.v.at[:, rows].set(source.v[:, src]),
                             length=cache.length.at[rows].set(source.length[src]))


def where_cache_rows(take: np.ndarray, new: transformer.KVCache,
                     old: transformer.KVCache) -> transformer.KVCache:
  """Row b from `new` where take[b], else from `old`."""
  take = jnp.asarray(take, bool)
  per_layer = take[None, :, None, None, None]
  return transformer.KVCache(k=jnp.where(per_layer, new.k, old.k),
                             v=jnp.where(per_layer, new.v, old.v),
                             length=jnp.where(take, new.length, old.length))


# ---------------------------------------------------------------------------------------------
# Trajectory rows

_TOKEN_FIELDS = ("tokens", "action_mask", "turn_of_token", "sample_logprob")
_ROW_FIELDS = ("tokens", "action_mask", "turn_of_token", "sample_logprob", "turn_mask", "reward",
               "done", "obs_hash", "action_valid", "env_error", "turn_start", "turn_end",
               "group_id", "outcome", "success")


def copy_traj_rows(dst: types.Trajectories, rows: Sequence[int], src: types.Trajectories,
                   src_rows: Sequence[int]) -> None:
  """Copies whole rows of `src` into rows of the host buffers `dst` (same L and N), in place.

  Named arrays (`sub_outcomes`, `extras`) present in either batch are carried; a name missing on
  one side reads as zeros there.
  """
  rows, src_rows = np.asarray(rows, np.intp), np.asarray(src_rows, np.intp)
  if dst.max_len != src.max_len or dst.max_turns != src.max_turns:
    raise ValueError(f"copy_traj_rows: [L, N] differ: {dst.max_len, dst.max_turns} vs "
                     f"{src.max_len, src.max_turns}")
  for name in _ROW_FIELDS:
    getattr(dst, name)[rows] = np.asarray(getattr(src, name))[src_rows]
  for field in ("sub_outcomes", "extras"):
    mine, theirs = getattr(dst, field), getattr(src, field)
    for key, value in theirs.items():
      value = np.asarray(value)
      if key not in mine:
        mine[key] = np.zeros((dst.batch_size,) + value.shape[1:], value.dtype)
      mine[key][rows] = value[src_rows]
    for key in mine.keys() - theirs.keys():
      mine[key][rows] = 0


def pad_tokens(traj: types.Trajectories, length: int) -> types.Trajectories:
  """Host copy of `traj` with its token arrays padded (or trimmed) to `length` columns."""
  def fit(x, fill):
    x = np.asarray(x)
    if x.shape[1] >= length:
      return x[:, :length].copy()
    pad = np.full((x.shape[0], length - x.shape[1]), fill, x.dtype)
    return np.concatenate([x, pad], axis=1)
  host = jax.tree.map(np.array, traj)
  return host.replace(tokens=fit(host.tokens, 0), action_mask=fit(host.action_mask, False),
                      turn_of_token=fit(host.turn_of_token, -1),
                      sample_logprob=fit(host.sample_logprob, 0.0))


def used_length(traj: types.Trajectories) -> int:
  """Tokens of the longest conversation (conversations are contiguous from column 0)."""
  return int((np.asarray(traj.turn_of_token) >= 0).sum(axis=1).max(initial=0))


# ---------------------------------------------------------------------------------------------
# A batch of episodes in flight


@dataclasses.dataclass
class RowBatch:
  """B episodes mid-rollout (host state plus the device KV cache).

  Attributes:
    traj: host buffers at full `max_len`.
    envs: one env per row.
    observations: each row's latest observation text (None once consumed or never started).
    chunks: token ids of the observation appended this turn (empty for rows not playing it).
    active: rows still playing.
    cursor: next free token column of each row.
    cache: the KV cache holding each row's conversation up to (not including) its pending chunk.
    row_ids: global row ids that seed each row's sampling.
  """

  traj: types.Trajectories
  envs: list
  observations: list
  chunks: list
  active: np.ndarray
  cursor: np.ndarray
  cache: transformer.KVCache
  row_ids: np.ndarray

  @property
  def size(self) -> int:
    return len(self.envs)


def check_inputs(seeds: Sequence[int], group_ids: Sequence[int],
                 row_ids: Sequence[int] | None) -> np.ndarray:
  """Validates the batch description; returns the row ids (default 0..B-1)."""
  b = len(seeds)
  if b == 0 or len(group_ids) != b:
    raise ValueError(f"collect: {b} seeds and {len(group_ids)} group ids (need equal, > 0)")
  row_ids = np.arange(b, dtype=np.int32) if row_ids is None else np.asarray(row_ids, np.int32)
  if row_ids.shape != (b,):
    raise ValueError(f"collect: {b} seeds but row_ids has shape {row_ids.shape}")
  return row_ids


def check_groups_share_seeds(seeds: Sequence[int], group_ids: Sequence[int], who: str) -> None:
  """Strategies that move state between the rows of a group need one prompt per group."""
  seen: dict[int, int] = {}
  for seed, group in zip(seeds, group_ids):
    if seen.setdefault(int(group), int(seed)) != int(seed):
      raise ValueError(f"{who}: group {int(group)} has different seeds ({seen[int(group)]} and "
                       f"{int(seed)}); a group is one prompt")


def start(runner: loop_lib.RolloutRunner, envs: Sequence[envs_base.TextEnv], seeds: Sequence[int],
          group_ids: Sequence[int], row_ids: np.ndarray, *,
          active: np.ndarray | None = None) -> RowBatch:
  """Resets the envs of the rows that start now (`active`, default all) and opens the buffers.

  Rows not started are dormant slots a strategy fills later with `copy_rows`.
  """
  cfg = runner.config
  b = len(envs)
  active = np.ones(b, bool) if active is None else np.asarray(active, bool).copy()
  traj = types.empty_trajectories(b, cfg.max_len, cfg.max_turns)
  traj.group_id[:] = np.asarray(group_ids, np.int32)
  traj.extras[extra_keys.INITIAL_OBS_HASH_KEY] = np.zeros((b,), np.int32)
  observations: list[str | None] = [None] * b
  for i in np.flatnonzero(active):
    observations[i] = envs[i].reset(int(seeds[i]))
    traj.extras[extra_keys.INITIAL_OBS_HASH_KEY][i] = envs_base.observation_hash(observations[i])
  return RowBatch(traj=traj, envs=list(envs), observations=observations, chunks=[[] for _ in envs],
                  active=active, cursor=np.zeros(b, np.int32),
                  cache=transformer.init_cache(runner.model_config, b, cfg.cache_capacity),
                  row_ids=np.asarray(row_ids, np.int32))


def append_observations(runner: loop_lib.RolloutRunner, batch: RowBatch, turn: int,
                        stats: loop_lib.RolloutStats) -> None:
  """Tokenizes each live row's observation once, writes it, keeps it as the row's pending chunk.

  A row whose observation plus a full action would overflow `max_len` (or the largest bucket)
  ends here as truncated, as in `RolloutRunner.collect` (the same row-level functions).
  """
  batch.chunks = [[] for _ in range(batch.size)]
  for i in np.flatnonzero(batch.active):
    ids = runner.observation_tokens(
        batch.observations[i], turn=turn, instructions=loop_lib.env_instructions(batch.envs[i]),
        last_token=loop_lib.last_token(batch.traj, i, batch.cursor[i]))
    if not loop_lib.observation_fits(runner.config, batch.cursor[i], ids):
      batch.active[i] = False
      loop_lib.end_truncated(batch.traj, i, turn, stats)
      continue
    batch.cursor[i] = loop_lib.write_observation(batch.traj, i, ids, batch.cursor[i], turn)
    batch.chunks[i] = ids


@dataclasses.dataclass
class TurnDraw:
  """One sampled turn: per row the action ids and their log-probs (empty for rows not sampled),
  which rows were sampled, and the cache after the turn (other rows unchanged)."""

  tokens: list
  logprobs: list
  rows: np.ndarray
  cache: transformer.KVCache


def turn_key(rng: jax.Array, turn: int) -> jax.Array:
  """The sampling key of `turn`, as `RolloutRunner.collect` derives it."""
  return jax.random.fold_in(rng, turn)


def retry_key(key: jax.Array, salt: int, attempt: int) -> jax.Array:
  """A key for an extra draw of the same turn (attempt ≥ 1); attempt 0 is `key` itself, so a
  strategy with no extra draws samples exactly what the plain loop samples."""
  if attempt == 0:
    return key
  return jax.random.fold_in(jax.random.fold_in(key, salt), attempt)


def sample_turn(tool: Tools, params, batch: RowBatch, turn: int, key: jax.Array,
                rows: np.ndarray | None = None, *, greedy: bool = False) -> TurnDraw:
  """Samples turn `turn` for `rows` (default: the active rows) on a copy of the pre-turn cache.

  `batch.cache` is left as it was, so the same prefix can be sampled again; each row draws with
  `row_keys(key, row_ids)[row]` only, whatever other rows are in the call. `greedy` takes the
  arg-max action instead.
  """
  mask = batch.active.copy() if rows is None else np.zeros(batch.size, bool)
  if rows is not None:
    mask[np.asarray(rows, np.intp)] = True
    if (mask & ~batch.active).any():
      raise ValueError(f"sample_turn: rows {np.flatnonzero(mask & ~batch.active)} are not active")
  obs, obs_len = loop_lib.chunk_arrays(batch.chunks, tool.obs_buckets)
  sampler = tool.greedy_turn if greedy else tool.sample_turn
  out = sampler(params, copy_cache(batch.cache), obs, obs_len, mask, np.int32(turn), key,
                batch.row_ids)
  tokens, logprobs, num = jax.device_get((out.tokens, out.logprobs, out.num_tokens))
  ids = [list(map(int, tokens[i, :num[i]])) if mask[i] else [] for i in range(batch.size)]
  lps = [list(map(float, logprobs[i, :num[i]])) if mask[i] else [] for i in range(batch.size)]
  cache = out.cache
  if tool.stop_strings:
    # An action ends at its first stop string; the cache forgets the tokens cut after it.
    drop = np.zeros(batch.size, np.int32)
    for i in np.flatnonzero(mask):
      keep = sampler_lib.stop_string_cut(ids[i], tool.stop_strings, tool.action_text)
      drop[i] = len(ids[i]) - keep
      ids[i], lps[i] = ids[i][:keep], lps[i][:keep]
    if drop.any():
      cache = sampler_lib.rolled_back(cache, drop)
  return TurnDraw(tokens=ids, logprobs=lps, rows=np.flatnonzero(mask), cache=cache)


def commit_draw(batch: RowBatch, draw: TurnDraw) -> None:
  """Makes the draw's cache the batch's for the rows it sampled (others keep theirs)."""
  take = np.zeros(batch.size, bool)
  take[draw.rows] = True
  batch.cache = where_cache_rows(take, draw.cache, batch.cache)


def write_actions(batch: RowBatch, rows: Sequence[int], tokens: Sequence[Sequence[int]],
                  logprobs: Sequence[Sequence[float]], turn: int,
                  stats: loop_lib.RolloutStats) -> None:
  """Writes each row's kept action ids and their sampler log-probs (TITO) after its chunk."""
  for i in rows:
    batch.cursor[i] = loop_lib.write_action(batch.traj, i, tokens[i], logprobs[i],
                                            batch.cursor[i], turn, stats)


def step_envs(tool: Tools, envs: Sequence[envs_base.TextEnv], texts: Sequence[str]):
  """Steps envs in the runner's worker pool: a `StepResult` or a `StepFault` per env."""
  return tool.stepper.step(list(envs), list(texts))


def record_step(batch: RowBatch, row: int, result, turn: int, stats: loop_lib.RolloutStats) -> None:
  """Writes one env step's outcome into row `row` (`loop.record_step`, as the loop does)."""
  batch.active[row] = loop_lib.record_step(batch.traj, row, result, turn, stats)
  if batch.active[row]:
    batch.observations[row] = result.observation


def play_turn(runner: loop_lib.RolloutRunner, tool: Tools, batch: RowBatch, draw: TurnDraw,
              turn: int, stats: loop_lib.RolloutStats) -> None:
  """Commits a draw for its rows: cache, action tokens, env step, step record."""
  commit_draw(batch, draw)
  rows = [int(i) for i in draw.rows]
  write_actions(batch, rows, draw.tokens, draw.logprobs, turn, stats)
  results = step_envs(tool, [batch.envs[i] for i in rows],
                      [runner.action_text(draw.tokens[i]) for i in rows])
  for i, result in zip(rows, results):
    record_step(batch, i, result, turn, stats)


def copy_rows(batch: RowBatch, rows: Sequence[int], source_rows: Sequence[int], *,
              source: RowBatch | None = None) -> None:
  """Forks rows: row rows[j] becomes a copy of source_rows[j] (trajectory so far, env state by
  deep copy, pending chunk, cursor, cache rows); its own row id is kept, so from here on it
  samples independently."""
  source = batch if source is None else source
  rows = [int(r) for r in rows]
  source_rows = [int(r) for r in source_rows]
  if not rows:
    return
  copy_traj_rows(batch.traj, rows, source.traj, source_rows)
  for r, s in zip(rows, source_rows):
    batch.envs[r] = copy.deepcopy(source.envs[s])
    batch.observations[r] = source.observations[s]
    batch.chunks[r] = list(source.chunks[s])
    batch.active[r] = source.active[s]
    batch.cursor[r] = source.cursor[s]
  batch.cache = set_cache_rows(batch.cache, np.asarray(rows), source.cache, np.asarray(source_rows))


def close(runner: loop_lib.RolloutRunner, batch: RowBatch, stats: loop_lib.RolloutStats) -> None:
  """Ends rows still playing at the turn budget (truncated) and marks the turns that exist."""
  traj = batch.traj
  for i in np.flatnonzero(batch.active):
    stats.truncated += 1
    traj.done[i, runner.config.max_turns - 1] = True
  batch.active[:] = False
  traj.turn_mask[:] = traj.turn_end > traj.turn_start


def finish(runner: loop_lib.RolloutRunner, batch: RowBatch, stats: loop_lib.RolloutStats,
           start_time: float) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
  """`close`, then trims the buffers to the length bucket, as `RolloutRunner.collect` returns."""
  close(runner, batch, stats)
  traj = loop_lib.trim_tokens(batch.traj,
                              runner.config.trimmed_length(int(batch.cursor.max(initial=0))))
  stats.seconds = time.perf_counter() - start_time
  return traj, stats


def play(runner: loop_lib.RolloutRunner, tool: Tools, batch: RowBatch, params, rng: jax.Array,
         stats: loop_lib.RolloutStats) -> None:
  """Plays the batch's active rows to the end with plain sampling (the keys of the plain loop)."""
  for turn in range(runner.config.max_turns):
    append_observations(runner, batch, turn, stats)
    if not batch.active.any():
      break
    play_turn(runner, tool, batch, sample_turn(tool, params, batch, turn, turn_key(rng, turn)),
              turn, stats)
  close(runner, batch, stats)


def trim_to_bucket(runner: loop_lib.RolloutRunner, traj: types.Trajectories) -> types.Trajectories:
  """`traj` (host, any width ≥ its conversations) trimmed to the runner's length bucket."""
  return loop_lib.trim_tokens(pad_tokens(traj, runner.config.max_len),
                              runner.config.trimmed_length(used_length(traj)))


def merge_stats(into: loop_lib.RolloutStats, other: loop_lib.RolloutStats) -> None:
  """Adds `other`'s counters (not its episodes or seconds) to `into`."""
  for name in ("turns", "sampled_tokens", "env_errors", "env_timeouts", "invalid_actions",
               "truncated"):
    setattr(into, name, getattr(into, name) + getattr(other, name))
  into.faults.extend(other.faults)


# ---------------------------------------------------------------------------------------------
# Token statistics of a sampled turn


class TokenStats(NamedTuple):
  """Per action token of a sampled turn, [B, A] each (0 past a row's `num_tokens`).

  Attributes:
    entropy: top-k entropy of the policy's distribution, −Σ_top-k p log p / log|V|, in [0, 1].
    confidence: the largest probability, max p.
    logprob: log-prob of the sampled token under the same pass (equals the sampler's: TITO).
    valid: which entries are real action tokens.
  """

  entropy: jax.Array
  confidence: jax.Array
  logprob: jax.Array
  valid: jax.Array


def _token_stats(graphdef, params, cache: transformer.KVCache, tokens: jax.Array,
                 obs_len: jax.Array, num_tokens: jax.Array, turn: jax.Array, *,
                 sampling: sampler_lib.SamplingConfig, vocab_size: int, top_k: int) -> TokenStats:
  """Scores a sampled turn in one pass over its chunk: [observation | action] from the pre-turn
  cache, with the positions, turn and slots the sampler used, so the distributions are exactly
  the ones the actions were drawn from.

  Args:
    tokens: [B, W] each row's observation chunk followed by its action ids, right-padded.
    obs_len: [B] observation tokens at the head of each row.
    num_tokens: [B] action tokens after them (A = W − min obs_len bounds them).
  """
  model = nnx.merge(graphdef, params)
  b, w = tokens.shape
  pos = transformer.Positions(position=cache.length[:, None] + jnp.arange(w, dtype=jnp.int32),
                              turn=jnp.full((b, w), turn, jnp.int32),
                              slot=jnp.broadcast_to(jnp.arange(w, dtype=jnp.int32), (b, w)))
  logits, _ = model(tokens, pos, cache)
  allowed = distribution.vocabulary_mask(vocab_size, sampling.allowed_token_ids)
  temperature = sampling.temperature if sampling.temperature > 0 else 1.0
  a = sampling.max_action_tokens
  step = jnp.arange(a, dtype=jnp.int32)
  # The logits before action token j sit at column obs_len − 1 + j.
  before = jnp.clip(obs_len[:, None] - 1 + step, 0, w - 1)
  logp = distribution.policy_log_probs(
      jnp.take_along_axis(logits, before[..., None], axis=1), allowed, temperature)
  picked = jnp.take_along_axis(tokens, jnp.clip(before + 1, 0, w - 1), axis=1)
  valid = step[None] < num_tokens[:, None]
  top = jax.lax.top_k(logp, min(top_k, vocab_size))[0]
  support = vocab_size if sampling.allowed_token_ids is None else len(sampling.allowed_token_ids)
  # Masked-out tokens carry log-prob −1e30: exp(·) = 0 there, so they add exactly 0.
  entropy = -jnp.sum(jnp.exp(top) * jnp.maximum(top, -1e4), axis=-1) / jnp.log(max(support, 2))
  confidence = jnp.exp(top[..., 0])
  token_logp = jnp.take_along_axis(logp, picked[..., None], axis=-1)[..., 0]
  zero = lambda x: jnp.where(valid, x, 0.0)
  return TokenStats(entropy=zero(entropy), confidence=zero(confidence), logprob=zero(token_logp),
                    valid=valid)


def turn_token_stats(tool: Tools, params, batch: RowBatch, draw: TurnDraw, turn: int,
                     top_k: int) -> TokenStats:
  """`TokenStats` of the draw's actions, scored on the batch's pre-turn cache (host arrays)."""
  # Width = observation bucket + the action cap: one compile per bucket, as for the sampler.
  width = (loop_lib.bucket(max(1, max(len(c) for c in batch.chunks)), tool.obs_buckets)
           + tool.max_action_tokens)
  packed = np.zeros((batch.size, width), np.int32)
  obs_len = np.zeros((batch.size,), np.int32)
  num = np.zeros((batch.size,), np.int32)
  for i in range(batch.size):
    ids = list(batch.chunks[i]) + list(draw.tokens[i])
    packed[i, :len(ids)] = ids
    obs_len[i] = len(batch.chunks[i])
    num[i] = len(draw.tokens[i])
  out = tool.token_stats(params, batch.cache, packed, obs_len, num, np.int32(turn), top_k)
  return jax.device_get(out)
