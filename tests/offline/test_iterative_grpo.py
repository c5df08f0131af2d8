"""Tests of Iterative GRPO: Monte-Carlo turn returns, the Q fit, the candidate batch."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl_jax import types
from agentrl_jax.models import transformer
from agentrl_jax.offline import iterative_grpo as ig

OBS, ACT, GOOD, BAD = 1, 2, 5, 6


def test_monte_carlo_returns_match_loop():
  rng = np.random.default_rng(0)
  reward = rng.normal(size=(5, 6)).astype(np.float32)
  lengths = rng.integers(0, 7, size=5)
  mask = np.arange(6)[None] < lengths[:, None]
  out = np.asarray(jax.jit(ig.monte_carlo_turn_returns, static_argnums=2)(reward, mask, 0.9))
  ref = np.zeros_like(reward)
  for b in range(5):
    g = 0.0
    for t in reversed(range(lengths[b])):
      g = reward[b, t] + 0.9 * g
      ref[b, t] = g
  np.testing.assert_allclose(out, ref, atol=1e-5)


def _synthetic(rng, b=32):
  """Two-turn episodes [obs c act a][obs c act a] whose agent repeats its first action.

  r_t = 1 iff a_t is GOOD, so the returns (γ = 1) are known from the history up to each action:
  G_1 = r_1 and G_0 = r_0 + r_1 = 2·[a_0 = GOOD].
  """
  t = types.empty_trajectories(b, 8, 2)
  actions = np.repeat(rng.choice([GOOD, BAD], size=(b, 1)), 2, axis=1)
  for i in range(b):
    for k in range(2):
      o = 4 * k
      t.tokens[i, o:o + 4] = [OBS, 3 + k * 4, ACT, actions[i, k]]
      t.turn_of_token[i, o:o + 4] = k
      t.action_mask[i, o + 3] = True
      t.turn_start[i, k], t.turn_end[i, k] = o + 3, o + 4
  t.turn_mask[:] = True
  t.reward[:] = (actions == GOOD).astype(np.float32)
  return t


def test_q_fit_recovers_known_returns():
  rng = np.random.default_rng(0)
  cfg = transformer.TransformerConfig(vocab_size=16, num_layers=1, d_model=32, num_heads=2,
                                      mlp_dim=64, head="value")
  graphdef, params = transformer.create(cfg, 0)
  opt = optax.adam(1e-2)
  fit = ig.make_q_fit_fn(graphdef, opt, gamma=1.0, kind="mse")
  train = jax.tree.map(jnp.asarray, _synthetic(rng))
  state = opt.init(params)
  for _ in range(200):
    params, state, loss = fit(params, state, train)
  test = jax.tree.map(jnp.asarray, _synthetic(np.random.default_rng(1)))
  q = ig.turn_q_values(graphdef, params, test.tokens, test.turn_of_token, test.turn_end - 1)
  target = ig.monte_carlo_turn_returns(test.reward, test.turn_mask, 1.0)
  assert float(loss) < 0.01
  np.testing.assert_allclose(q, target, atol=0.15)


def test_candidate_batch_is_single_action_grpo_rows_scored_by_q():
  rng = np.random.default_rng(0)
  cfg = transformer.TransformerConfig(vocab_size=16, num_layers=1, d_model=16, num_heads=2, mlp_dim=32)
  pg, pp = transformer.create(cfg, 0)
  qg, qp = transformer.create(dataclasses.replace(cfg, head="value"), 1)
  data = _synthetic(rng, b=4)
  ctx = ig.logged_contexts(data)
  assert len(ctx.row) == 8 and set(ctx.start) == {3, 7}
  allowed = jnp.zeros(16, bool).at[jnp.array([GOOD, BAD])].set(True)
  build = ig.make_candidate_fn(pg, qg, allowed, 1.0, candidates=3, max_turns=2, q_loss="mse")
  out = build(pp, qp, jnp.asarray(data.tokens[ctx.row]), jnp.asarray(data.turn_of_token[ctx.row]),
              jnp.asarray(ctx.start), jnp.asarray(ctx.turn), jax.random.key(0))
  out = jax.tree.map(np.asarray, out)
  assert out.tokens.shape == (24, 8)
  np.testing.assert_array_equal(out.action_mask.sum(axis=1), 1)
  np.testing.assert_array_equal(out.group_id, np.repeat(np.arange(8), 3))
  pos = np.repeat(ctx.start, 3)
  picked = out.tokens[np.arange(24), pos]
  assert set(picked) <= {GOOD, BAD}
  # The history before the action is kept, everything after it is padding.
  for r in range(24):
    np.testing.assert_array_equal(out.tokens[r, :pos[r]], data.tokens[ctx.row[r // 3], :pos[r]])
    assert (out.turn_of_token[r, pos[r] + 1:] == -1).all()
  q = ig.turn_q_values(qg, qp, out.tokens, out.turn_of_token, jnp.asarray(pos)[:, None])[:, 0]
  np.testing.assert_allclose(out.outcome, q, atol=1e-5)
