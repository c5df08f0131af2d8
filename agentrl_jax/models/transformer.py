"""Decoder-only transformer LM (Flax NNX), used functionally at the jit boundary.

RMSNorm, grouped-query attention, SwiGLU, optional q/k/v bias (Qwen2), tied or untied embeddings.
Two position schemes:
  * `rope`: rotary embeddings over the absolute position (Llama / Qwen).
  * `turn_slot`: a learned turn embedding plus a learned within-turn slot embedding, with an
    ALiBi-style recency bias in attention. A tiny policy trained from scratch reads the latest
    observation far more easily this way (measured: with plain learned positions it ignored the
    board entirely), so the quickstart uses it.

The KV cache is an explicit pytree argument and return value (`KVCache`), never module state.
Every parameter carries `logical_axes` metadata naming its axes; `parallel/rules.py` maps these
to mesh axes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import chex
import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax.models import attention
from agentrl_jax.models import mixed_matmul

# Logical axis names (DESIGN.md "Models and sharding").
BATCH, SEQ, EMBED, MLP, HEADS, KV, VOCAB, TURN, EXPERT = (
    "batch", "seq", "embed", "mlp", "heads", "kv", "vocab", "turn", "expert")

# TransformerConfig.remat's choices (see the field's comment).
REMAT_MODES = ("none", "layer", "layer_dots")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TransformerConfig:
  """Architecture hyperparameters; validated on construction."""

  vocab_size: int
  num_layers: int = 2
  d_model: int = 64
  num_heads: int = 4
  num_kv_heads: int | None = None
  head_dim: int | None = None
  mlp_dim: int | None = None
  position: Literal["rope", "turn_slot"] = "rope"
  rope_theta: float = 10000.0
  rope_scaling_factor: float | None = None
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  max_turns: int = 64
  max_slots: int = 128
  alibi: bool = False
  qkv_bias: bool = False
  tie_embeddings: bool = True
  norm_eps: float = 1e-6
  head: Literal["lm", "value"] = "lm"
  num_experts: int = 0
  experts_per_token: int = 2
  # 'layer': a full forward pass (the learner's) keeps only each decoder layer's input for the
  # backward and recomputes the layer's inside (a checkpointed scan over the layers,
  # `_layer_scan`): activation memory falls from every layer's intermediates to one layer's,
  # for a second forward of compute and a stacked copy of the layer weights. 'layer_dots': the
  # same scan, keeping each layer's weight-matmul outputs (projections and MLP) for the
  # backward, so the second forward redoes only the attention scores and the elementwise work:
  # on SmolLM2's shape it won back a third of 'layer''s extra time, for the projections'
  # activations kept per layer (docs/performance.md).
  remat: Literal["none", "layer", "layer_dots"] = "none"
  # Compute dtype of activations and matmuls; parameters stay float32, and the logits (head),
  # norms, RoPE and attention scores accumulate in float32.
  dtype: Literal["float32", "bfloat16"] = "float32"
  # Attention kernel (`models/attention.py`): 'auto' is the blocked kernel on CPU (as before) and
  # jax.nn.dot_product_attention elsewhere, cuDNN's where it applies (`resolve_implementation`).
  # How the model runs, not its architecture: a checkpoint's config takes the bound model's.
  attention: Literal["auto", "blocked", "xla", "cudnn"] = "auto"

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.remat not in REMAT_MODES:
      raise ValueError(f"TransformerConfig.remat must be one of {REMAT_MODES}, got {self.remat!r}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"TransformerConfig.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.attention not in attention.IMPLEMENTATIONS:
      raise ValueError(f"TransformerConfig.attention must be one of {attention.IMPLEMENTATIONS}, "
                       f"got {self.attention!r}")
    for name in ("vocab_size", "num_layers", "d_model", "num_heads", "max_turns", "max_slots"):
      if getattr(self, name) <= 0:
        raise ValueError(f"TransformerConfig.{name} must be positive, got {getattr(self, name)}")
    if self.position not in ("rope", "turn_slot"):
      raise ValueError(f"TransformerConfig.position must be 'rope' or 'turn_slot', got {self.position!r}")
    if self.head not in ("lm", "value"):
      raise ValueError(f"TransformerConfig.head must be 'lm' or 'value', got {self.head!r}")
    if self.num_heads % self.kv_heads:
      raise ValueError(
          f"TransformerConfig.num_heads={self.num_heads} is not a multiple of num_kv_heads={self.kv_heads}")
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
          f"TransformerConfig.d_model={self.d_model} is not divisible by num_heads={self.num_heads}")
    if self.position == "rope" and self.dim_per_head % 2:
      raise ValueError(f"RoPE needs an even head_dim, got {self.dim_per_head}")
    if self.rope_scaling_factor is not None:
      if self.rope_scaling_factor < 1:
        raise ValueError(
            f"TransformerConfig.rope_scaling_factor must be >= 1, got {self.rope_scaling_factor}")
      if not 0 < self.rope_low_freq_factor < self.rope_high_freq_factor:
        raise ValueError(
            "TransformerConfig needs 0 < rope_low_freq_factor < rope_high_freq_factor, got "
            f"{self.rope_low_freq_factor}, {self.rope_high_freq_factor}")
      if self.rope_original_max_position <= 0:
        raise ValueError("TransformerConfig.rope_original_max_position must be positive, got "
                         f"{self.rope_original_max_position}")
    if self.num_experts < 0:
      raise ValueError(f"TransformerConfig.num_experts must be >= 0, got {self.num_experts}")
    if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
      raise ValueError(f"TransformerConfig.experts_per_token must be in [1, num_experts="
                       f"{self.num_experts}], got {self.experts_per_token}")

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def dim_per_head(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def hidden_dim(self) -> int:
    return self.mlp_dim or 4 * self.d_model

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


def tiny(vocab_size: int, **overrides) -> TransformerConfig:
  """2 layers, width 64, 4 heads: trains on CPU in minutes (tests, quickstart)."""
  kw = dict(num_layers=2, d_model=64, num_heads=4, mlp_dim=256)
  kw.update(overrides)
  return TransformerConfig(vocab_size=vocab_size, **kw)


def small(vocab_size: int, **overrides) -> TransformerConfig:
  """6 layers, width 256, 8 heads (2 kv heads)."""
  kw = dict(num_layers=6, d_model=256, num_heads=8, num_kv_heads=2, mlp_dim=1024)
  kw.update(overrides)
  return TransformerConfig(vocab_size=vocab_size, **kw)


def _preset(vocab_size: int, overrides: dict, **kw) -> TransformerConfig:
  kw.update(overrides)
  return TransformerConfig(vocab_size=vocab_size, position="rope", **kw)


# The real shapes of the released checkpoints (their config.json files). `models/hf.py` builds the
# same configs from a checkpoint's own config.json; these let a run be planned (memory, sharding)
# without one on disk.
def _qwen2(**kw):
  return dict(qkv_bias=True, rope_theta=1_000_000.0, norm_eps=1e-6, **kw)


def _llama3(**kw):
  return dict(qkv_bias=False, rope_theta=500_000.0, norm_eps=1e-5, rope_low_freq_factor=1.0,
              rope_high_freq_factor=4.0, rope_original_max_position=8192, **kw)


def qwen2_5_0_5b(vocab_size: int = 151936, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_qwen2(num_layers=24, d_model=896, num_heads=14,
                                                 num_kv_heads=2, mlp_dim=4864, tie_embeddings=True))


def qwen2_5_1_5b(vocab_size: int = 151936, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_qwen2(num_layers=28, d_model=1536, num_heads=12,
                                                 num_kv_heads=2, mlp_dim=8960, tie_embeddings=True))


def qwen2_5_3b(vocab_size: int = 151936, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_qwen2(num_layers=36, d_model=2048, num_heads=16,
                                                 num_kv_heads=2, mlp_dim=11008, tie_embeddings=True))


def qwen2_5_7b(vocab_size: int = 152064, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_qwen2(num_layers=28, d_model=3584, num_heads=28,
                                                 num_kv_heads=4, mlp_dim=18944, tie_embeddings=False))


def llama3_2_1b(vocab_size: int = 128256, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_llama3(
      num_layers=16, d_model=2048, num_heads=32, num_kv_heads=8, head_dim=64, mlp_dim=8192,
      tie_embeddings=True, rope_scaling_factor=32.0))


def llama3_2_3b(vocab_size: int = 128256, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_llama3(
      num_layers=28, d_model=3072, num_heads=24, num_kv_heads=8, head_dim=128, mlp_dim=8192,
      tie_embeddings=True, rope_scaling_factor=32.0))


def llama3_1_8b(vocab_size: int = 128256, **overrides) -> TransformerConfig:
  return _preset(vocab_size, overrides, **_llama3(
      num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, head_dim=128, mlp_dim=14336,
      tie_embeddings=False, rope_scaling_factor=8.0))


PRESETS = {
    "qwen2.5-0.5b": qwen2_5_0_5b, "qwen2.5-1.5b": qwen2_5_1_5b, "qwen2.5-3b": qwen2_5_3b,
    "qwen2.5-7b": qwen2_5_7b, "llama-3.2-1b": llama3_2_1b, "llama-3.2-3b": llama3_2_3b,
    "llama-3.1-8b": llama3_1_8b,
}


def num_params(config: TransformerConfig) -> int:
  """Parameter count from the shapes alone (no arrays are built)."""
  c = config
  q, kv = c.num_heads * c.dim_per_head, c.kv_heads * c.dim_per_head
  attn = c.d_model * (q + 2 * kv) + q * c.d_model + (q + 2 * kv if c.qkv_bias else 0)
  ffn = 3 * c.d_model * c.hidden_dim
  if c.num_experts:
    ffn = c.num_experts * ffn + c.d_model * c.num_experts
  layer = attn + ffn + 2 * c.d_model
  head = 0 if c.head == "lm" and c.tie_embeddings else (c.d_model if c.head == "value" else c.d_model * c.vocab_size)
  extra = (c.max_turns + c.max_slots) * c.d_model if c.position == "turn_slot" else 0
  return c.vocab_size * c.d_model + extra + c.num_layers * layer + c.d_model + head


@flax.struct.dataclass
class KVCache:
  """Keys and values of every layer, [layers, B, kv_heads, S, head_dim], and valid lengths [B].

  Heads-major, so attention reads a layer's keys and values in place (`models/attention.py`).
  `k` and `v` may also be tuples of per-layer [B, kv_heads, S, head_dim] arrays
  (`unstacked`): a decode loop carries them that way, so a step writes each layer's buffer in
  place instead of slicing the stacked array per layer and stacking it again per token. The
  rollout loop keeps them that way across turns too (`sampler.growing_cache`): stacking copies
  the whole cache.
  """

  k: jax.Array | tuple[jax.Array, ...]
  v: jax.Array | tuple[jax.Array, ...]
  length: jax.Array

  @property
  def capacity(self) -> int:
    return self.k[0].shape[2] if isinstance(self.k, tuple) else self.k.shape[3]

  def unstacked(self) -> "KVCache":
    if isinstance(self.k, tuple):
      return self
    return self.replace(k=tuple(self.k), v=tuple(self.v))

  def stacked(self) -> "KVCache":
    if not isinstance(self.k, tuple):
      return self
    return self.replace(k=jnp.stack(self.k), v=jnp.stack(self.v))

  def grown(self, capacity: int) -> "KVCache":
    """The same cache in buffers of `capacity` >= self.capacity slots (zeros past the old ones),
    stacked or per-layer as it was."""
    if capacity < self.capacity:
      raise ValueError(f"KVCache.grown: capacity {capacity} < the cache's {self.capacity}")
    pad = lambda x: jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, capacity - x.shape[-2]), (0, 0)])
    return self.replace(k=jax.tree.map(pad, self.k), v=jax.tree.map(pad, self.v))


def init_cache(config: TransformerConfig, batch_size: int, capacity: int,
               dtype=jnp.float32) -> KVCache:
  shape = (config.num_layers, batch_size, config.kv_heads, capacity, config.dim_per_head)
  return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                 length=jnp.zeros((batch_size,), jnp.int32))


@flax.struct.dataclass
class Positions:
  """Where each input token sits: absolute position, turn index and slot within the turn, [B, T].

  `floor` [B, T] (optional) is each token's context floor: the first absolute position it may
  attend to (a context-window policy, `rollout/context.py`). None means 0: the whole prefix. Keys
  below the floor are masked, not removed, so relative distances (RoPE, ALiBi) are unchanged.

  Iterating yields the set fields in order (floor only when given), so a chunk is sliced with
  `Positions(*(x[:, a:b] for x in pos))`.
  """

  position: jax.Array
  turn: jax.Array
  slot: jax.Array
  floor: jax.Array | None = None

  def __iter__(self):
    yield from (self.position, self.turn, self.slot)
    if self.floor is not None:
      yield self.floor


def dense(x: jax.Array, w: jax.Array, contract: int = 1, out_dtype=None) -> jax.Array:
  """x [..., *w.shape[:contract]] times w [*in, *out] -> [..., *out], as one 2-D matmul.

  The weight is cast to x's dtype (the compute dtype; a no-op in float32) and the products
  accumulate in float32; the result is in `out_dtype` (default: x's dtype). In bfloat16 the
  gradient matmuls take bfloat16 operands too (`mixed_matmul`).

  Leading activation dims (batch, time) and the weight's input and output dims are flattened
  first: XLA:CPU computes the weight gradient of a contraction with several free activation dims
  on a slow path (measured 2.4x slower for a SwiGLU forward+backward at 16 x 256 tokens), while a
  plain [N, K] @ [K, M] uses its fast matmul for both gradients. On TPU/GPU the reshapes are free.
  """
  k_shape, out_shape = w.shape[:contract], w.shape[contract:]
  k = math.prod(k_shape)
  lead = x.shape[:x.ndim - contract]
  out_dtype = x.dtype if out_dtype is None else out_dtype
  if x.dtype == jnp.float32:  # the float32 path exactly as it always was
    y = x.reshape(-1, k) @ w.reshape(k, -1)
  else:
    y = mixed_matmul.mixed_matmul(x.reshape(-1, k), w.reshape(k, -1), jnp.dtype(out_dtype))
  return y.reshape(*lead, *out_shape).astype(out_dtype)


def write_cache(buf: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
  """buf [B, KV, S, Dh] with new [B, KV, T, Dh] written at slots start[b].. of each row b, where
  a per-row `dynamic_update_slice` writes them (start clamped so the chunk fits).

  That write is a scatter, in place. XLA:CPU runs a bfloat16 scatter through float32, converting
  the whole buffer there and back (9x the select below over SmolLM2's 60 cache buffers on a
  decode step at batch 16), so on CPU a low-precision cache selects each slot from the buffer or
  from the chunk instead, moving bits (a bfloat16 gather and select would be converted too); it
  reads and writes the buffer once, as the turn's attention reads it. Accelerators scatter
  bfloat16 natively and keep the in-place write.
  """
  new = new.astype(buf.dtype)
  if buf.dtype == jnp.float32 or jax.default_backend() != "cpu":
    write = jax.vmap(lambda b, n, s: jax.lax.dynamic_update_slice(b, n, (0, s, 0)))
    return write(buf, new, start)
  t, capacity = new.shape[2], buf.shape[2]
  first = jnp.clip(start, 0, capacity - t)
  offset = jnp.arange(capacity, dtype=first.dtype)[None, :] - first[:, None]  # [B, S]
  inside = ((offset >= 0) & (offset < t))[:, None, :, None]
  chunk = _as_bits(new)
  if t > 1:  # slot s takes the chunk's token s - first
    index = jnp.clip(offset, 0, t - 1)[:, None, :, None]
    chunk = jnp.take_along_axis(chunk, index, axis=2, mode="clip")
  return jax.lax.bitcast_convert_type(jnp.where(inside, chunk, _as_bits(buf)), buf.dtype)


def _as_bits(x: jax.Array) -> jax.Array:
  """x's bit pattern as unsigned integers of its width: moved, gathered and selected as is."""
  return jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def take_rows(table: jax.Array, idx: jax.Array) -> jax.Array:
  """table[idx] along axis 0; a 16-bit float table is gathered through its bit pattern.

  XLA:CPU runs a bfloat16 gather in float32, converting the whole table first (SmolLM2's
  49152 x 576 embedding: ~0.1 s on every sampler call that reads it); an integer gather moves
  the same bits without arithmetic. Elsewhere the bitcasts are free.
  """
  if not (jnp.issubdtype(table.dtype, jnp.floating) and table.dtype.itemsize == 2):
    return jnp.take(table, idx, axis=0)
  return _take_bits(table, idx)


@jax.custom_jvp
def _take_bits(table: jax.Array, idx: jax.Array) -> jax.Array:
  return jax.lax.bitcast_convert_type(jnp.take(_as_bits(table), idx, axis=0), table.dtype)


@_take_bits.defjvp
def _take_bits_jvp(primals, tangents):
  table, idx = primals
  return _take_bits(table, idx), jnp.take(tangents[0], idx, axis=0)


def _param(rngs: nnx.Rngs, init, shape, axes) -> nnx.Param:
  return nnx.Param(init(rngs.params(), shape, jnp.float32), logical_axes=axes)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), logical_axes=(EMBED,))
    self.eps = eps

  def __call__(self, x):
    var = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(var + self.eps) * self.scale[...]).astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float, scaling_factor: float | None = None,
                     low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                     original_max_position: int = 8192) -> jax.Array:
  """Inverse frequencies [head_dim/2] of RoPE, with Llama 3's long-context rescaling if asked.

  Llama 3 (scaling_factor set) divides the frequencies whose wavelength exceeds
  original_max_position / low_freq_factor by the factor, keeps those whose wavelength is below
  original_max_position / high_freq_factor, and interpolates linearly (in
  original_max_position / wavelength) between the two bands.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if scaling_factor is None:
    return inv_freq
  wavelength = 2 * math.pi / inv_freq
  ratio = original_max_position / wavelength
  smooth = jnp.clip((ratio - low_freq_factor) / (high_freq_factor - low_freq_factor), 0.0, 1.0)
  # smooth = 0 on the long-wavelength band (fully scaled), 1 on the short one (unchanged).
  return (1.0 - smooth) * inv_freq / scaling_factor + smooth * inv_freq


def config_rope_frequencies(config: TransformerConfig) -> jax.Array:
  c = config
  return rope_frequencies(c.dim_per_head, c.rope_theta, c.rope_scaling_factor,
                          c.rope_low_freq_factor, c.rope_high_freq_factor,
                          c.rope_original_max_position)


def apply_rope(x: jax.Array, position: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotates [B, T, H, D] by angle position·inv_freq (the half-split convention of Llama/Qwen)."""
  angles = position[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def alibi_slopes(num_heads: int) -> jax.Array:
  """Geometric per-head slopes 2^(-8h/H), h = 1..H (Press et al.)."""
  return 2.0 ** (-8.0 * jnp.arange(1, num_heads + 1, dtype=jnp.float32) / num_heads)


class Attention(nnx.Module):

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    c = config
    self.config = c
    init = nnx.initializers.normal(stddev=1.0 / math.sqrt(c.d_model))
    out_init = nnx.initializers.normal(stddev=1.0 / math.sqrt(c.num_heads * c.dim_per_head))
    self.wq = _param(rngs, init, (c.d_model, c.num_heads, c.dim_per_head), (EMBED, HEADS, KV))
    self.wk = _param(rngs, init, (c.d_model, c.kv_heads, c.dim_per_head), (EMBED, HEADS, KV))
    self.wv = _param(rngs, init, (c.d_model, c.kv_heads, c.dim_per_head), (EMBED, HEADS, KV))
    self.wo = _param(rngs, out_init, (c.num_heads, c.dim_per_head, c.d_model), (HEADS, KV, EMBED))
    if c.qkv_bias:
      zeros = nnx.initializers.zeros
      self.bq = _param(rngs, zeros, (c.num_heads, c.dim_per_head), (HEADS, KV))
      self.bk = _param(rngs, zeros, (c.kv_heads, c.dim_per_head), (HEADS, KV))
      self.bv = _param(rngs, zeros, (c.kv_heads, c.dim_per_head), (HEADS, KV))

  def _project(self, x):
    q, k, v = (dense(x, w[...]) for w in (self.wq, self.wk, self.wv))
    if self.config.qkv_bias:
      dt = x.dtype
      q, k, v = (q + self.bq[...].astype(dt), k + self.bk[...].astype(dt),
                 v + self.bv[...].astype(dt))
    return q, k, v

  def __call__(self, x, pos: Positions, layer_cache: tuple[jax.Array, jax.Array] | None,
               cache_length: jax.Array | None):
    """Self-attention over the chunk, and over the cache when one is given.

    Args:
      x: [B, T, D] the chunk's hidden states.
      pos: positions of the chunk's tokens.
      layer_cache: (k, v) [B, KV, S, Dh] of this layer, or None for a full forward pass.
      cache_length: [B] number of valid cached positions; the chunk is written at that offset.
    Returns:
      ([B, T, D] output, updated (k, v) or None).
    """
    c = self.config
    q, k, v = self._project(x)
    if c.position == "rope":
      inv_freq = config_rope_frequencies(c)
      q = apply_rope(q, pos.position, inv_freq)
      k = apply_rope(k, pos.position, inv_freq)
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, KV, T, Dh], the cache's layout
    if layer_cache is None:
      keys, values, key_pos = k, v, pos.position
      new_cache = None
    else:
      keys = write_cache(layer_cache[0], k, cache_length)
      values = write_cache(layer_cache[1], v, cache_length)
      capacity = keys.shape[2]
      key_pos = jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), (x.shape[0], capacity))
      new_cache = (keys, values)
    group = c.num_heads // c.kv_heads
    qg = q.reshape(q.shape[0], q.shape[1], c.kv_heads, group, c.dim_per_head)
    distance = pos.position[:, :, None] - key_pos[:, None, :]  # [B, T, S]
    allowed = distance >= 0
    if pos.floor is not None:
      allowed = allowed & (key_pos[:, None, :] >= pos.floor[:, :, None])
    alibi = (distance, alibi_slopes(c.num_heads).reshape(c.kv_heads, group)) if c.alibi else (None, None)
    out = attention.attend(qg, keys.astype(q.dtype), values.astype(q.dtype), allowed, *alibi,
                           implementation=c.attention)
    out = out.reshape(out.shape[0], out.shape[1], c.num_heads, c.dim_per_head)
    return dense(out, self.wo[...], contract=2), new_cache


