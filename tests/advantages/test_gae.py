"""Tests for agentrl_jax.advantages.gae."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import gae

B, L = 3, 9
METHODS = ("scan", "associative", "blocked")
# Jitted once per method and reused, so equal shapes across tests share one compile. Scalar γ, λ
# are static (the blocked method needs a Python-number λ); array ones are traced.
_STATIC = {m: jax.jit(functools.partial(gae.generalized_advantage_estimation, method=m),
                      static_argnums=(3, 4)) for m in METHODS}
_TRACED = {m: jax.jit(functools.partial(gae.generalized_advantage_estimation, method=m))
           for m in METHODS}


_STATIC_LAMBDA = {m: jax.jit(functools.partial(gae.generalized_advantage_estimation, method=m),
                             static_argnums=4) for m in METHODS}


def run_gae(method, rewards, values, mask, discount, lambda_):
  if np.isscalar(lambda_):
    # The blocked method takes an array discount with a static λ (per-step termination).
    table = _STATIC if np.isscalar(discount) else _STATIC_LAMBDA
  else:
    table = _TRACED
  return table[method](rewards, values, mask, discount, lambda_)


GAE = {m: functools.partial(run_gae, m) for m in METHODS}


def _maybe_jit(fn, jit, **static):
  if not jit:
    return lambda *args: fn(*args, **static)
  return jax.jit(lambda *args: fn(*args, **static), static_argnums=(3, 4))


def gae_loop(rewards, values, mask, discount, lambda_):
  """NumPy reference: the methods.md#ppo-gae recursion written as a plain reverse loop, one row at a time."""
  b, t_len = rewards.shape
  discount = np.broadcast_to(discount, rewards.shape)
  lambda_ = np.broadcast_to(lambda_, rewards.shape)
  advantages = np.zeros((b, t_len), np.float64)
  for i in range(b):
    next_value, last_advantage = 0.0, 0.0
    for t in reversed(range(t_len)):
      delta = rewards[i, t] + discount[i, t] * next_value - values[i, t]
      a = delta + discount[i, t] * lambda_[i, t] * last_advantage
      if mask[i, t]:
        next_value, last_advantage = values[i, t], a
        advantages[i, t] = a
  returns = np.where(mask, advantages + values, 0.0)
  return advantages, returns


def _masks(rng):
  full = np.ones((B, L), bool)
  tail = np.arange(L)[None, :] < np.array([[L], [5], [2]])
  # Environment tokens in the middle of the action stream, plus an all-environment row.
  holes = np.array([[1, 1, 0, 0, 1, 1, 0, 1, 0],
                    [0, 0, 1, 1, 1, 0, 0, 0, 1],
                    [0, 0, 0, 0, 0, 0, 0, 0, 0]], bool)
  random = rng.rand(B, L) > 0.4
  return {"full": full, "tail": tail, "holes": holes, "random": random}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
def test_hand_checked(method, jit):
  # γ = λ = 0.5, token 1 is an observation token (value 9 must be skipped).
  # t=3: δ = 1 + 0.5·0 − 0.5 = 0.5;          a = 0.5
  # t=2: δ = 0 + 0.5·0.5 − 0.25 = 0;         a = 0 + 0.25·0.5 = 0.125
  # t=1: observation, carried (output 0)
  # t=0: δ = 0 + 0.5·0.25 − 0.5 = −0.375;    a = −0.375 + 0.25·0.125 = −0.34375
  rewards = jnp.array([[0.0, 5.0, 0.0, 1.0]])
  values = jnp.array([[0.5, 9.0, 0.25, 0.5]])
  mask = jnp.array([[1, 0, 1, 1]], bool)
  out = _maybe_jit(gae.generalized_advantage_estimation, jit, method=method)(
      rewards, values, mask, 0.5, 0.5)
  np.testing.assert_allclose(out.advantages, [[-0.34375, 0.0, 0.125, 0.5]], atol=1e-6)
  np.testing.assert_allclose(out.returns, [[0.15625, 0.0, 0.375, 1.0]], atol=1e-6)
  assert out.advantages.dtype == jnp.float32


@pytest.mark.parametrize("method", METHODS)
def test_matches_numpy_loop(method):
  rng = np.random.RandomState(0)
  fn = GAE[method]
  for name, mask in _masks(rng).items():
    rewards = rng.randn(B, L).astype(np.float32)
    values = rng.randn(B, L).astype(np.float32)
    # Per-token discounts exercise the array form (termination inside the row).
    discount = (0.97 * (rng.rand(B, L) > 0.2)).astype(np.float32)
    for gamma, lam in [(0.9, 0.8), (1.0, 1.0), (discount, 0.7)]:
      want_a, want_r = gae_loop(rewards, values, mask, gamma, lam)
      out = fn(rewards, values, mask, gamma, lam)
      np.testing.assert_allclose(out.advantages, want_a, atol=1e-5, err_msg=name)
      np.testing.assert_allclose(out.returns, want_r, atol=1e-5, err_msg=name)


