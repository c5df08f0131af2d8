"""ARPO-style entropy branching (docs/methods.md#arpo)."""

import jax
import numpy as np
import pytest

from agentrl_jax.envs import base
from agentrl_jax.envs import registry
from agentrl_jax.rollout.strategies import arpo

import one_step_env


def _make_env():
  return registry.make("frozenlake")


def _groups(num_groups, size):
  seeds = [g for g in range(num_groups) for _ in range(size)]
  return seeds, list(seeds)


def test_branch_probability_by_hand():
  # τ = .5, w = .2: ΔH = 1 -> .7; ΔH = -5 -> clip(-.5) = 0; ΔH = 4 -> clip(1.3) = 1.
  np.testing.assert_allclose(arpo.branch_probability(np.array([1.0, -5.0, 4.0]), 0.5, 0.2),
                             [0.7, 0.0, 1.0])
  # u = .6, ΔH = 1: p = .6 - .2 = .4 <= .5 -> branch; u = .75: p = .55 > .5 -> no.
  np.testing.assert_array_equal(arpo.branch_decisions(np.array([0.6, 0.75]), 1.0, 0.5, 0.2),
                                [True, False])


@pytest.mark.parametrize("tau", [0.2, 0.5, 0.9])
def test_zero_weight_branch_rate_is_tau(tau):
  u = arpo.branch_uniforms(jax.random.key(0), np.arange(20000), 1)[:, 0]
  rate = arpo.branch_decisions(u, np.random.default_rng(0).normal(size=u.shape), tau, 0.0).mean()
  # Binomial standard error at n = 20000 is <= .0036; 4 sigma.
  assert abs(rate - tau) < 0.015
  # With w != 0 the rate follows clip(τ + w·ΔH) at a fixed ΔH.
  rate = arpo.branch_decisions(u, 0.5, tau, 0.2).mean()
  assert abs(rate - arpo.branch_probability(0.5, tau, 0.2)) < 0.015


def test_uniforms_depend_on_the_row_id_only():
  a = arpo.branch_uniforms(jax.random.key(1), np.array([3, 4, 5]), 2)
  b = arpo.branch_uniforms(jax.random.key(1), np.array([5]), 2)
  np.testing.assert_array_equal(a[2], b[0])


def _check_branches(traj):
  source = traj.extras["arpo_source"].astype(int)
  at = traj.extras["arpo_branch_turn"].astype(int)
  for b in np.flatnonzero(source >= 0):
    s, k = source[b], at[b]
    assert traj.group_id[s] == traj.group_id[b] and k >= 1
    cut = traj.turn_start[b, k]
    # The branch point: after the observation of turn k, before its action.
    assert cut == traj.turn_start[s, k] and traj.turn_mask[s, k]
    for name in ("tokens", "action_mask", "turn_of_token", "sample_logprob"):
      np.testing.assert_array_equal(getattr(traj, name)[b, :cut], getattr(traj, name)[s, :cut])
    for name in ("reward", "obs_hash", "action_valid", "turn_start", "turn_end"):
      np.testing.assert_array_equal(getattr(traj, name)[b, :k], getattr(traj, name)[s, :k])
    assert not traj.done[s, :k].any()
  return source


def test_every_group_returns_its_budget_and_branches_share_prefixes(word_runner, model,
                                                                    check_tito, check_layout):
  seeds, groups = _groups(3, 4)
  method = arpo.EntropyBranching(initial_rollouts=2, beam_size=2, branch_probability=0.5)
  traj, stats = method.collect(word_runner, _make_env, seeds, groups, params=model[2],
                               rng=jax.random.key(0))
  check_layout(traj, word_runner, 12)
  # Exactly M = 4 complete samples per prompt: every row played at least one turn and ended.
  assert traj.turn_mask.any(axis=1).all() and traj.done.any(axis=1).all()
  np.testing.assert_array_equal(np.bincount(traj.group_id), [4, 4, 4])
  source = _check_branches(traj)
  assert (source >= 0).sum() >= 3  # branching happened
  assert (source[[0, 1, 4, 5, 8, 9]] == -1).all()  # the first N rows are the initial rollouts
  assert stats.episodes == 12
  check_tito(word_runner, traj)
  # Replaying a branch's actions from scratch reproduces its observations (env copied, not shared).
  b = int(np.flatnonzero(source >= 0)[0])
  env = _make_env()
  env.reset(seeds[b])
  for k in np.flatnonzero(traj.turn_mask[b]):
    ids = traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]]
    result = env.step(word_runner.action_text(ids))
    assert traj.obs_hash[b, k] == base.observation_hash(result.observation)


@pytest.mark.slow  # TITO with multi-token actions: also test_tsr and test_t2po
def test_multi_token_branches_keep_tito(free_runner, model, check_tito):
  seeds, groups = _groups(2, 3)
  traj, _ = arpo.EntropyBranching(initial_rollouts=1, beam_size=3).collect(
      free_runner, _make_env, seeds, groups, params=model[2], rng=jax.random.key(2))
  _check_branches(traj)
  assert traj.turn_mask.any(axis=1).all()
  check_tito(free_runner, traj)


@pytest.mark.slow  # a compile of its own; the budget test covers the shared path
def test_all_initial_is_plain_sampling(word_runner, model):
  # N >= M: nothing to branch; the rows draw what the plain loop draws.
  seeds, groups = _groups(2, 2)
  traj, _ = arpo.EntropyBranching(initial_rollouts=2).collect(
      word_runner, _make_env, seeds, groups, params=model[2], rng=jax.random.key(3))
  plain, _ = word_runner.collect([_make_env() for _ in seeds], seeds, groups, params=model[2],
                                 rng=jax.random.key(3))
  np.testing.assert_array_equal(traj.tokens, plain.tokens)
  assert (traj.extras["arpo_source"] == -1).all()


@pytest.mark.slow  # a compile of its own; the budget test covers the shared path
def test_slots_left_when_a_group_ends_are_played_from_the_prompt(word_runner, model):
  seeds, groups = _groups(2, 3)
  traj, _ = arpo.EntropyBranching(initial_rollouts=1).collect(
      word_runner, one_step_env.OneStep, seeds, groups, params=model[2], rng=jax.random.key(4))
  np.testing.assert_array_equal(traj.extras["arpo_source"], [-1, -2, -2, -1, -2, -2])
  assert traj.turn_mask[:, 0].all() and traj.done[:, 0].all()
  # A slot played from the prompt draws with its own row id: what the plain loop draws there.
  plain, _ = word_runner.collect([one_step_env.OneStep() for _ in seeds], seeds, groups, params=model[2],
                                 rng=jax.random.key(4))
  np.testing.assert_array_equal(traj.tokens, plain.tokens)
  np.testing.assert_array_equal(traj.outcome, plain.outcome)


def test_bad_input_is_rejected(word_runner, model):
  with pytest.raises(ValueError, match="different seeds"):
    arpo.EntropyBranching().collect(word_runner, _make_env, [0, 1], [0, 0], params=model[2],
                                    rng=jax.random.key(0))
  with pytest.raises(ValueError, match="branch_probability"):
    arpo.EntropyBranching(branch_probability=1.5)
  with pytest.raises(ValueError, match="initial_rollouts"):
    arpo.EntropyBranching(initial_rollouts=0)