class SwiGLU(nnx.Module):

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    d, h = config.d_model, config.hidden_dim
    self.w_gate = _param(rngs, nnx.initializers.normal(1.0 / math.sqrt(d)), (d, h), (EMBED, MLP))
    self.w_up = _param(rngs, nnx.initializers.normal(1.0 / math.sqrt(d)), (d, h), (EMBED, MLP))
    self.w_down = _param(rngs, nnx.initializers.normal(1.0 / math.sqrt(h)), (h, d), (MLP, EMBED))

  def __call__(self, x):
    gated = jax.nn.silu(dense(x, self.w_gate[...])) * dense(x, self.w_up[...])
    return dense(gated, self.w_down[...])


class Block(nnx.Module):

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
    self.attn = Attention(config, rngs)
    self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
    if config.num_experts:
      from agentrl_jax.models import moe  # moe reads this module's config; import it lazily
      self.mlp = moe.MoEFeedForward(config, rngs)
    else:
      self.mlp = SwiGLU(config, rngs)
    self.is_moe = bool(config.num_experts)

  def __call__(self, x, pos, layer_cache, cache_length, replay=None):
    """Returns (output, updated layer cache or None, [B, T, k] experts used or None)."""
    h, new_cache = self.attn(self.attn_norm(x), pos, layer_cache, cache_length)
    x = x + h
    if self.is_moe:
      out, experts = self.mlp(self.mlp_norm(x), replay)
      return x + out, new_cache, experts
    return x + self.mlp(self.mlp_norm(x)), new_cache, None


