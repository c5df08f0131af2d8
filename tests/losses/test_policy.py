"""Tests for agentrl_jax.losses.policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.losses import policy

MODES = policy.AGGREGATION_MODES
AGGREGATE = jax.jit(policy.aggregate, static_argnames=("mode", "max_len"))
SURROGATE = jax.jit(policy.clipped_surrogate_loss,
                    static_argnames=("clip_low", "clip_high", "dual_clip", "agg_mode", "max_len"))


def aggregate_loop(values, mask, mode, max_len=None):
  """NumPy reference for `aggregate`, one sequence at a time."""
  sums, counts = [], []
  for v, m in zip(values, mask):
    sums.append(sum(float(x) for x, keep in zip(v, m) if keep))
    counts.append(int(np.sum(m)))
  if mode == "token-mean":
    return sum(sums) / max(sum(counts), 1)
  if mode == "seq-mean-token-sum":
    return sum(sums) / len(sums)
  if mode == "seq-mean-token-mean":
    means = [s / c for s, c in zip(sums, counts) if c > 0]
    return sum(means) / max(len(means), 1)
  return sum(sums) / (values.shape[1] if max_len is None else max_len)


def surrogate_loop(logp, old_logp, adv, clip_low, clip_high, dual_clip):
  """NumPy reference for the per-token clipped surrogate."""
  out = np.zeros(logp.shape)
  for idx in np.ndindex(logp.shape):
    ratio = np.exp(np.clip(logp[idx] - old_logp[idx], -20, 20))
    a = adv[idx]
    loss = max(-a * ratio, -a * min(max(ratio, 1 - clip_low), 1 + clip_high))
    if dual_clip is not None and a < 0:
      loss = min(loss, -a * dual_clip)
    out[idx] = loss
  return out


def _case(seed, b=3, l=6):
  rng = np.random.RandomState(seed)
  logp = (-1.0 + 0.5 * rng.randn(b, l)).astype(np.float32)
  old_logp = (logp + 0.4 * rng.randn(b, l)).astype(np.float32)
  adv = rng.randn(b, l).astype(np.float32)
  mask = rng.rand(b, l) > 0.3
  mask[-1] = False  # an empty sequence
  return logp, old_logp, adv, mask


def test_aggregate_hand_checked():
  # Row sums 3 (two tokens) and 5 (one token); third row empty.
  v = jnp.array([[1.0, 2.0, 9.0], [5.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
  m = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
  np.testing.assert_allclose(AGGREGATE(v, m, "token-mean"), 8 / 3, rtol=1e-6)
  np.testing.assert_allclose(AGGREGATE(v, m, "seq-mean-token-sum"), 8 / 3, rtol=1e-6)
  np.testing.assert_allclose(AGGREGATE(v, m, "seq-mean-token-mean"), (1.5 + 5) / 2)
  np.testing.assert_allclose(AGGREGATE(v, m, "seq-mean-token-sum-norm", 16), 0.5)
  np.testing.assert_allclose(AGGREGATE(v, m, "seq-mean-token-sum-norm"), 8 / 3, rtol=1e-6)
  with pytest.raises(ValueError, match="unknown aggregation mode 'mean'"):
    policy.aggregate(v, m, "mean")


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_against_loop(mode):
  _, _, values, mask = _case(0)
  np.testing.assert_allclose(AGGREGATE(values, mask, mode, 10),
                             aggregate_loop(values, mask, mode, 10), rtol=1e-5)
  np.testing.assert_allclose(AGGREGATE(values, np.zeros_like(mask), mode), 0.0)


def test_surrogate_hand_checked():
  # ε = 0.2, c = 3. Token 0: A = 1, ratio e^0.5 ≈ 1.6487 -> clipped at 1.2: loss −1.2 (clipped).
  # Token 1: A = −1, ratio e^2 ≈ 7.389 -> max(7.389, 1.2) = 7.389, dual clip min(7.389, 3) = 3.
  # Token 2: A = 2, ratio 1 -> −2. token-mean = (−1.2 + 3 − 2)/3 = −0.0667.
  logp = jnp.array([[0.5, 2.0, 0.0]])
  old = jnp.zeros((1, 3))
  adv = jnp.array([[1.0, -1.0, 2.0]])
  out = policy.clipped_surrogate_loss(logp, old, adv, jnp.ones((1, 3), bool))
  np.testing.assert_allclose(out.loss, (-1.2 + 3.0 - 2.0) / 3, rtol=1e-6)
  # The ratio clip binds on token 0 only: on token 1 the unclipped term is the larger one (the dual
  # clip acts there instead).
  np.testing.assert_allclose(out.clip_fraction, 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(out.approx_kl, -(0.5 + 2.0) / 3, rtol=1e-6)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
@pytest.mark.parametrize("clip_high,dual_clip", [(0.2, 3.0), (0.28, None)])
def test_surrogate_against_loop(jit, clip_high, dual_clip):
  logp, old_logp, adv, mask = _case(1)

  def fn(*args):
    return policy.clipped_surrogate_loss(*args, clip_low=0.2, clip_high=clip_high,
                                         dual_clip=dual_clip, agg_mode="seq-mean-token-mean")

  out = (jax.jit(fn) if jit else fn)(logp, old_logp, adv, mask)
  per_token = surrogate_loop(logp, old_logp, adv, 0.2, clip_high, dual_clip)
  np.testing.assert_allclose(out.loss, aggregate_loop(per_token, mask, "seq-mean-token-mean"),
                             rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_ratio_one_gives_minus_aggregated_advantage(mode):
  logp, _, adv, mask = _case(2)
  out = SURROGATE(logp, logp, adv, mask, agg_mode=mode, max_len=8)
  np.testing.assert_allclose(out.loss, -AGGREGATE(adv, mask, mode, 8), rtol=1e-6)
  assert out.clip_fraction == 0 and out.approx_kl == 0


def test_clipped_tokens_have_zero_gradient():
  # Token 0: A > 0, ratio e^0.3 > 1.2. Token 1: A < 0, ratio e^−0.3 < 0.8. Token 2: A < 0 and the
  # dual clip is active (ratio e^2 > 3). Token 3: inside the trust region, gradient −A·ratio.
  logp = jnp.array([[0.3, -0.3, 2.0, 0.05]])
  adv = jnp.array([[1.0, -1.0, -1.0, 2.0]])
  grad = jax.jit(jax.grad(lambda lp: policy.clipped_surrogate_loss(
      lp, jnp.zeros((1, 4)), adv, jnp.ones((1, 4), bool), agg_mode="seq-mean-token-sum").loss))(
          logp)
  np.testing.assert_allclose(grad[0, :3], 0.0)
  np.testing.assert_allclose(grad[0, 3], -2.0 * np.exp(0.05), rtol=1e-6)


def test_dual_clip_bounds_negative_advantage_loss():
  rng = np.random.RandomState(3)
  logp = (3.0 * rng.randn(4, 8)).astype(np.float32)
  adv = -np.abs(rng.randn(4, 8)).astype(np.float32)
  per_token = surrogate_loop(logp, np.zeros_like(logp), adv, 0.2, 0.2, 3.0)
  assert np.all(per_token <= -adv * 3.0 + 1e-6)
  out = SURROGATE(logp, np.zeros_like(logp), adv, np.ones((4, 8), bool))
  assert out.loss <= np.mean(-adv * 3.0) + 1e-6
  with pytest.raises(ValueError, match="dual_clip"):
    policy.clipped_surrogate_loss(logp, logp, adv, np.ones((4, 8), bool), dual_clip=1.0)


def test_log_ratio_clamp_and_is_weights():
  # A log-ratio of 100 is clamped to 20, so the loss stays finite; the dual clip bounds it anyway.
  logp = jnp.array([[100.0, 0.0]])
  adv = jnp.array([[1.0, 1.0]])
  out = SURROGATE(logp, jnp.zeros((1, 2)), adv, jnp.ones((1, 2), bool),
                  is_weights=jnp.array([[0.5, 2.0]]))
  # Token 0: −1.2·0.5 = −0.6; token 1: −1·2 = −2; mean −1.3.
  np.testing.assert_allclose(out.loss, -1.3, rtol=1e-6)
  np.testing.assert_allclose(out.approx_kl, -10.0)


def test_masked_entropy_against_numpy():
  rng = np.random.RandomState(4)
  logits = rng.randn(2, 3, 5).astype(np.float32)
  logits[0, 0, 0] = -np.inf  # a banned token contributes nothing
  mask = np.array([[1, 1, 0], [0, 1, 1]], bool)
  out = jax.jit(policy.masked_entropy)(logits, mask)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)
  np.testing.assert_allclose(out, np.where(mask, want, 0), atol=1e-5)
  # Uniform over 4 tokens: log 4.
  np.testing.assert_allclose(jax.jit(policy.masked_entropy)(jnp.zeros((1, 1, 4)), jnp.ones((1, 1))),
                             [[np.log(4)]], rtol=1e-6)


def test_turn_mean_log_ratio_shares_one_ratio_per_turn():
  # Turn 0 = tokens 1, 2 with log-ratios 0.2, 0.4 -> 0.3; turn 1 = token 4 -> −0.5.
  logp = jnp.array([[9.0, 0.2, 0.4, 9.0, -0.5, 9.0]])
  old = jnp.zeros((1, 6))
  turn_of_token = jnp.array([[0, 0, 0, 1, 1, -1]], jnp.int32)
  mask = jnp.array([[0, 1, 1, 0, 1, 0]], bool)
  out = jax.jit(policy.turn_mean_log_ratio, static_argnums=4)(logp, old, turn_of_token, mask, 2)
  np.testing.assert_allclose(out, [[0, 0.3, 0.3, 0, -0.5, 0]], atol=1e-6)
  # The gradient of the turn ratio reaches every token of the turn equally (1/|turn|).
  grad = jax.jit(jax.grad(
      lambda lp: policy.turn_mean_log_ratio(lp, old, turn_of_token, mask, 2)[0, 1]))(logp)
  np.testing.assert_allclose(grad, [[0, 0.5, 0.5, 0, 0, 0]], atol=1e-6)


def test_dr_grpo_aggregation_gradient_does_not_depend_on_length():
  # seq-mean-token-sum-norm divides by the constant L_max: at ratio 1 every token's gradient is
  # −A/L_max, whether its sequence has 1 or 5 tokens (token-mean would give −A/6 to all here, and
  # seq-mean-token-mean −A/2 vs −A/10).
  mask = jnp.array([[1, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
  adv = jnp.ones((2, 5))
  logp = jnp.zeros((2, 5))
  grad = jax.jit(jax.grad(lambda lp: policy.clipped_surrogate_loss(
      lp, logp, adv, mask, agg_mode="seq-mean-token-sum-norm", max_len=8).loss))(logp)
  np.testing.assert_allclose(grad, np.where(mask, -1 / 8, 0), rtol=1e-6)


def test_sequence_ratio_clips_each_row_as_one():
  # Row 0: log-ratios 0.0, 0.4 -> shared 0.2, ratio e^0.2 = 1.2214 > 1.2, A = 1 on both tokens:
  # clipped at 1.2, loss per token -1.2. Row 1: log-ratio -0.1 alone (its other token is masked),
  # A = -1: loss e^-0.1 = 0.9048 (inside the clip range). token-mean over 3 tokens.
  # Per token instead, row 0's first token has ratio 1 (loss -1) and its second is clipped.
  logp = jnp.array([[0.0, 0.4], [-0.1, 5.0]])
  mask = jnp.array([[True, True], [True, False]])
  adv = jnp.array([[1.0, 1.0], [-1.0, -1.0]])
  out = policy.clipped_surrogate_loss(logp, jnp.zeros((2, 2)), adv, mask, dual_clip=None,
                                      ratio_level="sequence")
  np.testing.assert_allclose(out.loss, (-1.2 - 1.2 + np.exp(-0.1)) / 3, rtol=1e-5)
  token = policy.clipped_surrogate_loss(logp, jnp.zeros((2, 2)), adv, mask, dual_clip=None)
  np.testing.assert_allclose(token.loss, (-1.0 - 1.2 + np.exp(-0.1)) / 3, rtol=1e-5)
  with pytest.raises(ValueError, match="ratio_level"):
    policy.clipped_surrogate_loss(logp, logp, adv, mask, ratio_level="turns")