def test_lambda_one_gamma_one_is_return_minus_value():
  rng = np.random.RandomState(1)
  mask = _masks(rng)["holes"]
  values = rng.randn(B, L).astype(np.float32)
  terminal_reward = np.array([2.0, -1.0, 3.0], np.float32)
  rewards = np.zeros((B, L), np.float32)
  for i in range(B):
    policy_tokens = np.flatnonzero(mask[i])
    if policy_tokens.size:
      rewards[i, policy_tokens[-1]] = terminal_reward[i]
  out = GAE["scan"](rewards, values, mask, 1.0, 1.0)
  want = np.where(mask, terminal_reward[:, None] - values, 0.0)
  np.testing.assert_allclose(out.advantages, want, atol=1e-5)


@pytest.mark.parametrize("method", METHODS)
def test_inserting_observation_tokens_leaves_policy_advantages_unchanged(method):
  rng = np.random.RandomState(2)
  rewards = rng.randn(2, 5).astype(np.float32)
  values = rng.randn(2, 5).astype(np.float32)
  mask = np.ones((2, 5), bool)
  base = GAE[method](rewards, values, mask, 0.9, 0.95)
  # Insert 3 observation tokens after policy token 1 and 2 after token 3, with arbitrary values
  # and rewards (an observation's reward is ignored by the skip rule).
  insert_at = [2, 2, 2, 4, 4]
  long_rewards = np.insert(rewards, insert_at, rng.randn(2, 5).astype(np.float32), axis=1)
  long_values = np.insert(values, insert_at, rng.randn(2, 5).astype(np.float32), axis=1)
  long_mask = np.insert(mask, insert_at, False, axis=1)
  out = GAE[method](long_rewards, long_values, long_mask, 0.9, 0.95)
  np.testing.assert_allclose(np.asarray(out.advantages)[long_mask].reshape(2, 5),
                             base.advantages, atol=1e-6)