def _block(block: Block, x, pos, layer_cache, cache_length, replay):
  return block(x, pos, layer_cache, cache_length, replay)


def _layer_scan(blocks, x, pos, routing, save_dots: bool = False):
  """All layers as one `lax.scan` over their stacked parameters, each step rematerialised.

  The backward of a scan runs one step at a time, so what stays alive is each layer's input
  (`[B, T, D]` per layer) and one layer's intermediates. Layers called one after another under
  `jax.checkpoint` do not get this on every backend: XLA:CPU keeps all their intermediates
  alive at once (measured: the same temporary memory with and without the checkpoint). The
  stacked copy of the parameters costs one model's size for the pass.

  Returns (hidden states, the experts every MoE layer used [B, T, layers, k] or None).
  """
  graphdef = nnx.graphdef(blocks[0])
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
  replay = None if routing is None else jnp.moveaxis(routing, 2, 0)

  def layer(x, inputs):
    state, layer_replay = inputs
    y, _, used = nnx.merge(graphdef, state)(x, pos, None, None, layer_replay)
    return y, used

  # Weight matmuls are dots without batch dimensions; attention's score and value products
  # batch over heads, so they are recomputed (their outputs grow with the sequence squared).
  policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable if save_dots else None
  x, experts = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, (stacked, replay))
  return x, None if experts is None else jnp.moveaxis(experts, 0, 2)


