"""RTPO reverse-turn updates on sparse reverse trees (docs/methods.md#rtpo)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax.advantages import estimators
from agentrl_jax.envs import base
from agentrl_jax.envs import registry
from agentrl_jax.learner import step as step_lib
from agentrl_jax import types
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.offline import rtpo as rtpo_train
from agentrl_jax.rollout.strategies import rtpo

import one_step_env

TASKS = 2
CONFIG = rtpo_train.RTPOConfig(num_roots=3, branches=3, max_prefixes=2)
SIZE = TASKS * CONFIG.max_prefixes * CONFIG.branches


def _make_env():
  return registry.make("frozenlake")


@pytest.fixture(scope="module")
def update(word_runner, model):
  sampling = word_runner.config.sampling
  return rtpo_train.make_rtpo_update(
      # The entropy bonus moves the parameters at every depth, even when a group ties.
      model[1], optax.adam(1e-2), step_lib.LossConfig(entropy_coef=0.01), num_groups=SIZE,
      eps=CONFIG.eps,
      allowed=distribution.vocabulary_mask(word_runner.model_config.vocab_size,
                                          sampling.allowed_token_ids),
      temperature=1.0, max_actions=word_runner.config.max_turns)


def _state(params):
  params = jax.tree.map(jnp.copy, params)  # the update donates its state
  return types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                rng=jax.random.key_data(jax.random.key(0)), policy_params=params,
                                policy_opt_state=optax.adam(1e-2).init(params))


def _iteration(word_runner, update, params, make_env, on_depth, key=0):
  seeds = [t for t in range(TASKS) for _ in range(CONFIG.num_roots)]
  groups = list(seeds)
  return rtpo.rtpo_iteration(word_runner, make_env, update, _state(params), seeds, groups,
                             max_prefixes=CONFIG.max_prefixes, branches=CONFIG.branches, num_tasks=TASKS, rng=jax.random.key(key),
                             on_depth=on_depth)


def _replayed(model, runner, traj, params):
  """Full-pass log-probs [B, L] of the recorded action tokens under `params`."""
  allowed = distribution.vocabulary_mask(runner.model_config.vocab_size,
                                        runner.config.sampling.allowed_token_ids)
  view = distribution.action_view(jnp.asarray(traj.action_mask), runner.config.max_turns)
  logp, _ = distribution.action_log_probs(model[1], params, jnp.asarray(traj.tokens),
                                      tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)),
                                      view, allowed, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  out[np.arange(out.shape[0])[:, None], np.asarray(view.index)] = np.where(view.valid, logp, 0.0)
  return out


def test_reverse_order_exact_prefixes_turn_k_loss_and_updated_continuations(
    word_runner, update, model):
  seen = []

  def on_depth(batch, state):
    # Copy now: the update donates the state it is given.
    seen.append((batch, jax.tree.map(np.array, state.policy_params)))

  state, roots, history = _iteration(word_runner, update, model[2], _make_env, on_depth)
  depths = [b.depth for b, _ in seen]
  # 1. Strictly decreasing turn order, one update per depth, from the deepest turn reached.
  assert len(depths) >= 3 and all(a > b for a, b in zip(depths, depths[1:]))
  assert depths == rtpo.reverse_depths(roots) and [h["rtpo/depth"] for h in history] == depths
  for i, (batch, params) in enumerate(seen):
    traj, k = batch.traj, batch.depth
    real = batch.prefix_root >= 0
    # 2. Prefix tokens bit-identical to the root's sampled prefix (up to observation k).
    for r in np.flatnonzero(real):
      root, n = batch.prefix_root[r], batch.prefix_len[r]
      assert n == roots.traj.turn_start[root, k]
      for name in ("tokens", "turn_of_token"):
        np.testing.assert_array_equal(getattr(traj, name)[r, :n], getattr(roots.traj, name)[root, :n])
    # 4. Only turn-k action tokens carry loss: one one-token action per live branch.
    assert not (traj.action_mask & (traj.turn_of_token != k)).any()
    assert traj.action_mask.sum() == real.sum() and not traj.action_mask[~real].any()
    assert (np.bincount(traj.group_id[real]) == CONFIG.branches).all()
    # 3. The turn-k actions were drawn by the parameters this depth starts from, i.e. the ones
    # already updated on every deeper turn (not the root parameters).
    mask = traj.action_mask
    np.testing.assert_allclose(_replayed(model, word_runner, traj, params)[mask],
                               traj.sample_logprob[mask], atol=1e-4)
    if i > 0:
      stale = _replayed(model, word_runner, traj, model[2])[mask]
      assert np.abs(stale - traj.sample_logprob[mask]).max() > 1e-3
  assert int(state.step) == len(depths)


def test_one_turn_is_grpo_with_group_size_m(word_runner, update, model):
  seen = []
  _, roots, history = _iteration(word_runner, update, model[2], one_step_env.OneStep,
                                 lambda batch, state: seen.append(batch), key=1)
  # K = 1: a single depth-0 update whose prefixes are the prompts, each with M fresh samples.
  assert [b.depth for b in seen] == [0] and len(history) == 1
  traj = seen[0].traj
  real = seen[0].prefix_root >= 0
  assert real.sum() == TASKS * CONFIG.max_prefixes * CONFIG.branches
  out = estimators.get_estimator("grpo")(jax.tree.map(jnp.asarray, traj), num_groups=SIZE)
  for g in np.unique(traj.group_id[real]):
    rows = np.flatnonzero(traj.group_id == g)
    assert len(rows) == CONFIG.branches
    assert len({tuple(traj.tokens[r, :seen[0].prefix_len[r]]) for r in rows}) == 1
    # GRPO by hand: (G - mean) / (unbiased std + 1e-6) on each row's one action token.
    g_ = traj.outcome[rows].astype(np.float64)
    std = g_.std(ddof=1)
    want = (g_ - g_.mean()) / (std + 1e-6)
    got = np.asarray(out.advantages)[rows][traj.action_mask[rows]]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_choose_prefixes_caps_per_group(word_runner, model):
  seeds = [0, 0, 0, 0, 1, 1, 1, 1]
  roots = rtpo.sample_roots(word_runner, _make_env, seeds, seeds, params=model[2],
                            rng=jax.random.key(0))
  chosen = rtpo.choose_prefixes(roots.traj, 0, 2, jax.random.key(0))
  np.testing.assert_array_equal(np.bincount(roots.traj.group_id[chosen]), [2, 2])
  last = rtpo.reverse_depths(roots)[0]
  chosen = rtpo.choose_prefixes(roots.traj, last, 2, jax.random.key(0))
  assert chosen.size and roots.traj.turn_mask[chosen, last].all()
  # Snapshots are the env before the turn's action: stepping it replays the root.
  b = int(chosen[0])
  env = roots.snapshots[b][last]
  ids = roots.traj.tokens[b, roots.traj.turn_start[b, last]:roots.traj.turn_end[b, last]]
  result = env.step(word_runner.action_text(ids))
  assert base.observation_hash(result.observation) == roots.traj.obs_hash[b, last]


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="branches"):
    rtpo_train.RTPOConfig(branches=0)
  with pytest.raises(ValueError, match="eps"):
    rtpo_train.RTPOConfig(eps=0.0)