def test_concatenated_episodes_equal_per_episode_results():
  rng = np.random.RandomState(3)
  r1, r2 = rng.randn(1, 4).astype(np.float32), rng.randn(1, 3).astype(np.float32)
  v1, v2 = rng.randn(1, 4).astype(np.float32), rng.randn(1, 3).astype(np.float32)
  m1, m2 = np.ones((1, 4), bool), np.array([[True, False, True]])
  e1 = GAE["scan"](r1, v1, m1, 0.9, 0.8)
  e2 = GAE["scan"](r2, v2, m2, 0.9, 0.8)
  # discount_t = γ·(1 − done_t): the last token of episode 1 does not bootstrap into episode 2.
  discount = np.full((1, 7), 0.9, np.float32)
  discount[0, 3] = 0.0
  both = GAE["scan"](
      np.concatenate([r1, r2], 1), np.concatenate([v1, v2], 1), np.concatenate([m1, m2], 1),
      discount, 0.8)
  np.testing.assert_allclose(both.advantages,
                             np.concatenate([e1.advantages, e2.advantages], 1), atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_no_retrace_on_new_values(method):
  chex.clear_trace_counter()  # the counter is keyed by the code of `run`, shared by the params

  @jax.jit
  @chex.assert_max_traces(n=1)
  def run(rewards, values, mask):  # γ, λ are Python constants: static by construction
    return gae.generalized_advantage_estimation(rewards, values, mask, 0.99, 0.95, method=method)

  rng = np.random.RandomState(4)
  for _ in range(3):
    run(rng.randn(B, L).astype(np.float32), rng.randn(B, L).astype(np.float32),
        rng.rand(B, L) > 0.4)


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.9, 0.5), (0.002, 0.5)])
def test_blocked_matches_scan_on_long_rows(gamma, lam):
  # Several blocks per row, a length that is not a multiple of the block, long masked and
  # unmasked runs (whole blocks without a policy token), γλ down to the supported bounds.
  rng = np.random.RandomState(8)
  b, t_len = 4, 8 * 9 + 5
  rewards = rng.randn(b, t_len).astype(np.float32)
  values = rng.randn(b, t_len).astype(np.float32)
  mask = rng.rand(b, t_len) > 0.5
  mask[0, 10:40] = False
  mask[1, :] = True
  mask[2, 30:] = False
  want_a, want_r = gae_loop(rewards, values, mask, gamma, lam)
  for method in ("blocked", "auto", "associative"):
    out = jax.jit(functools.partial(gae.generalized_advantage_estimation, method=method),
                  static_argnums=(3, 4))(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(out.advantages, want_a, atol=1e-5, err_msg=method)
    np.testing.assert_allclose(out.returns, want_r, atol=1e-5, err_msg=method)


def test_blocked_needs_static_scalars_and_auto_falls_back():
  rng = np.random.RandomState(9)
  rewards = rng.randn(2, 70).astype(np.float32)
  values = rng.randn(2, 70).astype(np.float32)
  mask = np.ones((2, 70), bool)
  discount = np.full((2, 70), 0.9, np.float32)
  with pytest.raises(ValueError, match="method 'blocked' needs a Python scalar lambda_"):
    gae.generalized_advantage_estimation(rewards, values, mask, 0.9, discount, method="blocked")
  with pytest.raises(ValueError, match=r"lambda_=0\.0"):
    gae.generalized_advantage_estimation(rewards, values, mask, 0.9, 0.0, method="blocked")
  # "auto" takes the scan for an array λ, λ = 0 (TD(0)) and small λ: the results stay exact.
  for gamma, lam in [(0.9, discount), (0.9, 0.0), (0.9, 0.2)]:
    out = gae.generalized_advantage_estimation(rewards, values, mask, gamma, lam)
    want_a, _ = gae_loop(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(out.advantages, want_a, atol=1e-5)


def test_contract_checks_and_bad_method():
  with pytest.raises(AssertionError):
    gae.generalized_advantage_estimation(jnp.zeros((2, 3)), jnp.zeros((2, 4)),
                                         jnp.ones((2, 3), bool), 1.0, 1.0)
  with pytest.raises(ValueError, match="method"):
    gae.generalized_advantage_estimation(jnp.zeros((1, 2)), jnp.zeros((1, 2)),
                                         jnp.ones((1, 2), bool), 1.0, 1.0, method="loop")


def test_token_rewards_places_reward_on_last_action_token():
  # Row 0: turn 0 acts on tokens [2, 4) -> reward at 3; turn 1 on [6, 8) -> reward at 7.
  # Row 1: turn 0 on [1, 2) -> reward at 1; turn 1 does not exist (its reward 5 is dropped).
  turn_reward = jnp.array([[0.5, 2.0], [1.0, 5.0]])
  turn_end = jnp.array([[4, 8], [2, 3]], jnp.int32)
  turn_mask = jnp.array([[True, True], [True, False]])
  out = jax.jit(gae.token_rewards, static_argnums=3)(turn_reward, turn_end, turn_mask, 8)
  want = np.zeros((2, 8), np.float32)
  want[0, 3], want[0, 7], want[1, 1] = 0.5, 2.0, 1.0
  np.testing.assert_array_equal(out, want)


def test_token_rewards_drops_empty_and_out_of_range_spans():
  turn_reward = jnp.array([[1.0, 2.0, 3.0]])
  turn_end = jnp.array([[0, 5, 9]], jnp.int32)  # end 0: empty span; end 9 > L = 6
  out = jax.jit(gae.token_rewards, static_argnums=3)(turn_reward, turn_end, jnp.ones((1, 3), bool), 6)
  np.testing.assert_array_equal(out, [[0, 0, 0, 0, 2.0, 0]])


def test_turn_level_gae_matches_loop():
  rng = np.random.RandomState(5)
  rewards = rng.randn(4, 5).astype(np.float32)
  values = rng.randn(4, 5).astype(np.float32)
  turn_mask = np.arange(5)[None, :] < np.array([[5], [3], [1], [0]])
  out = jax.jit(gae.turn_generalized_advantage_estimation)(rewards, values, turn_mask, 0.95, 0.9)
  want_a, want_r = gae_loop(rewards, values, turn_mask, 0.95, 0.9)
  np.testing.assert_allclose(out.advantages, want_a, atol=1e-5)
  np.testing.assert_allclose(out.returns, want_r, atol=1e-5)


def test_bfloat16_inputs_accumulate_in_float32():
  rng = np.random.RandomState(6)
  rewards = rng.randn(B, L).astype(np.float32)
  values = rng.randn(B, L).astype(np.float32)
  mask = _masks(rng)["holes"]
  out = GAE["scan"](jnp.asarray(rewards, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16), mask,
                    0.9, 0.8)
  assert out.advantages.dtype == jnp.float32
  as_bf16 = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in (rewards, values)]
  want, _ = gae_loop(*as_bf16, mask, 0.9, 0.8)
  np.testing.assert_allclose(out.advantages, want, atol=1e-5)


def test_last_action_ends_moves_rewards_off_forced_tokens():
  # Row 0: turn 0 spans tokens 1..3 but token 3 was forced (not an action) -> end 3 (after token
  # 2); turn 1 spans 5..6, both actions -> end 7 unchanged. Row 1: turn 0 ends at 0 (no turn).
  mask = jnp.array([[0, 1, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0, 0]], bool)
  turn_end = jnp.array([[4, 7], [0, 0]], jnp.int32)
  np.testing.assert_array_equal(gae.last_action_ends(turn_end, mask), [[3, 7], [0, 0]])
  rewards = gae.token_rewards(jnp.array([[1.0, 2.0], [0.0, 0.0]]), gae.last_action_ends(turn_end, mask),
                              jnp.ones((2, 2), bool), 8)
  np.testing.assert_array_equal(rewards[0], [0, 0, 1, 0, 0, 0, 2, 0])


def _done_discounts(rng, b, t_len, gamma, done_rate):
  """`γ·(1 − done)` with random done flags, plus the hard patterns for the blocked solve: a
  block of zeros, two zeros in a row, a zero on a block's first and last step."""
  done = rng.rand(b, t_len) < done_rate
  done[0, 16:24] = True
  done[1, 30:32] = True
  done[2, 40] = done[2, 47] = True
  return (gamma * (1.0 - done)).astype(np.float32)


@pytest.mark.parametrize("jit", [False, True], ids=["nojit", "jit"])
@pytest.mark.parametrize("lam", [0.95, 0.5, 1.0])
def test_blocked_per_step_discounts_match_loop(jit, lam):
  # Episodes end inside rows (done flags at 5% and the patterns above), masks with holes; the
  # blocked kernel must agree with the loop step for step, whatever the zeros' positions.
  rng = np.random.RandomState(11)
  b, t_len = 4, 8 * 12 + 3
  rewards = rng.randn(b, t_len).astype(np.float32)
  values = rng.randn(b, t_len).astype(np.float32)
  discount = _done_discounts(rng, b, t_len, 0.99, 0.05)
  for mask in (np.ones((b, t_len), bool), rng.rand(b, t_len) > 0.3):
    want_a, want_r = gae_loop(rewards, values, mask, discount, lam)
    fn = functools.partial(gae.generalized_advantage_estimation, lambda_=lam, method="blocked")
    fn = jax.jit(fn) if jit else fn
    out = fn(rewards, values, mask, discount)
    np.testing.assert_allclose(out.advantages, want_a, atol=1e-5)
    np.testing.assert_allclose(out.returns, want_r, atol=1e-5)


def test_blocked_per_step_discount_hand_checked():
  # One block, λ = 1, V = 0, r = 1 everywhere, γ_t = 0.5 but 0 at t = 2 and t = 5 (ends):
  # A_t = Σ over the rest of its episode of 0.5^k: t=2: 1, t=1: 1.5, t=0: 1.75; t=5: 1, t=4: 1.5,
  # t=3: 1.75; t=7 (row end, bootstrap 0): 1, t=6: 1.5.
  discount = np.array([[0.5, 0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.5]], np.float32)
  out = gae._gae_blocked(jnp.ones((1, 8)), jnp.zeros((1, 8)), jnp.ones((1, 8), bool),
                                 jnp.asarray(discount), 1.0)
  np.testing.assert_allclose(out[0], [[1.75, 1.5, 1.0, 1.75, 1.5, 1.0, 1.5, 1.0]], rtol=1e-6)
  # The same row split over chunks of 2 (zeros at a chunk's end and start) and of 3 (padded).
  for chunk in (2, 3):
    out = gae._gae_blocked(jnp.ones((1, 8)), jnp.zeros((1, 8)), jnp.ones((1, 8), bool),
                           jnp.asarray(discount), 1.0, chunk=chunk)
    np.testing.assert_allclose(out[0], [[1.75, 1.5, 1.0, 1.75, 1.5, 1.0, 1.5, 1.0]], rtol=1e-6)


def test_blocked_per_step_tiny_discount_is_exact():
  # γ_t λ = 1e-6: products across many tiny discounts underflow to 0 as the loop's do; the
  # chunked solve never divides by them, so the result is the loop's.
  rng = np.random.RandomState(12)
  rewards, values = rng.randn(2, 80).astype(np.float32), rng.randn(2, 80).astype(np.float32)
  mask = rng.rand(2, 80) > 0.2
  discount = np.full((2, 80), 0.99, np.float32)
  discount[:, 10:20] = 1e-6
  want_a, _ = gae_loop(rewards, values, mask, discount, 0.9)
  got = jax.jit(functools.partial(gae.generalized_advantage_estimation, lambda_=0.9))(
      rewards, values, mask, discount)
  np.testing.assert_allclose(got.advantages, want_a, atol=1e-5)
