"""Tests of Iterative GRPO: Monte-Carlo turn returns, the Q fit, the candidate batch."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax import types
from agentrl_jax.models import distribution
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


# ---------------------------------------------------------------------------------------------
# Policy improvement (the GRPO phase against Q): improves, ignores a shift of Q, steps no env.

from agentrl_jax.advantages import estimators  # noqa: E402
from agentrl_jax.envs import base as envs_base  # noqa: E402
from agentrl_jax.learner import pipeline  # noqa: E402
from agentrl_jax.learner import step as step_lib  # noqa: E402

_POLICY = transformer.TransformerConfig(vocab_size=16, num_layers=1, d_model=16, num_heads=2,
                                        mlp_dim=32)
_ALLOWED = jnp.zeros(16, bool).at[jnp.array([GOOD, BAD])].set(True)
_IMPROVE = ig.IterativeGRPOConfig(candidates=4, contexts_per_step=8, improve_steps=8)


@functools.lru_cache(maxsize=1)  # fitted once for the three tests; nothing donates its params
def _toy_mdp_q():
  """The toy MDP's Q: a value head fitted on `_synthetic` episodes (Q ≈ 1 + [a = GOOD] at turn 1
  of a GOOD episode, 2·[a = GOOD] at turn 0), as `test_q_fit_recovers_known_returns` checks."""
  cfg = dataclasses.replace(_POLICY, d_model=32, mlp_dim=64, head="value")
  graphdef, params = transformer.create(cfg, 0)
  opt = optax.adam(1e-2)
  fit = ig.make_q_fit_fn(graphdef, opt, gamma=1.0, kind="mse")
  train = jax.tree.map(jnp.asarray, _synthetic(np.random.default_rng(0)))
  state = opt.init(params)
  for _ in range(150):
    params, state, _ = fit(params, state, train)
  return graphdef, params


def _improver(q_graphdef, q_shift=0.0):
  """(state, build, update) for `_improve_policy`, as `train` wires them; `q_shift` adds a
  constant to every Q the candidate batch carries."""
  graphdef, params = transformer.create(_POLICY, 3)
  opt = optax.sgd(0.5)
  grpo = functools.partial(estimators.get_estimator("grpo"),
                           num_groups=_IMPROVE.contexts_per_step)
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=opt,
      critic_optimizer=None, advantage_fn=pipeline.CreditPipeline(estimator=grpo),
      loss=step_lib.LossConfig(kl_coef=0.01), allowed=_ALLOWED, temperature=1.0, max_actions=1)
  build_q = ig.make_candidate_fn(graphdef, q_graphdef, _ALLOWED, 1.0, _IMPROVE.candidates,
                                 max_turns=2, q_loss="mse")

  def build(*args):
    batch = build_q(*args)
    return batch.replace(outcome=batch.outcome + q_shift)

  def make_state(q_params):
    # Fresh copies: the update donates the state's buffers.
    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    return types.ActorCriticState(
        step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(2)),
        policy_params=copy(params), policy_opt_state=opt.init(copy(params)),
        critic_params=copy(q_params), critic_opt_state=None, ref_params=copy(params))

  return graphdef, make_state, build, update


def _good_probability(graphdef, params, data):
  """Mean π(GOOD | h) over the logged contexts of `data`."""
  ctx = ig.logged_contexts(data)
  model = nnx.merge(graphdef, params)
  tokens = jnp.asarray(data.tokens[ctx.row])
  turns = jnp.where(jnp.arange(tokens.shape[1])[None] < ctx.start[:, None],
                    jnp.asarray(data.turn_of_token[ctx.row]), -1)
  tokens = jnp.where(turns >= 0, tokens, 0)
  features, _ = model.features(tokens, transformer.positions_from_turns(turns))
  prev = jnp.take_along_axis(features, jnp.asarray(ctx.start - 1)[:, None, None], axis=1)
  logp = distribution.policy_log_probs(model.head_out(prev)[:, 0], _ALLOWED, 1.0)
  return float(jnp.mean(jnp.exp(logp[:, GOOD])))


def _improve(make_state, build, update, q_params, data):
  state = make_state(q_params)
  state, metrics = ig._improve_policy(state, update, build, data, _IMPROVE, jax.random.key(7))
  return state, metrics


def test_improvement_raises_the_probability_of_the_better_action():
  q_graphdef, q_params = _toy_mdp_q()
  graphdef, make_state, build, update = _improver(q_graphdef)
  data = _synthetic(np.random.default_rng(5), b=16)
  before = _good_probability(graphdef, make_state(q_params).policy_params, data)
  state, metrics = _improve(make_state, build, update, q_params, data)
  after = _good_probability(graphdef, state.policy_params, data)
  # Q prefers GOOD by ≈ 1 at every context, so GRPO against Q moves π toward GOOD.
  assert 0.3 < before < 0.7, before
  assert after > before + 0.1, (before, after)
  assert np.isfinite(metrics["improve/q_reward"])


def test_improvement_is_invariant_to_a_shift_of_q():
  # GRPO sees Q only through s − mean_g (and the std): Q + 5 gives the same update.
  q_graphdef, q_params = _toy_mdp_q()
  data = _synthetic(np.random.default_rng(6), b=16)
  results = []
  for shift in (0.0, 5.0):
    _, make_state, build, update = _improver(q_graphdef, q_shift=shift)
    state, metrics = _improve(make_state, build, update, q_params, data)
    results.append((state.policy_params, metrics["improve/q_reward"]))
  (params0, reward0), (params5, reward5) = results
  np.testing.assert_allclose(reward5 - reward0, 5.0, rtol=1e-5)  # the shift did reach Q
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                       make_state(q_params).policy_params, params0))
  assert max(moved) > 1e-3  # the update is not trivially zero
  for a, b in zip(jax.tree.leaves(params0), jax.tree.leaves(params5)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_improvement_steps_no_environment(monkeypatch):
  # Policy improvement scores candidates with Q only: an env that raises on any use, and a
  # rollout that raises if called, leave it untouched.
  def refuse(*args, **kwargs):
    raise RuntimeError("the improvement phase stepped an environment")

  monkeypatch.setattr(envs_base.TextEnv, "step", refuse)
  monkeypatch.setattr(envs_base.TextEnv, "reset", refuse)
  monkeypatch.setattr(ig.common, "collect", refuse)
  monkeypatch.setattr(ig.loop_lib, "RolloutRunner", refuse, raising=False)
  q_graphdef, q_params = _toy_mdp_q()
  graphdef, make_state, build, update = _improver(q_graphdef)
  data = _synthetic(np.random.default_rng(8), b=16)
  state, metrics = _improve(make_state, build, update, q_params, data)
  assert int(state.step) == _IMPROVE.improve_steps
  assert _good_probability(graphdef, state.policy_params, data) > _good_probability(
      graphdef, make_state(q_params).policy_params, data)