class Transformer(nnx.Module):
  """Decoder LM (head='lm': logits [B, T, V]) or critic (head='value': values [B, T])."""

  def __init__(self, config: TransformerConfig, rngs: nnx.Rngs):
    c = config
    self.config = c
    # 1/sqrt(D) keeps the tied head's initial logits near unit scale: a near-uniform first policy.
    embed_init = nnx.initializers.normal(1.0 / math.sqrt(c.d_model))
    self.embed = _param(rngs, embed_init, (c.vocab_size, c.d_model), (VOCAB, EMBED))
    if c.position == "turn_slot":
      self.turn_embed = _param(rngs, embed_init, (c.max_turns, c.d_model), (TURN, EMBED))
      self.slot_embed = _param(rngs, embed_init, (c.max_slots, c.d_model), (SEQ, EMBED))
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.d_model, c.norm_eps)
    if c.head == "value":
      self.value_head = _param(rngs, nnx.initializers.zeros, (c.d_model,), (EMBED,))
    elif not c.tie_embeddings:
      self.lm_head = _param(rngs, nnx.initializers.normal(1.0 / math.sqrt(c.d_model)),
                            (c.d_model, c.vocab_size), (EMBED, VOCAB))

  def embed_tokens(self, tokens, pos: Positions):
    c = self.config
    x = take_rows(self.embed[...], tokens)
    if c.position == "turn_slot":
      x = x + jnp.take(self.turn_embed[...], jnp.clip(pos.turn, 0, c.max_turns - 1), axis=0)
      x = x + jnp.take(self.slot_embed[...], jnp.clip(pos.slot, 0, c.max_slots - 1), axis=0)
    return x

  def head_out(self, h):
    """Logits (or values) of hidden states h, always float32."""
    c = self.config
    if c.head == "value":
      return h.astype(jnp.float32) @ self.value_head[...]
    if c.tie_embeddings:
      return dense(h, self.embed[...].T, out_dtype=jnp.float32)
    return dense(h, self.lm_head[...], out_dtype=jnp.float32)

  def __call__(self, tokens: jax.Array, pos: Positions, cache: KVCache | None = None,
               routing: jax.Array | None = None):
    """Forward pass over a chunk of tokens.

    Args:
      tokens: [B, T] int32.
      pos: positions of the tokens; with a cache, pos.position must be cache.length + arange(T).
      cache: None for a full pass from position 0, or the cache to extend. The chunk is written
        at offset cache.length[b]; the caller advances `length` by the number of valid tokens.
      routing: MoE only: [B, T, layers, k] expert indices to replay (None: route freely).
    Returns:
      (logits [B, T, V] or values [B, T], updated cache or None).
    """
    features, cache = self.features(tokens, pos, cache, routing)
    return self.head_out(features), cache

  def features(self, tokens: jax.Array, pos: Positions, cache: KVCache | None = None,
               routing: jax.Array | None = None):
    """The final-normed hidden states [B, T, D] the head reads, and the updated cache.

    Callers that need the head at a few positions only (the learner: action tokens) gather
    these first and call `head_out` on the gathered rows.
    """
    x, cache, _ = self.features_and_routing(tokens, pos, cache, routing)
    return x, cache

  def features_and_routing(self, tokens: jax.Array, pos: Positions, cache: KVCache | None = None,
                           routing: jax.Array | None = None):
    """`features`, plus the experts every MoE layer used, [B, T, layers, k] (None if dense)."""
    chex.assert_rank([tokens, pos.position], 2)
    if routing is not None and not self.config.num_experts:
      raise ValueError("routing replay was given to a dense model (num_experts=0)")
    x = self.embed_tokens(tokens, pos).astype(self.config.compute_dtype)
    # Only a full pass is differentiated (the learner); a cached pass (sampling) never is.
    if cache is None and self.config.remat != "none":
      x, experts = _layer_scan(self.blocks, x, pos, routing,
                               save_dots=self.config.remat == "layer_dots")
      return self.final_norm(x), None, experts
    new_k, new_v, experts = [], [], []
    for i, block in enumerate(self.blocks):
      layer_cache = None if cache is None else (cache.k[i], cache.v[i])
      x, layer_new, used = _block(block, x, pos, layer_cache,
                                  None if cache is None else cache.length,
                                  None if routing is None else routing[:, :, i])
      if layer_new is not None:
        new_k.append(layer_new[0])
        new_v.append(layer_new[1])
      if used is not None:
        experts.append(used)
    x = self.final_norm(x)
    experts = jnp.stack(experts, axis=2) if experts else None
    if cache is None:
      return x, None, experts
    if isinstance(cache.k, tuple):
      return x, cache.replace(k=tuple(new_k), v=tuple(new_v)), experts
    return x, cache.replace(k=jnp.stack(new_k), v=jnp.stack(new_v)), experts


