"""Grouped-query attention core, computed one block of queries at a time, with its own backward.

A plain einsum attention materialises the [B, H, T, S] scores and walks over them 6-8 times
(scale, mask, max, exp, sum, divide, then again in the backward). On CPU those passes run from main
memory and dominated the learner step (measured: 41 ms of a 57 ms `small` layer forward at
16 x 256 tokens). Here a `lax.scan` over blocks of `block` queries keeps each block's scores in
cache, and a custom VJP recomputes them per block in the backward (as flash attention does)
instead of saving them, so no [B, H, T, S] tensor is ever stored. The scan runs over the
sequence, which is never sharded, so batch and head shardings pass through unchanged.

The mask and the ALiBi term are the caller's: `allowed` [B, T, S] says which keys each query may
read; `distance` [B, T, S] with `slopes` [KV, G] subtracts slope · distance from the scores. A
query with no allowed key attends uniformly to all keys, as a softmax over equal scores does.

`implementation` chooses the kernel: this blocked one, or `jax.nn.dot_product_attention` with
XLA's or cuDNN's implementation (`resolve_implementation` says which "auto" takes where, and
why). The three agree on every input, empty rows included (tests/models/test_attention_backends).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_NEG = float(jnp.finfo(jnp.float32).min)

# CPU blocks: at most CPU_BLOCK queries, halved until one block's f32 scores [B, H, block, S] fit
# in CPU_SCORE_BYTES, so they stay in cache. Measured on the `small` learner update: at 16 x 256
# tokens blocks of 16 (2 MiB of scores) beat 8 and 32 and the whole sequence by 6x in the
# forward; at 32 x 512, blocks of 8 (4 MiB) reach 47% of matmul peak where 16 (8 MiB) reach 39%.
CPU_BLOCK = 16
CPU_SCORE_BYTES = 4 << 20


def default_block(length: int, batch: int = 1, heads: int = 1, keys: int | None = None) -> int:
  """Queries per block: sized to the cache on CPU; the whole sequence on accelerators."""
  if jax.default_backend() != "cpu":
    return length
  keys = length if keys is None else keys
  block = CPU_BLOCK
  while block > 1 and batch * heads * block * keys * 4 > CPU_SCORE_BYTES:
    block //= 2
  return min(length, block)


IMPLEMENTATIONS = ("auto", "blocked", "xla", "cudnn")


def resolve_implementation(name: str, dtype, alibi: bool, backend: str | None = None,
                           shape: tuple[int, int, int] | None = None) -> str:
  """The kernel `name` means here: "blocked", "xla" or "cudnn" (an explicit choice is kept).

  "auto" is the blocked kernel on CPU, where it was measured fastest (module docstring) and where
  it keeps every output as it was. Elsewhere it is `jax.nn.dot_product_attention`: cuDNN's flash
  attention on GPU for bfloat16/float16 without ALiBi, XLA's otherwise. cuDNN computes in half
  precision only, and takes an additive bias in the compute dtype: ALiBi's slope · distance in
  bfloat16 keeps 8 significant bits (off by up to 0.5 at 0.5 · 500 = 250, a factor e^0.5 on that
  key's weight), so ALiBi models stay on XLA's float32 scores. cuDNN also
  refuses some shapes, so "auto" takes it only where it accepts the shape whether or not it is
  differentiated: `shape` = (queries, keys, head_dim) with a head dim a multiple of 8 up to 128 and
  even lengths (a boolean mask reaches cuDNN as a bias, and its backward with a bias wants them).

  Args:
    name: one of IMPLEMENTATIONS.
    dtype: the compute dtype of queries, keys and values.
    alibi: whether the scores carry an ALiBi bias.
    backend: `jax.default_backend()` if None; passed in by tests.
    shape: (T, S, D) of the call; None: a shape cuDNN accepts.
  """
  if name not in IMPLEMENTATIONS:
    raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, got {name!r}")
  if name != "auto":
    return name
  backend = jax.default_backend() if backend is None else backend
  if backend == "cpu":
    return "blocked"
  t, s, d = (2, 2, 64) if shape is None else shape
  fits = d % 8 == 0 and d <= 128 and t % 2 == 0 and s % 2 == 0
  half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  return "cudnn" if backend in ("gpu", "cuda") and half and not alibi and fits else "xla"


def attend(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array,
           distance: jax.Array | None = None, slopes: jax.Array | None = None,
           block: int | None = None, implementation: str = "blocked") -> jax.Array:
  """softmax(q·kᵀ/√D − slope·distance, masked) · v for every query.

  Args:
    q: [B, T, KV, G, D] queries, G query heads per key/value head.
    k, v: [B, KV, S, D] keys and values, heads-major (the KV cache's layout).
    allowed: [B, T, S] bool, which keys each query may attend to.
    distance, slopes: ALiBi, [B, T, S] and [KV, G], or both None.
    block: queries per scan step (None: `default_block`); the blocked kernel only.
    implementation: "blocked" (this module's kernel), "xla" or "cudnn"
      (`jax.nn.dot_product_attention`); "auto" goes through `resolve_implementation`.
  Returns:
    [B, T, KV, G, D] in q's dtype.
  """
  if (distance is None) != (slopes is None):
    raise ValueError("attend needs both distance and slopes for ALiBi, or neither")
  implementation = resolve_implementation(implementation, q.dtype, distance is not None,
                                          shape=(q.shape[1], k.shape[2], q.shape[-1]))
  if implementation != "blocked":
    return _dot_product(q, k, v, allowed, distance, slopes, implementation)
  t = q.shape[1]
  if block is None:
    block = default_block(t, q.shape[0], q.shape[2] * q.shape[3], k.shape[2])
  block = min(block, t)
  if block <= 0:
    raise ValueError(f"attention block must be positive, got {block}")
  if distance is not None:
    distance, slopes = distance.astype(jnp.float32), slopes.astype(jnp.float32)
  return _attend(q, k, v, allowed, distance, slopes, block)


def _dot_product(q, k, v, allowed, distance, slopes, implementation):
  """`attend` through `jax.nn.dot_product_attention` (GQA: query head kv·G + g reads kv head kv).

  A query with no allowed key gets a zero query, every key allowed and no bias: equal scores, so it
  attends uniformly, as in the blocked kernel, and its query gets no gradient there either (its
  keys none: q = 0). jax.nn's XLA path would give the same from its large negative fill; cuDNN's
  treatment of an empty row is its own, and one path for both is the one tested on CPU.
  """
  b, t, kv, g, d = q.shape
  empty = ~jnp.any(allowed, axis=-1)  # [B, T]
  query = jnp.where(empty[:, :, None, None, None], 0, q).reshape(b, t, kv * g, d)
  mask = (allowed | empty[:, :, None])[:, None]  # [B, 1, T, S]: every head
  bias = None
  if distance is not None:
    bias = -slopes.astype(jnp.float32).reshape(-1)[None, :, None, None] * (
        distance.astype(jnp.float32)[:, None])  # [B, N, T, S]
    bias = jnp.where(empty[:, None, :, None], 0.0, bias)
    if implementation == "cudnn":  # cuDNN takes the bias in the compute dtype
      bias = bias.astype(q.dtype)
  out = jax.nn.dot_product_attention(query, jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), bias,
                                     mask, implementation=implementation)
  return out.reshape(q.shape)


def _to_blocks(x: jax.Array, block: int, fill, axis: int = 1) -> jax.Array:
  """Splits `axis` (length T) into blocks: [..., T, ...] -> [T/block, ..., block, ...].

  T is padded up to a multiple of `block` with `fill`.
  """
  t = x.shape[axis]
  pad = -t % block
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths, constant_values=fill)
  x = x.reshape(*x.shape[:axis], (t + pad) // block, block, *x.shape[axis + 1:])
  return jnp.moveaxis(x, axis, 0)


def _from_blocks(x: jax.Array, t: int, axis: int) -> jax.Array:
  """Inverse of `_to_blocks`, dropping the padding."""
  x = jnp.moveaxis(x, 0, axis)
  x = x.reshape(*x.shape[:axis], -1, *x.shape[axis + 2:])
  return jax.lax.slice_in_dim(x, 0, t, axis=axis)


# Inside the kernel queries are [B, KV, T, G, D] and keys/values [B, KV, S, D]: each block's
# products are then plain batched matmuls over (B, KV), [block·G, D] x [D, S], which XLA:CPU runs
# at matmul speed (the [B, T, KV, G, D] einsums ran 3-7x slower from their transposes).
# Keys/values come heads-major already: a decode step reads the cache without copying it.
def _heads_major(q):
  return jnp.moveaxis(q, 1, 2)  # [B, T, KV, G, D] -> [B, KV, T, G, D]


def _rows(x):
  """[B, KV, block, G, D] -> [B, KV, block·G, D] (row r = query r // G, head r % G)."""
  return x.reshape(*x.shape[:2], -1, x.shape[-1])


def _rows_n(x):
  """[n, B, KV, block, G, D] -> [n, B, KV, block·G, D]."""
  return x.reshape(*x.shape[:3], -1, x.shape[-1])


def _scores(qb, keys, mask, dist, slopes, scale, transposed):
  """Masked scores of one block, [B, KV, block, G, S] float32.

  qb: [B, KV, block, G, D]; mask, dist: [B, block, S]; slopes: [KV, G]. keys: [B, KV, D, S] if
  `transposed` (the loop over many blocks transposes once, then runs plain matmuls), else
  [B, KV, S, D] read as is (one block, e.g. a decode step: no per-step copy of the cache).
  """
  b, kv, n, g, _ = qb.shape
  if transposed:
    s = jnp.matmul(_rows(qb), keys, preferred_element_type=jnp.float32)
  else:
    s = jnp.einsum("bkrd,bksd->bkrs", _rows(qb), keys, preferred_element_type=jnp.float32)
  s = s.reshape(b, kv, n, g, -1) * scale
  if dist is not None:
    s = s - slopes[None, :, None, :, None] * dist[:, None, :, None, :]
  return jnp.where(mask[:, None, :, None, :], s, _NEG)


def _block_inputs(q, allowed, distance, block):
  """Per-block queries [n, B, KV, block, G, D], masks, distances (None without ALiBi)."""
  dists = None if distance is None else _to_blocks(distance, block, 0)
  return _to_blocks(_heads_major(q), block, 0, axis=2), _to_blocks(allowed, block, False), dists


def _forward(q, k, v, allowed, distance, slopes, block):
  """Output [B, T, KV, G, D] and the softmax statistics (row max, 1/row sum) per block."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  qs, masks, dists = _block_inputs(q, allowed, distance, block)
  looped = qs.shape[0] > 1
  keys = jnp.swapaxes(k, 2, 3) if looped else k

  def step(_, xs):
    qb, mask, dist = xs
    s = _scores(qb, keys, mask, dist, slopes, scale, looped)
    m = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.exp(s - m)
    inv = 1.0 / jnp.sum(e, axis=-1, keepdims=True)
    out = jnp.matmul(_rows(e.astype(v.dtype)), v, preferred_element_type=jnp.float32)
    out = out.reshape(qb.shape) * inv
    return None, (out.astype(q.dtype), m, inv)

  if not looped:  # one block (a decode step, or accelerators): no loop around it
    _, (out, m, inv) = step(None, jax.tree.map(lambda x: x[0], (qs, masks, dists)))
    out, m, inv = (x[None] for x in (out, m, inv))
  else:
    _, (out, m, inv) = jax.lax.scan(step, None, (qs, masks, dists))
  return jnp.moveaxis(_from_blocks(out, q.shape[1], axis=2), 2, 1), (m, inv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attend(q, k, v, allowed, distance, slopes, block):
  return _forward(q, k, v, allowed, distance, slopes, block)[0]


def _attend_fwd(q, k, v, allowed, distance, slopes, block):
  out, stats = _forward(q, k, v, allowed, distance, slopes, block)
  return out, (q, k, v, allowed, distance, slopes, out, stats)


def _attend_bwd(block, residuals, d_out):
  q, k, v, allowed, distance, slopes, out, (m, inv) = residuals
  scale = 1.0 / math.sqrt(q.shape[-1])
  f32 = jnp.float32
  # The products' operands in the compute dtype, summed in float32 (with bfloat16 operands
  # XLA:CPU's matmuls run 2-3x faster than with float32 ones, as on accelerators); in float32
  # this is the float32 kernel as before. The softmax's own arithmetic stays float32.
  cd = q.dtype
  mm = functools.partial(jnp.matmul, preferred_element_type=f32)
  km = k.astype(cd)
  kt, vt = jnp.swapaxes(km, 2, 3), jnp.swapaxes(v.astype(cd), 2, 3)
  qs, masks, dists = _block_inputs(q, allowed, distance, block)
  d_out = d_out.astype(f32)
  d_outs = _to_blocks(_heads_major(d_out.astype(cd)), block, 0, axis=2)
  # Queries and output gradients also transposed, [n, B, KV, D, block·G], here rather than in
  # the loop: dVᵀ += dOᵀ·P and dKᵀ += Qᵀ·dS are then plain matmuls. (A transpose next to the
  # matmul would be folded into it, and XLA:CPU runs that transposed-operand form 2x slower.)
  cols = lambda x: jnp.swapaxes(_rows_n(x), -1, -2)
  qts, d_outs_t = cols(qs), cols(d_outs)
  # delta = Σ_d dO·O, the softmax backward's row term: [n, B, KV, block, G, 1].
  delta = jnp.sum(d_out * out.astype(f32), axis=-1, keepdims=True)
  deltas = _to_blocks(_heads_major(delta), block, 0, axis=2)

  def step(carry, xs):
    dkt, dvt = carry
    qb, qt, mask, dist, dob, dot, delta_b, mb, invb = xs
    s = _scores(qb, kt, mask, dist, slopes, scale, True)
    p = jnp.exp(s - mb) * invb  # [B, KV, block, G, S]
    shape = p.shape
    rows = lambda x: x.reshape(*shape[:2], -1, x.shape[-1])  # [B, KV, block·G, S or D]
    dvt = dvt + mm(dot, rows(p).astype(cd))
    dp = mm(rows(dob), vt).reshape(shape)
    ds = p * (dp - delta_b)
    ds = rows(jnp.where(mask[:, None, :, None, :], ds, 0.0) * scale).astype(cd)
    dq = mm(ds, km).reshape(qb.shape)
    dkt = dkt + mm(qt, ds)
    return (dkt, dvt), dq.astype(q.dtype)

  zeros = jnp.zeros(kt.shape, f32)
  (dkt, dvt), dqs = jax.lax.scan(
      step, (zeros, zeros), (qs, qts, masks, dists, d_outs, d_outs_t, deltas, m, inv))
  dq = jnp.moveaxis(_from_blocks(dqs, q.shape[1], axis=2), 2, 1)
  dk, dv = (jnp.swapaxes(x, 2, 3).astype(y.dtype) for x, y in ((dkt, k), (dvt, v)))
  # The mask, distances and slopes are inputs, not parameters: no gradient reaches them.
  return (dq, dk, dv, None, None, None)


_attend.defvjp(_attend_fwd, _attend_bwd)
