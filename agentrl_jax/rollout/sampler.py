"""Jitted turn sampler: prefill the new observation into the KV cache, then decode the action.

One call per turn for the whole batch. Each trajectory keeps its own cache across turns, so a turn
prefills only the tokens that arrived since the last one. Sampled ids are returned exactly (TITO)
with their log-probs under the policy the learner scores (`policy_log_probs`: temperature and
vocabulary restriction; top-k/top-p only narrow which tokens may be drawn). Stop strings are cut
on the host after the turn (`stop_string_cut`, `rolled_back`).

Thinking intervention (T²PO, docs/methods.md#t2po, optional: `SamplingConfig.thinking`): inside a
thinking block the decode loop tracks a per-token uncertainty M_j and, once M stalls after
`min_tokens` thinking tokens or the block reaches its `budget`, writes the close token instead of
drawing one. Forced tokens are reported in `TurnSample.forced`: the policy did not sample them, so
they carry no log-prob and no loss.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Sequence

import jax
import flax.struct
import jax.numpy as jnp
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ThinkingConfig:
  """T²PO's token-level thinking intervention (docs/methods.md#t2po, formalised from the abstract).

  A row thinks after it emits `open_token_id` (or from its turn's first token with
  `start_thinking`) until it emits `close_token_id`. For the j-th thinking token of a block,
  H_j = −Σ_top-k p log p / log|V| and C_j = max p under the distribution it was drawn from (the
  policy's: temperature and vocabulary restriction; |V| counts the allowed tokens), and
  M_j = α·H̄_j + (1 − α)·(1 − C̄_j) with bars = means over the last `window` thinking tokens
  (fewer at the start of the block). Before drawing the next token, a row with j thinking tokens
  is forced to close when j ≥ budget, or when j ≥ min_tokens, j > window and
  |M_j − M_{j−window}| < epsilon. A block that closes (sampled or forced) may be opened again in
  the same turn; each block counts from 0.

  The tokenizer has no dedicated think markers; any two existing ids serve. The reserved bos (2)
  and eos (3) ids suit: `Tokenizer.encode` never produces them, so env text cannot open or close
  a block. The ids are checked against the vocabulary by `check_thinking`.

  Attributes:
    open_token_id: id that opens a thinking block.
    close_token_id: id that closes it (the one forced).
    min_tokens: j_min, thinking tokens before the stall test may force a close.
    budget: most thinking tokens of a block (the source scripts' num_think_tokens = 450).
    window: w, the moving-average window and the lag of the stall test, in tokens.
    alpha: α, weight of the entropy term in M.
    epsilon: ε_tok, the stall threshold on |M_j − M_{j−w}| (strict).
    top_k: how many of the largest probabilities the entropy sums over.
    start_thinking: every turn opens inside a thinking block (no open token needed).
  """

  open_token_id: int
  close_token_id: int
  min_tokens: int = 64
  budget: int = 450
  window: int = 32
  alpha: float = 0.5
  epsilon: float = 0.01
  top_k: int = 20
  start_thinking: bool = False

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.open_token_id < 0 or self.close_token_id < 0:
      raise ValueError(f"ThinkingConfig token ids must be >= 0, got open={self.open_token_id}, "
                       f"close={self.close_token_id}")
    if self.open_token_id == self.close_token_id:
      raise ValueError(f"ThinkingConfig.open_token_id and close_token_id must differ, both are "
                       f"{self.open_token_id}")
    if self.min_tokens < 0:
      raise ValueError(f"ThinkingConfig.min_tokens must be >= 0, got {self.min_tokens}")
    if self.budget < max(self.min_tokens, 1):
      raise ValueError(f"ThinkingConfig.budget must be >= max(min_tokens, 1) = "
                       f"{max(self.min_tokens, 1)}, got {self.budget}")
    if self.window < 1:
      raise ValueError(f"ThinkingConfig.window must be >= 1, got {self.window}")
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"ThinkingConfig.alpha must be in [0, 1], got {self.alpha}")
    if self.epsilon < 0:
      raise ValueError(f"ThinkingConfig.epsilon must be >= 0, got {self.epsilon}")
    if self.top_k < 1:
      raise ValueError(f"ThinkingConfig.top_k must be >= 1, got {self.top_k}")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SamplingConfig:
  """How action tokens are drawn.

  Top-k and top-p only choose which tokens may be drawn; the recorded log-prob of a drawn token
  is under the tempered (and vocabulary-restricted) distribution, the one the learner recomputes.

  Attributes:
    temperature: softmax temperature; 0 means greedy (arg-max).
    top_k: keep only the k most likely tokens (0 = all).
    top_p: nucleus sampling: keep the smallest set of most likely tokens whose mass (after
      temperature and top-k, renormalised) is ≥ top_p; 1.0 = off.
    max_action_tokens: per-turn token cap; the turn ends there even without a stop token.
    stop_token_ids: a sampled stop token ends the turn (it is kept as an action token).
    stop_strings: the turn ends at the first token whose decoded text completes one of these
      strings; that token is kept and the rest of the turn is dropped (cut on the host, since
      decoding is jitted: `stop_string_cut`).
    allowed_token_ids: restrict the action vocabulary (constrained decoding), or None for all.
      The learner applies the same restriction, so training log-probs match sampling log-probs.
    thinking: T²PO's thinking intervention, or None (off: sampling is exactly as without it).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_action_tokens: int = 32
  stop_token_ids: tuple[int, ...] = ()
  stop_strings: tuple[str, ...] = ()
  allowed_token_ids: tuple[int, ...] | None = None
  thinking: ThinkingConfig | None = None

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.temperature < 0:
      raise ValueError(f"SamplingConfig.temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"SamplingConfig.top_k must be >= 0, got {self.top_k}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
    if isinstance(self.stop_strings, str):
      raise ValueError(f"SamplingConfig.stop_strings must be a tuple of strings, got the string "
                       f"{self.stop_strings!r}")
    # gin passes lists; a tuple keeps the config hashable.
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
    if not all(isinstance(s, str) and s for s in self.stop_strings):
      raise ValueError(f"SamplingConfig.stop_strings must be non-empty strings, got {self.stop_strings!r}")
    if self.max_action_tokens <= 0:
      raise ValueError(f"SamplingConfig.max_action_tokens must be positive, got {self.max_action_tokens}")
    if self.allowed_token_ids is not None and not self.allowed_token_ids:
      raise ValueError("SamplingConfig.allowed_token_ids is empty: nothing could be sampled")
    if self.thinking is not None:
      markers = {self.thinking.open_token_id, self.thinking.close_token_id}
      if markers & set(self.stop_token_ids):
        # A forced close that ends the turn would leave the turn without its action.
        raise ValueError(f"SamplingConfig.thinking: the think markers {sorted(markers)} must not be "
                         f"stop tokens {self.stop_token_ids}")
      if self.thinking.start_thinking and self.max_action_tokens < 2:
        # The one token would be a thought or a forced close: the env could never see an action.
        raise ValueError(f"SamplingConfig.thinking.start_thinking needs max_action_tokens >= 2, got "
                         f"{self.max_action_tokens}")


class TurnSample(NamedTuple):
  """Tokens [B, A], their log-probs [B, A], how many are valid [B], and the extended cache.

  For a mixture-of-experts policy also the experts each token was routed to when it entered the
  model: `obs_routing` [B, T, layers, k] for the observation chunk and `routing`
  [B, A, layers, k] for the sampled tokens (None for a dense policy). The learner replays them
  so its forward pass routes exactly as sampling did (docs/methods.md#t1).

  With a thinking intervention, `forced` [B, A] marks the close tokens it wrote instead of
  drawing (their log-prob is 0; they are not the policy's samples); None when thinking is off.
  """

  tokens: jax.Array
  logprobs: jax.Array
  num_tokens: jax.Array
  cache: transformer.KVCache
  obs_routing: jax.Array | None = None
  routing: jax.Array | None = None
  forced: jax.Array | None = None


def _forward(model, tokens, pos, cache, last=None):
  """(logits, cache, experts or None): records routing only for a mixture-of-experts model.

  With `last` [B] (a chunk's last valid position per row) only those positions' logits
  [B, 1, V] are computed: a prefill samples from its last token alone, and the whole chunk's
  [B, T, V] logits (49,152 floats a token for SmolLM2) would cost a head matmul per token and,
  at batch 200 x 256 tokens, 10 GB.
  """
  if not model.config.num_experts:
    x, cache = model.features(tokens, pos, cache)
    experts = None
  else:
    x, cache, experts = model.features_and_routing(tokens, pos, cache)
  if last is not None:
    x = jnp.take_along_axis(x, last[:, None, None], axis=1)
  return model.head_out(x), cache, experts


def nucleus_filter(logp: jax.Array, top_p: float) -> jax.Array:
  """Sets to -1e30 the log-probs [..., V] outside the smallest top set whose mass is ≥ top_p.

  `logp` must be normalised. In descending order, token i is kept iff the mass strictly before
  it is < top_p, so the most likely token is always kept.
  """
  ordered = jnp.flip(jnp.sort(logp, axis=-1), axis=-1)
  probs = jnp.exp(ordered)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  threshold = jnp.min(jnp.where(mass_before < top_p, ordered, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logp < threshold, -1e30, logp)


def first_argmax(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, -1)` (the first index of the maximum) as two plain reductions.

  XLA:CPU lowers argmax to one variadic (value, index) reduction that took 76 µs per greedy
  decode step at [32, 512], the largest op of the step; a max then a min over matching indices
  computes the same index (NaN-free inputs: log-probs here) in a fraction of that.
  """
  top = jnp.max(x, axis=-1, keepdims=True)
  index = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(x == top, index, x.shape[-1]), axis=-1)


def _draw(keys: jax.Array, logp: jax.Array, config: SamplingConfig) -> jax.Array:
  """One token per row; row i draws with keys[i] only, so its draw never depends on the batch."""
  if config.temperature == 0:
    return first_argmax(logp)
  if config.top_k:
    kth = jax.lax.top_k(logp, config.top_k)[0][..., -1:]
    logp = jnp.where(logp < kth, -1e30, logp)
  if config.top_p < 1:
    # The nucleus is taken over what top-k left, renormalised.
    logp = nucleus_filter(jax.nn.log_softmax(logp, axis=-1), config.top_p)
  return jax.vmap(jax.random.categorical)(keys, logp).astype(jnp.int32)


def row_keys(rng: jax.Array, row_ids: jax.Array) -> jax.Array:
  """[B] keys, one per trajectory, from its global row id.

  A trajectory's randomness depends on its row id alone, not on the batch it is sampled in, so a
  batch split over hosts (or shrunk to a few rows in a test) samples exactly the same tokens.
  """
  return jax.vmap(lambda r: jax.random.fold_in(rng, r))(row_ids)


def check_thinking(thinking: ThinkingConfig | None, vocab_size: int) -> None:
  """Raises a ValueError when a think marker id lies outside the vocabulary [0, vocab_size)."""
  if thinking is None:
    return
  for name in ("open_token_id", "close_token_id"):
    value = getattr(thinking, name)
    if not 0 <= value < vocab_size:
      raise ValueError(f"ThinkingConfig.{name}={value} is outside the vocabulary [0, {vocab_size})")


class TokenUncertainty(NamedTuple):
  """Entropy H [...] (top-k, normalised by log|V|) and confidence C = max p [...] of a token."""

  entropy: jax.Array
  confidence: jax.Array


def token_uncertainty(logp: jax.Array, top_k: int, support: int) -> TokenUncertainty:
  """H = −Σ_top-k p log p / log(support) and C = max p of normalised log-probs [..., V].

  `support` is |V|, the number of tokens the policy may draw (at least 2 is used, so a
  one-token support does not divide by 0). Masked tokens (log-prob −1e30) add exactly 0.
  """
  top = jax.lax.top_k(logp, min(top_k, logp.shape[-1]))[0]
  entropy = -jnp.sum(jnp.exp(top) * jnp.maximum(top, -1e4), axis=-1) / jnp.log(max(support, 2))
  return TokenUncertainty(entropy=entropy, confidence=jnp.exp(top[..., 0]))


@flax.struct.dataclass
class ThinkState:
  """Per-row thinking state carried through the decode loop ([B] or [B, ring]).

  Attributes:
    thinking: inside a thinking block.
    count: j, thinking tokens of the current block so far.
    entropy, confidence: [B, w] the last w thinking tokens' H and C, token j at slot (j−1) mod w
      (zeros in slots the block has not reached, so sums are over its tokens only).
    score: [B, w + 1] M of the last w + 1 thinking tokens, M_j at slot j mod (w + 1).
  """

  thinking: jax.Array
  count: jax.Array
  entropy: jax.Array
  confidence: jax.Array
  score: jax.Array


def initial_think_state(thinking: jax.Array, window: int) -> ThinkState:
  """Rows in `thinking` [B] start inside a fresh block; the others outside any block."""
  b = thinking.shape[0]
  return ThinkState(thinking=thinking, count=jnp.zeros((b,), jnp.int32),
                    entropy=jnp.zeros((b, window), jnp.float32),
                    confidence=jnp.zeros((b, window), jnp.float32),
                    score=jnp.zeros((b, window + 1), jnp.float32))


def stalled(state: ThinkState, config: ThinkingConfig) -> jax.Array:
  """[B] bool: the next token must be the close token (the intervention's trigger)."""
  j, w = state.count, config.window
  ring = w + 1
  now = jnp.take_along_axis(state.score, (j % ring)[:, None], axis=1)[:, 0]
  lagged = jnp.take_along_axis(state.score, ((j - w) % ring)[:, None], axis=1)[:, 0]
  flat = (j >= config.min_tokens) & (j > w) & (jnp.abs(now - lagged) < config.epsilon)
  return state.thinking & ((j >= config.budget) | flat)


def advance_thinking(state: ThinkState, token: jax.Array, uncertainty: TokenUncertainty,
                     emit: jax.Array, config: ThinkingConfig) -> ThinkState:
  """The state after each row emitted `token` [B] (rows with `emit` False stay as they were).

  `uncertainty` is H and C of the distribution the token came from. A thinking token (any token
  but the close inside a block) becomes token j + 1 with M_{j+1} = α·H̄ + (1 − α)·(1 − C̄) over
  the last min(j + 1, w) thinking tokens; the close token ends the block; the open token outside
  a block starts a fresh one.
  """
  w = config.window
  inside = emit & state.thinking & (token != config.close_token_id)
  slot = jax.nn.one_hot(state.count % w, w, dtype=bool) & inside[:, None]
  entropy = jnp.where(slot, uncertainty.entropy[:, None], state.entropy)
  confidence = jnp.where(slot, uncertainty.confidence[:, None], state.confidence)
  count = state.count + inside.astype(jnp.int32)
  seen = jnp.minimum(count, w).astype(jnp.float32)
  mean = lambda x: x.sum(axis=1) / jnp.maximum(seen, 1.0)
  score_now = config.alpha * mean(entropy) + (1 - config.alpha) * (1 - mean(confidence))
  score = jnp.where(jax.nn.one_hot(count % (w + 1), w + 1, dtype=bool) & inside[:, None],
                    score_now[:, None], state.score)
  closed = emit & state.thinking & (token == config.close_token_id)
  opened = emit & ~state.thinking & (token == config.open_token_id)
  fresh = initial_think_state(opened, w)
  keep = lambda new, old: jnp.where(opened.reshape((-1,) + (1,) * (new.ndim - 1)), old, new)
  return ThinkState(thinking=(state.thinking & ~closed) | opened,
                    count=keep(count, fresh.count), entropy=keep(entropy, fresh.entropy),
                    confidence=keep(confidence, fresh.confidence), score=keep(score, fresh.score))


def sample_turn(graphdef: nnx.GraphDef, params: nnx.State, cache: transformer.KVCache,
                obs_tokens: jax.Array, obs_len: jax.Array, active: jax.Array, turn: jax.Array,
                rng: jax.Array, row_ids: jax.Array | None = None, *, config: SamplingConfig,
                vocab_size: int, floor: jax.Array | None = None,
                window: int | None = None) -> TurnSample:
  """Prefills each row's new observation, then samples up to `max_action_tokens` action tokens.

  Args:
    graphdef, params: the policy.
    cache: per-row KV cache holding the conversation so far (cache.length tokens).
    obs_tokens: [B, T] the observation chunk of this turn, right-padded.
    obs_len: [B] valid tokens in each row's chunk (≥ 1 for active rows).
    active: [B] rows still playing; inactive rows neither sample nor advance their cache.
    turn: [] int32 turn index of this chunk and its action.
    rng: key for this turn.
    row_ids: [B] global row ids that seed each row's draws (default: 0..B-1).
    config: sampling rules (static).
    vocab_size: V (static).
    floor: [B] int32 context floor of this turn (`rollout/context.py`): the first absolute
      position its tokens may attend to; None attends to the whole cache.
    window: static; if given, the turn reads and writes only the first `window` cache slots,
      which must hold every row's cache.length + T + max_action_tokens (the caller's bound; a
      write past the window would be clamped). Attention and cache copies then cost O(window)
      instead of O(capacity), which is most of a turn's cost while the conversation is short.
  Returns:
    TurnSample; tokens past a row's `num_tokens` are padding (0). With `config.thinking`,
    `forced` marks the close tokens the intervention wrote (log-prob 0). The cache comes back
    stacked or per-layer as it was given.
  """
  model = nnx.merge(graphdef, params)
  full = cache
  if window is not None and window < cache.capacity:
    cut = lambda x: x[..., :window, :]
    cache = cache.replace(k=jax.tree.map(cut, cache.k), v=jax.tree.map(cut, cache.v))
  # Per-layer buffers through the turn; a stacked cache is stacked again at its end.
  cache = cache.unstacked()
  allowed = distribution.vocabulary_mask(vocab_size, config.allowed_token_ids)
  b, t = obs_tokens.shape
  keys = row_keys(rng, jnp.arange(b, dtype=jnp.int32) if row_ids is None else row_ids)
  obs_len = jnp.where(active, obs_len, 0)
  floor_of = lambda width: None if floor is None else jnp.broadcast_to(floor[:, None], (b, width))
  chunk_pos = transformer.Positions(
      position=cache.length[:, None] + jnp.arange(t, dtype=jnp.int32),
      turn=jnp.full((b, t), turn, jnp.int32),
      slot=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)), floor=floor_of(t))
  logits, cache, obs_routing = _forward(model, obs_tokens, chunk_pos, cache,
                                        last=jnp.maximum(obs_len - 1, 0))
  cache = cache.replace(length=cache.length + obs_len)
  last = logits[:, 0]
  stops = jnp.asarray(config.stop_token_ids or (-1,), jnp.int32)
  thinking = config.thinking
  check_thinking(thinking, vocab_size)
  support = vocab_size if config.allowed_token_ids is None else len(config.allowed_token_ids)

  def decode_step(carry, step):
    cache, logits, finished, slot, think = carry
    logp = distribution.policy_log_probs(logits, allowed, config.temperature if config.temperature > 0 else 1.0)
    token = _draw(jax.vmap(lambda k: jax.random.fold_in(k, step))(keys), logp, config)
    token_logp = jnp.take_along_axis(logp, token[:, None], axis=1)[:, 0]
    emit = ~finished
    out = {}
    if thinking is not None:
      # The draw is still made (and discarded) so a row's keys and later draws do not depend on
      # whether it was forced.
      forced = emit & stalled(think, thinking)
      token = jnp.where(forced, thinking.close_token_id, token)
      token_logp = jnp.where(forced, 0.0, token_logp)
      think = advance_thinking(think, token, token_uncertainty(logp, thinking.top_k, support),
                               emit, thinking)
      out["forced"] = forced
    token = jnp.where(emit, token, 0)
    pos = transformer.Positions(position=cache.length[:, None], turn=jnp.full((b, 1), turn, jnp.int32),
                                slot=slot[:, None], floor=floor_of(1))
    next_logits, cache, experts = _forward(model, token[:, None], pos, cache)
    cache = cache.replace(length=cache.length + emit.astype(jnp.int32))
    finished = finished | jnp.isin(token, stops)
    carry = (cache, next_logits[:, 0], finished, slot + 1, think)
    out.update(token=token, logprob=jnp.where(emit, token_logp, 0.0), emit=emit)
    if experts is not None:
      out["routing"] = experts[:, 0]
    return carry, out

  think = None
  if thinking is not None:
    think = initial_think_state(active & thinking.start_thinking, thinking.window)
  init = (cache, last, ~active, obs_len.astype(jnp.int32), think)
  (cache, _, _, _, _), out = jax.lax.scan(decode_step, init, jnp.arange(config.max_action_tokens))
  if not isinstance(full.k, tuple):
    cache = cache.stacked()
  if cache.capacity < full.capacity:
    put = lambda whole, part: whole.at[..., :window, :].set(part)
    cache = full.replace(k=jax.tree.map(put, full.k, cache.k),
                         v=jax.tree.map(put, full.v, cache.v), length=cache.length)
  return TurnSample(tokens=out["token"].T, logprobs=out["logprob"].T,
                    num_tokens=out["emit"].sum(axis=0).astype(jnp.int32), cache=cache,
                    obs_routing=obs_routing,
                    routing=jnp.swapaxes(out["routing"], 0, 1) if "routing" in out else None,
                    forced=out["forced"].T if "forced" in out else None)


def make_turn_sampler(graphdef: nnx.GraphDef, config: SamplingConfig, vocab_size: int):
  """Returns the jitted `sample_turn` with the static parts bound; the cache is donated.

  The returned fn(params, cache, obs_tokens, obs_len, active, turn, rng, row_ids=None, *,
  floor=None, window=None) compiles once per (chunk width, window), and once more if a floor is
  passed; `window` is static (`sample_turn`).
  """

  def fn(params, cache, obs_tokens, obs_len, active, turn, rng, row_ids=None, *, floor=None,
         window=None):
    return sample_turn(graphdef, params, cache, obs_tokens, obs_len, active, turn, rng, row_ids,
                       config=config, vocab_size=vocab_size, floor=floor, window=window)

  return jax.jit(fn, donate_argnums=(1,), static_argnames=("window",))


# A growing KV cache: a turn's attention reads every slot of the cache it is given, so a cache
# sized for the longest conversation makes every turn cost what the last one does. Reading only
# the filled blocks of a big cache does not help on XLA:CPU: a dot reads whole dense buffers, so
# each block is copied out first, about 1.8x the per-slot cost of reading a whole buffer in place
# (docs/performance.md). Instead the rollout loop starts small and steps through a few static
# sizes, copying the cache once when a turn outgrows it; the sampler compiles once per size.
# Slots past a row's length are masked either way, so the samples are the same.
SMALLEST_CACHE = 64
# Sizes are rounded up to a multiple of this many slots.
CACHE_SIZE_ALIGN = 32


def cache_sizes(capacity: int, steps_per_doubling: int = 2,
                smallest: int = SMALLEST_CACHE) -> tuple[int, ...]:
  """The sizes a growing cache steps through, ending at `capacity`.

  smallest · 2^(k / steps_per_doubling) for k = 0, 1, ..., rounded up to a multiple of
  CACHE_SIZE_ALIGN, while more than CACHE_SIZE_ALIGN below `capacity`: 1 step doubles (fewest
  compiles), 2 steps grow by about √2 (a turn reads at most about √2 times the slots it needs
  instead of 2 times).
  """
  if steps_per_doubling < 1:
    raise ValueError(f"cache_sizes: steps_per_doubling must be >= 1, got {steps_per_doubling}")
  sizes, k = [], 0
  while True:
    size = -(-smallest * 2 ** (k / steps_per_doubling) // CACHE_SIZE_ALIGN) * CACHE_SIZE_ALIGN
    if size + CACHE_SIZE_ALIGN > capacity:
      return (*sizes, capacity)
    if not sizes or size > sizes[-1]:
      sizes.append(int(size))
    k += 1


def growing_cache(config: transformer.TransformerConfig, batch_size: int, capacity: int,
                  steps_per_doubling: int = 2, dtype=jnp.float32) -> transformer.KVCache:
  """An empty per-layer cache of the first of `cache_sizes`; `fit_cache` grows it.

  Per-layer (`KVCache.unstacked`): the sampler then hands each layer's buffer through a turn as
  it is, where a stacked cache is unstacked and stacked again, two copies of it per turn.
  """
  first = cache_sizes(capacity, steps_per_doubling)[0]
  return transformer.init_cache(config, batch_size, first, dtype).unstacked()


@functools.partial(jax.jit, static_argnums=1)
def _grown(cache: transformer.KVCache, capacity: int) -> transformer.KVCache:
  return cache.grown(capacity)


def fit_cache(cache: transformer.KVCache, need: int, capacity: int,
              steps_per_doubling: int = 2) -> transformer.KVCache:
  """`cache`, grown to the smallest of `cache_sizes` that holds `need` slots if it holds fewer
  (copied once; never shrunk, never past `capacity`)."""
  if need <= cache.capacity or cache.capacity >= capacity:
    return cache
  size = next(s for s in cache_sizes(capacity, steps_per_doubling) if need <= s or s == capacity)
  return _grown(cache, size)


def outside_thinking(ids: Sequence[int], thinking: ThinkingConfig | None) -> list[int]:
  """The ids of an action outside its thinking blocks (markers included in the blocks).

  What the env is shown: the reasoning stays in the conversation but is not the action. A block
  still open at the end of the turn hides the rest of it.
  """
  if thinking is None:
    return list(ids)
  inside = thinking.start_thinking
  kept = []
  for i in ids:
    if inside:
      inside = i != thinking.close_token_id
    elif i == thinking.open_token_id:
      inside = True
    else:
      kept.append(i)
  return kept


def rolled_back(cache: transformer.KVCache, drop: jax.Array) -> transformer.KVCache:
  """The cache without the last `drop[b]` tokens of each row.

  Attention needs no erasing: the next chunk is written at `length` and its queries sit at
  `length + i`, so stale keys past them are in the future (masked as causal) and the rest are
  overwritten before they are read.
  """
  return cache.replace(length=cache.length - jnp.asarray(drop, jnp.int32))


def stop_string_cut(ids: Sequence[int], stop_strings: Sequence[str],
                    decode: Callable[[Sequence[int]], str]) -> int:
  """How many of `ids` to keep: through the first token whose prefix text holds a stop string.

  Decodes prefixes incrementally (a token's text can depend on its neighbours, so each prefix is
  decoded whole); returns len(ids) when no stop string occurs.
  """
  if not stop_strings or not any(s in decode(ids) for s in stop_strings):
    return len(ids)
  for n in range(1, len(ids) + 1):
    text = decode(ids[:n])
    if any(s in text for s in stop_strings):
      return n
  return len(ids)