def create(config: TransformerConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
  """Builds the module and splits it into (graphdef, params) for functional use."""
  model = Transformer(config, nnx.Rngs(params=seed))
  return nnx.split(model, nnx.Param)


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens, pos: Positions,
          cache: KVCache | None = None, routing: jax.Array | None = None):
  """Functional forward: merges the module for this call only (pure under jit)."""
  return nnx.merge(graphdef, params)(tokens, pos, cache, routing)


def apply_with_routing(graphdef: nnx.GraphDef, params: nnx.State, tokens, pos: Positions,
                       cache: KVCache | None = None, routing: jax.Array | None = None):
  """Like `apply`, also returning the experts used, [B, T, layers, k] (None for a dense model).

  The sampler records these per token; the learner passes them back as `routing` (replay).
  """
  model = nnx.merge(graphdef, params)
  x, cache, experts = model.features_and_routing(tokens, pos, cache, routing)
  return model.head_out(x), cache, experts


def positions_from_turns(turn_of_token: jax.Array) -> Positions:
  """Positions of a full conversation [B, L] laid out as in `types.Trajectories`.

  slot = offset of the token from the first token of its turn. Padding (turn −1) gets slot 0.
  """
  b, l = turn_of_token.shape
  position = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
  is_start = jnp.concatenate(
      [jnp.ones((b, 1), bool), turn_of_token[:, 1:] != turn_of_token[:, :-1]], axis=1)
  start = jax.lax.cummax(jnp.where(is_start, position, 0), axis=1)
  slot = jnp.where(turn_of_token >= 0, position - start, 0)
  return Positions(position=position, turn=jnp.maximum(turn_of_token, 0), slot=slot)
