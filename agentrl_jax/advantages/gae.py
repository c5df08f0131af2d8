"""Generalized advantage estimation over interleaved action/observation sequences.

docs/methods.md#ppo-gae (verl `compute_gae_advantage_return`, multi-turn version). The same kernel
runs over tokens `[B, L]` (mask = `action_mask`) and over turns `[B, N]` (mask = `turn_mask`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Numeric = chex.Numeric

GAE_METHODS = ("auto", "scan", "associative", "blocked")
# Token block of the "blocked" method (a multiple of 4, see _block_counts).
BLOCK = 8
# The blocked method forms A = Z − V/λ, so rounding in V grows by up to 1/λ ≤ 2; and ρ^−BLOCK
# must stay a normal float32 (1e-3^−8 = 1e24).
_MIN_BLOCKED_LAMBDA = 0.5
_MIN_BLOCKED_RHO = 1e-3
_MIN_BLOCKED_LENGTH = 64
# "auto" takes the per-step-discount blocked kernel from this many tokens (B·T) on.
_MIN_BLOCKED_VARYING_SIZE = 1 << 20


class GAEOutput(NamedTuple):
  """Advantages and value targets, both `[B, T]` float32, zero where `mask` is 0."""

  advantages: Array
  returns: Array


class _GAECarry(NamedTuple):
  next_value: Array  # [B] value of the next masked step (0 past the end).
  last_advantage: Array  # [B] advantage of the next masked step (0 past the end).


def _prepare(rewards, values, mask, discount, lambda_):
  chex.assert_rank([rewards, values, mask], 2)
  chex.assert_equal_shape([rewards, values, mask])
  chex.assert_type([rewards, values], float)
  dtype = jnp.promote_types(rewards.dtype, jnp.float32)
  rewards = rewards.astype(dtype)
  values = values.astype(dtype)
  mask = jnp.asarray(mask).astype(bool)
  # Scalars stay scalars: broadcasting them to [B, T] would add two full-size scan inputs.
  discount = jnp.asarray(discount, dtype)
  lambda_ = jnp.asarray(lambda_, dtype)
  if discount.ndim:
    discount = jnp.broadcast_to(discount, rewards.shape)
  if lambda_.ndim:
    lambda_ = jnp.broadcast_to(lambda_, rewards.shape)
  return rewards, values, mask, discount, lambda_


def _gae_scan(rewards, values, mask, discount, lambda_):
  """Reverse `lax.scan` over time; each step is a [B]-wide vector operation."""

  # Time-varying γ/λ are scanned over; scalar ones are closed over.
  per_step = {name: x.T for name, x in (("discount", discount), ("lambda_", lambda_)) if x.ndim}

  def step(carry: _GAECarry, xs) -> tuple[_GAECarry, Array]:
    r, v, m, varying = xs
    g = varying.get("discount", discount)
    lam = varying.get("lambda_", lambda_)
    delta = r + g * carry.next_value - v
    advantage = delta + g * lam * carry.last_advantage
    # Observation tokens are transparent: neither the value nor the advantage moves past them.
    carry = _GAECarry(
        next_value=jnp.where(m, v, carry.next_value),
        last_advantage=jnp.where(m, advantage, carry.last_advantage))
    return carry, carry.last_advantage

  zeros = jnp.zeros(rewards.shape[:1], rewards.dtype)
  xs = (rewards.T, values.T, mask.T, per_step)
  _, advantages = jax.lax.scan(step, _GAECarry(zeros, zeros), xs, reverse=True)
  return advantages.T


def _linear_recurrence(coefficient: Array, offset: Array) -> Array:
  """Solves `x_t = offset_t + coefficient_t * x_{t+1}` with `x_T = 0` along axis 1.

  Each step is the affine map `x ↦ offset + coefficient·x`; composing maps is associative, so
  `lax.associative_scan` evaluates the whole recursion in O(log T) depth.
  """

  def compose(later, earlier):
    # `later` holds maps for larger t (applied first when running backwards).
    c_late, o_late = later
    c_early, o_early = earlier
    return c_early * c_late, o_early + c_early * o_late

  _, x = jax.lax.associative_scan(compose, (coefficient, offset), reverse=True, axis=1)
  return x


def _gae_associative(rewards, values, mask, discount, lambda_):
  """The same recursion as two affine recurrences solved with `lax.associative_scan`."""
  zero = jnp.zeros_like(values)
  one = jnp.ones_like(values)
  # held_value_t = V of the first masked step at or after t (0 if none).
  held_value = _linear_recurrence(jnp.where(mask, zero, one), jnp.where(mask, values, zero))
  next_value = jnp.concatenate([held_value[:, 1:], zero[:, :1]], axis=1)
  delta = rewards + discount * next_value - values
  # lastA_t = delta_t + γλ·lastA_{t+1} on masked steps, lastA_{t+1} carried on the others.
  return _linear_recurrence(
      jnp.where(mask, discount * lambda_, one), jnp.where(mask, delta, zero))


def _integer_power(base: Array, exponent: Array, max_exponent: int) -> Array:
  """`base ** exponent` for int32 `exponent` in `[0, max_exponent]`, by binary powering.

  A handful of selects and multiplies that fuse into the surrounding elementwise kernel; cheaper
  than `exp(exponent · log base)` and exact for `base = 1`.
  """
  out = jnp.ones(exponent.shape, base.dtype)
  power = base
  for bit in range(max(int(max_exponent), 1).bit_length()):
    out = jnp.where((exponent >> bit) & 1, out * power, out)
    power = power * power
  return out


def _is_static_scalar(x) -> bool:
  return isinstance(x, (int, float, np.floating, np.integer))


def _blocked_supported(discount, lambda_) -> bool:
  """Whether the "blocked" method applies: a static scalar λ ≥ 0.5, and γ either a static scalar
  with γλ ≥ 1e-3 or an array (per-step discounts, `_gae_blocked_varying`)."""
  if not _is_static_scalar(lambda_) or float(lambda_) < _MIN_BLOCKED_LAMBDA:
    return False
  if _is_static_scalar(discount):
    return float(discount) * float(lambda_) >= _MIN_BLOCKED_RHO
  return True


def _block_counts(mask: Array) -> tuple[Array, Array]:
  """Per `[rows, block]` mask: masked tokens before each token in its block, and per block.

  Four 0/1 flags are packed one per byte of a uint32; multiplying by 0x01010101 leaves in byte k
  the number of flags set among bytes 0…k (at most 4, so no carry crosses a byte). This keeps the
  prefix count inside one elementwise kernel instead of a cumsum or a matmul over the mask.
  """
  rows, block = mask.shape
  quads = mask.reshape(rows, block // 4, 4).astype(jnp.uint32)
  byte_shift = jnp.uint32(8) * jnp.arange(4, dtype=jnp.uint32)
  packed = jnp.sum(quads << byte_shift, axis=-1)
  inclusive = ((packed * jnp.uint32(0x01010101))[:, :, None] >> byte_shift) & jnp.uint32(0xFF)
  inclusive = inclusive.astype(jnp.int32)
  quad_total = inclusive[:, :, 3]
  inclusive = inclusive + (jnp.cumsum(quad_total, axis=1) - quad_total)[:, :, None]
  inclusive = inclusive.reshape(rows, block)
  return inclusive - mask.astype(jnp.int32), inclusive[:, -1]


def _gae_blocked(rewards, values, mask, discount: float, lambda_: float, block: int = BLOCK):
  """GAE as one masked discounted sum, solved in blocks of `block` tokens with one small matmul.

  With ρ = γλ and κ = (1 − λ)/λ, the λ-return `G_t = r_t + γ((1 − λ)·nextV + λ·G_next)` gives
  `Z_t = G_t + κ·V_t` the one-term recursion `Z_t = u_t + ρ·Z_next` over masked steps, with
  `u = r + κ·V`, so `A_t = Z_t − V_t/λ` and `returns_t = A_t + V_t`: no held-value carry.
  Inside a block, with `c_j` the masked tokens before `j` in the block,

      Z_t = ρ^(−c_t) · (Σ_{j ≥ t in block} ρ^(c_j)·m_j·u_j  +  ρ^(c_end)·Z_next_block),

  where the sum is a matmul with a shared triangular matrix; only the block heads recur, in a
  `lax.scan` over `T/block` steps. Everything stays in the `[B, T]` layout: no transposes, which
  dominate the time-major scan on CPU. ρ^(−block) must stay a normal float32 and `V/λ` must not
  cancel badly, hence the bounds in `_blocked_supported`.
  """
  dtype = rewards.dtype
  batch, length = rewards.shape
  pad = (-length) % block
  if pad:
    widths = ((0, 0), (0, pad))
    rewards, values, mask = (jnp.pad(x, widths) for x in (rewards, values, mask))
  padded = length + pad
  rows = batch * padded // block
  r, v, m = (x.reshape(rows, block) for x in (rewards, values, mask))
  rho = jnp.asarray(discount * lambda_, dtype)
  kappa = jnp.asarray((1.0 - lambda_) / lambda_, dtype)
  before, total = _block_counts(m)
  weight = _integer_power(rho, before, block)
  # at_or_after[j, t] = [j >= t]: the within-block suffix sums.
  at_or_after = jnp.tril(jnp.ones((block, block), dtype))
  local = jnp.matmul(jnp.where(m, weight * (r + kappa * v), 0.0), at_or_after,
                     precision=jax.lax.Precision.HIGHEST)
  decay = _integer_power(rho, total, block)
  head = local[:, 0]

  def next_block(z_after, head_and_decay):
    h, d = head_and_decay
    return h + d * z_after, z_after

  _, z_after = jax.lax.scan(next_block, jnp.zeros((batch,), dtype),
                            (head.reshape(batch, -1).T, decay.reshape(batch, -1).T), reverse=True)
  z = (local + (z_after.T.reshape(rows) * decay)[:, None]) / weight
  advantages = jnp.where(m, z - v / lambda_, 0.0)
  returns = jnp.where(m, advantages + v, 0.0)

  def unpad(x):
    return x.reshape(batch, padded)[:, :length]

  return unpad(advantages), unpad(returns)


def _gae_blocked_varying(rewards, values, mask, discount, lambda_: float, block: int = BLOCK):
  """`_gae_blocked` with per-step discounts `γ_t` (episodes that end inside a row), same layout.

  With `c_t = γ_t·λ` on masked steps and 1 elsewhere, `Z_t = u_t + c_t·Z_next` as in
  `_gae_blocked`. A terminal step has `c_t = 0`, so a block holds several independent segments.
  With `p_t = Π_{i<t in block, c_i ≠ 0} c_i` (a prefix sum of `log c` by one triangular matmul,
  then `exp`), `e_t` the first zero of `c` at or after `t` in the block and
  `S_t = Σ_{j ≥ t in block} p_j·m_j·u_j` (a second matmul),

      Z_t = (S_t − S_{e_t + 1}) / p_t  +  [no zero in [t, block)] · (p_block / p_t) · Z_next_block,

  exact for every zero pattern: `S_{e_t+1}` removes the later segments, so no product crosses a
  zero and `p_t` is never 0. `e_t` comes from the zero flags packed into one integer per block
  (a count of trailing zeros), `S_{e_t+1}` from a gather inside the block. `p_t ≥ c_min^(block−1)`
  must stay a normal float32, so non-zero `c_t` below 1e-3 send the whole call (a `lax.cond`)
  to the time scan, which is exact for any discount.
  """
  dtype = rewards.dtype
  batch, length = rewards.shape
  pad = (-length) % block
  if pad:
    widths = ((0, 0), (0, pad))
    rewards, values, mask, discount = (jnp.pad(x, widths) for x in (rewards, values, mask,
                                                                    discount))
  padded = length + pad
  rows = batch * padded // block
  r, v, m, g = (x.reshape(rows, block) for x in (rewards, values, mask, discount))
  kappa = jnp.asarray((1.0 - lambda_) / lambda_, dtype)
  c = jnp.where(m, g * jnp.asarray(lambda_, dtype), 1.0)
  zero = c == 0
  log_c = jnp.log(jnp.where(zero, 1.0, c))
  highest = jax.lax.Precision.HIGHEST
  before = jnp.triu(jnp.ones((block, block), dtype), 1)  # [i, t] = [i < t]
  at_or_after = jnp.tril(jnp.ones((block, block), dtype))  # [j, t] = [j ≥ t]
  log_p = jnp.matmul(log_c, before, precision=highest)
  p = jnp.exp(log_p)
  p_block = jnp.exp(log_p[:, -1] + log_c[:, -1])
  suffix = jnp.matmul(jnp.where(m, p * (r + kappa * v), 0.0), at_or_after, precision=highest)
  # Bit t of `flags` is set where c_t = 0; exact powers of two, so the matvec is an exact integer.
  flags = jnp.matmul(zero.astype(dtype), 2.0 ** jnp.arange(block, dtype=dtype),
                     precision=highest).astype(jnp.int32)
  position = jnp.arange(block, dtype=jnp.int32)
  later = flags[:, None] >> position  # bit 0: c_t = 0; bit k: c_{t+k} = 0
  first_zero = jax.lax.population_count((later & -later) - 1)  # trailing zeros of `later`
  cut = jnp.where(later == 0, block, position + first_zero + 1)
  cut_sum = jnp.take_along_axis(
      jnp.concatenate([suffix, jnp.zeros((rows, 1), dtype)], axis=1), cut, axis=1)
  local = (suffix - cut_sum) / p
  reach = jnp.where(later == 0, p_block[:, None] / p, 0.0)

  def next_block(z_after, head_and_reach):
    h, d = head_and_reach
    return h + d * z_after, z_after

  _, z_after = jax.lax.scan(next_block, jnp.zeros((batch,), dtype),
                            (local[:, 0].reshape(batch, -1).T, reach[:, 0].reshape(batch, -1).T),
                            reverse=True)
  z = local + reach * z_after.T.reshape(rows)[:, None]
  advantages = jnp.where(m, z - v / lambda_, 0.0)
  returns = jnp.where(m, advantages + v, 0.0)

  def unpad(x):
    return x.reshape(batch, padded)[:, :length]

  return unpad(advantages), unpad(returns)


def _gae_blocked_or_scan(rewards, values, mask, discount, lambda_: float):
  """`_gae_blocked_varying` unless a non-zero `γ_t·λ` is below 1e-3; then the exact time scan."""
  c = discount * lambda_
  supported = jnp.all((c == 0) | (c >= _MIN_BLOCKED_RHO) | ~mask)

  def scan(r, v, m, g):
    advantages = _gae_scan(r, v, m, g, jnp.asarray(lambda_, r.dtype))
    advantages = jnp.where(m, advantages, 0.0)
    return advantages, jnp.where(m, advantages + v, 0.0)

  return jax.lax.cond(supported, functools.partial(_gae_blocked_varying, lambda_=lambda_), scan,
                      rewards, values, mask, discount)


def generalized_advantage_estimation(
    rewards: Array,
    values: Array,
    mask: Array,
    discount: Numeric,
    lambda_: Numeric,
    *,
    method: str = "auto",
) -> GAEOutput:
  """GAE(γ, λ) with transparent non-policy steps, vectorised over the batch.

  Runs backwards over `t = T−1 … 0`, carrying `nextV` and `lastA` (both 0 past the end):

      δ_t = r_t + γ_t · nextV − V_t
      a_t = δ_t + γ_t λ_t · lastA
      if mask_t: nextV ← V_t, lastA ← a_t        (otherwise both carry over unchanged)
      A_t = lastA,   returns_t = A_t + V_t

  A step with `mask_t = 0` (an environment/observation token, or padding) is invisible: it adds no
  TD error and no discount step, and its reward is ignored, so rewards must sit on masked steps
  (`token_rewards` puts a turn's reward on its last action token). Termination is expressed through
  `discount_t = γ·(1 − done_t)`; the final step bootstraps from 0. No whitening happens here; call
  `whiten.masked_whiten` on the result if wanted.

  Unlike verl, which writes `lastA` at every step, advantages and returns are 0 where `mask_t = 0`
  (padding carries no advantage).

  Time ranges: all of `rewards`, `values`, `mask` (and `discount`, `lambda_` if arrays) span
  `[0, T)`; `r_t` is the reward received after step `t`'s action and `V_t` the value before it.
  This differs from rlax, whose `values` span `[0, T]` with a bootstrap `V_T`; here `V_T = 0`.

  Reference: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
  Estimation", 2016; multi-turn masking as in verl.

  Args:
    rewards: `[B, T]` float rewards `r_t`.
    values: `[B, T]` float value estimates `V_t`.
    mask: `[B, T]` bool (or 0/1), 1 on policy steps.
    discount: γ, a scalar or an array broadcastable to `[B, T]`.
    lambda_: λ, a scalar or an array broadcastable to `[B, T]`.
    method: "scan" (reverse `lax.scan` over time, the batch as the vector dimension),
      "associative" (`lax.associative_scan`, two affine recurrences in O(log T) depth), "blocked"
      (`_gae_blocked`: a block matmul and a scan over T/8 block heads; needs a static scalar
      λ ≥ 0.5, and γ a static scalar with γλ ≥ 1e-3 or an array of per-step discounts, for which
      `_gae_blocked_varying` solves each block exactly across terminal steps), or "auto" (the
      default: "blocked" where it applies and T ≥ 64 — and B·T ≥ 2^20 for array discounts —,
      else "scan"). All agree to float rounding (1e-5 on unit-scale inputs). On CPU at
      [4096, 512] "blocked" is the fastest and "associative" the slowest (bench/advantages.py).

  Returns:
    `GAEOutput(advantages, returns)`, each `[B, T]` float32 (or wider), zero where `mask` is 0.
  """
  if method not in GAE_METHODS:
    raise ValueError(f"method must be one of {GAE_METHODS}, got {method!r}")
  blocked = _blocked_supported(discount, lambda_)
  if method == "blocked" and not blocked:
    raise ValueError(
        f"method 'blocked' needs a Python scalar lambda_ >= {_MIN_BLOCKED_LAMBDA} and a discount "
        f"array or a Python scalar with discount·lambda_ >= {_MIN_BLOCKED_RHO}; got "
        f"discount={discount!r}, lambda_={lambda_!r}")
  if method == "auto":
    # Short sequences (turn-level GAE) gain nothing from blocks; the scan is exact there. The
    # per-step-discount kernel does more work per token (a log, an exp, a gather) and only
    # overtakes the scan on large batches (CPU, bench/advantages.py).
    long_enough = jnp.ndim(rewards) == 2 and jnp.shape(rewards)[1] >= _MIN_BLOCKED_LENGTH
    if long_enough and not _is_static_scalar(discount):
      long_enough = int(np.prod(jnp.shape(rewards))) >= _MIN_BLOCKED_VARYING_SIZE
    method = "blocked" if blocked and long_enough else "scan"
  static_discount, static_lambda = discount, lambda_
  rewards, values, mask, discount, lambda_ = _prepare(rewards, values, mask, discount, lambda_)
  if method == "blocked":
    if _is_static_scalar(static_discount):
      advantages, returns = _gae_blocked(
          rewards, values, mask, float(static_discount), float(static_lambda))
    else:
      advantages, returns = _gae_blocked_or_scan(
          rewards, values, mask, jnp.broadcast_to(discount, rewards.shape), float(static_lambda))
    return GAEOutput(advantages=advantages, returns=returns)
  kernel = _gae_scan if method == "scan" else _gae_associative
  advantages = kernel(rewards, values, mask, discount, lambda_)
  advantages = jnp.where(mask, advantages, 0.0)
  returns = jnp.where(mask, advantages + values, 0.0)
  return GAEOutput(advantages=advantages, returns=returns)


def token_rewards(turn_reward: Array, turn_end: Array, turn_mask: Array, length: int) -> Array:
  """Places each turn's reward on the last action token of that turn.

  `out[b, turn_end[b, k] − 1] += turn_reward[b, k]` for every existing turn `k`; zero elsewhere.
  A turn with an empty action span (`turn_end ≤ 0`) or a span past `length` drops its reward.

  Args:
    turn_reward: `[B, N]` float reward received after turn `k`'s action.
    turn_end: `[B, N]` int exclusive end offset of turn `k`'s action span.
    turn_mask: `[B, N]` bool, which turns exist.
    length: L, the static token length.

  Returns:
    `[B, L]` rewards with the dtype of `turn_reward` promoted to at least float32.
  """
  chex.assert_rank([turn_reward, turn_end, turn_mask], 2)
  chex.assert_equal_shape([turn_reward, turn_end, turn_mask])
  chex.assert_type([turn_reward, turn_end], [float, int])
  dtype = jnp.promote_types(turn_reward.dtype, jnp.float32)
  batch = turn_reward.shape[0]
  position = turn_end - 1
  in_range = jnp.asarray(turn_mask).astype(bool) & (position >= 0) & (position < length)
  position = jnp.where(in_range, position, length)  # out of bounds: dropped by the scatter
  rows = jnp.broadcast_to(jnp.arange(batch)[:, None], position.shape)
  return jnp.zeros((batch, length), dtype).at[rows, position].add(
      turn_reward.astype(dtype), mode="drop")


def last_action_ends(turn_end: Array, action_mask: Array) -> Array:
  """`[B, N]` turn ends moved back to just after the last action token before them.

  A turn's span can end in tokens that are not the policy's (a thinking-close token the sampler
  forced); its reward then belongs to the last token the policy did sample. Spans that end in an
  action token are unchanged.
  """
  chex.assert_rank([turn_end, action_mask], 2)
  length = action_mask.shape[1]
  positions = jnp.arange(length, dtype=jnp.int32)
  last = jax.lax.cummax(jnp.where(action_mask, positions, -1), axis=1)
  at_end = jnp.take_along_axis(last, jnp.clip(turn_end - 1, 0, length - 1), axis=1)
  return jnp.where((turn_end > 0) & (at_end >= 0), at_end + 1, turn_end).astype(turn_end.dtype)


def turn_generalized_advantage_estimation(
    turn_rewards: Array,
    turn_values: Array,
    turn_mask: Array,
    discount: Numeric,
    lambda_: Numeric,
) -> GAEOutput:
  """Turn-level GAE over `[B, N]`: one TD step per existing turn.

  The recursion of `generalized_advantage_estimation` with `T = N`: `r_k` is the reward after turn
  `k`'s action, `V_k` the critic's value of the state before turn `k` (both over `[0, N)`), and
  turns with `turn_mask = 0` are skipped. Broadcast the result to tokens with
  `types.broadcast_turns_to_tokens`.

  Args:
    turn_rewards: `[B, N]` float.
    turn_values: `[B, N]` float.
    turn_mask: `[B, N]` bool.
    discount: γ per turn, scalar or `[B, N]` (e.g. `γ·(1 − done)`).
    lambda_: λ, scalar or `[B, N]`.

  Returns:
    `GAEOutput` of `[B, N]` arrays, zero on missing turns.
  """
  return generalized_advantage_estimation(turn_rewards, turn_values, turn_mask, discount, lambda_)
