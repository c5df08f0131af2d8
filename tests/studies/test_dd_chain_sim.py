"""Tests for agentrl_jax.studies.dd_chain_sim (the unit tests of
docs/methods.md#decision-density)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import density
from agentrl_jax.envs import dd_chain
from agentrl_jax.studies import dd_chain_sim as sim
from agentrl_jax.studies import fits

SPEC = sim.ChainSpec(horizon=16, beta=1.0, noise_std=1.0, group_size=8)
SAMPLES = jax.jit(sim.gradient_samples, static_argnames=("spec", "num_batches"))


def _tabular_problem(seed=0):
  rng = np.random.RandomState(seed)
  # Away from θ = 0 on purpose: p_t ≠ 1/2 exercises the (a − p) score and the TD baseline.
  probs = jnp.asarray(rng.uniform(0.2, 0.8, SPEC.horizon), jnp.float32)
  targets = jnp.asarray(rng.randint(0, 2, SPEC.horizon), jnp.float32)
  mask = jnp.asarray(sim.decision_masks(SPEC.horizon, [4])[0])
  return probs, targets, mask


# Unit test 1: |D| = m and routine actions do not move R.


def test_decision_masks_count_and_match_env():
  masks = sim.decision_masks(64, [1, 2, 4, 8, 16, 32, 64])
  np.testing.assert_array_equal(masks.sum(axis=1), [1, 2, 4, 8, 16, 32, 64])
  # m = 4 on T = 16: round(linspace(0, 15, 4)) = round([0, 5, 10, 15]).
  np.testing.assert_array_equal(np.flatnonzero(sim.decision_masks(16, [4])[0]), [0, 5, 10, 15])
  for m in (1, 3, 16):
    np.testing.assert_array_equal(np.flatnonzero(sim.decision_masks(16, [m])[0]),
                                  dd_chain.decision_turns(16, m))
  with pytest.raises(ValueError, match="num_decisions"):
    sim.decision_masks(16, [17])
  with pytest.raises(ValueError, match="group_size"):
    sim.ChainSpec(group_size=1)


def test_returns_match_text_env_and_ignore_routine_actions():
  env = dd_chain.DDChain(horizon=16, num_decisions=4, beta=2.0, noise_std=0.0, target_seed=3)
  targets = np.zeros(16, np.float32)
  for t, word in env.targets.items():
    targets[t] = float(word)
  mask = jnp.asarray(env.decision_mask)
  rng = np.random.RandomState(0)
  actions = rng.randint(0, 2, (5, 16)).astype(np.float32)
  returns = sim.chain_returns(jnp.asarray(actions), jnp.asarray(targets), mask, 2.0,
                              jnp.zeros(5))
  for row, episode_actions in enumerate(actions):
    env.reset(seed=row)
    for a in episode_actions:
      result = env.step(str(int(a)))
    assert result.done
    assert float(returns[row]) == result.reward

  routine = ~np.asarray(env.decision_mask)
  resampled = np.where(routine, rng.randint(0, 2, actions.shape), actions).astype(np.float32)
  assert np.any(resampled != actions)
  np.testing.assert_array_equal(
      sim.chain_returns(jnp.asarray(resampled), jnp.asarray(targets), mask, 2.0, jnp.zeros(5)),
      returns)
  # Flipping one decision action moves R by exactly β = 2.
  flipped = actions.copy()
  flipped[:, 5] = 1 - flipped[:, 5]
  delta = sim.chain_returns(jnp.asarray(flipped), jnp.asarray(targets), mask, 2.0,
                            jnp.zeros(5)) - returns
  np.testing.assert_array_equal(np.abs(delta), 2.0)


def test_leave_one_out_hand_checked():
  # R = [1, 2, 6]: baselines [(2+6)/2, (1+6)/2, (1+2)/2] = [4, 3.5, 1.5] -> Â = [-3, -1.5, 4.5].
  np.testing.assert_allclose(sim.leave_one_out_advantages(jnp.array([1.0, 2.0, 6.0])),
                             [-3.0, -1.5, 4.5])


def test_policy_gradient_numpy_loop_reference():
  rng = np.random.RandomState(1)
  w, a = rng.randn(3, 5), rng.randint(0, 2, (3, 5)).astype(np.float64)
  p, x = rng.uniform(0.1, 0.9, 5), rng.randn(5, 2)
  want_tab, want_shared = np.zeros(5), np.zeros(2)
  for i in range(3):
    for t in range(5):
      want_tab[t] += w[i, t] * (a[i, t] - p[t]) / 3
      want_shared += w[i, t] * (a[i, t] - p[t]) * x[t] / 3
  f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
  np.testing.assert_allclose(sim.policy_gradient(f32(w), f32(a), f32(p)), want_tab, rtol=1e-5)
  np.testing.assert_allclose(sim.policy_gradient(f32(w), f32(a), f32(p), f32(x)), want_shared,
                             rtol=1e-5, atol=1e-6)


# Unit test 2: all estimators are unbiased.


def test_estimators_unbiased_error_shrinks_as_inverse_sqrt_batches():
  probs, targets, mask = _tabular_problem()
  truth = np.asarray(sim.exact_tabular_gradient(probs, targets, mask, SPEC.beta))
  assert np.all(truth[~np.asarray(mask)] == 0) and np.all(truth[np.asarray(mask)] != 0)
  samples = SAMPLES(jax.random.key(0), probs, targets, mask, jnp.array([0.3]), SPEC, 6400)
  distances = {}
  for name, g in (("traj", samples.traj), ("turn", samples.turn[0]), ("td", samples.td),
                  ("diff", samples.traj - samples.turn[0])):
    g = np.asarray(g, np.float64)
    want = 0.0 if name == "diff" else truth
    for n in (400, 6400):
      error = np.sum((g[:n].mean(0) - want) ** 2)
      # Unbiased => N_b·‖ḡ − g‖² / tr Cov ≈ χ²_16/16, whose 0.1%–99.9% range is about [0.25, 2.5].
      normalized = n * error / g[:n].var(0, ddof=1).sum()
      assert 0.15 < normalized < 3.0, (name, n, normalized)
      distances[name, n] = np.sqrt(error)
  # Sixteen times the batches: the distance between the two estimators' means shrinks ~4x.
  assert 2.0 < distances["diff", 400] / distances["diff", 6400] < 8.0
  routine = ~np.asarray(mask)
  traj_mean = np.asarray(samples.traj, np.float64).mean(0)
  # The signal is on decision turns; routine coordinates average out.
  assert np.abs(traj_mean[routine]).max() < 0.2 * np.abs(truth).max()


# Unit test 3: at ρ = 1 with the oracle critic, ĝ_turn ≡ ĝ_traj.


def test_turn_equals_traj_bitwise_at_full_density():
  probs, targets, _ = _tabular_problem()
  full = jnp.ones(SPEC.horizon, bool)
  samples = SAMPLES(jax.random.key(1), probs, targets, full, jnp.array([0.0, 0.1]), SPEC, 50)
  np.testing.assert_array_equal(samples.turn[0], samples.traj)
  assert not np.array_equal(samples.turn[1], samples.traj)
  # At lower density the two differ.
  mask = jnp.asarray(sim.decision_masks(SPEC.horizon, [8])[0])
  sparse = SAMPLES(jax.random.key(1), probs, targets, mask, jnp.array([0.0, 0.1]), SPEC, 50)
  assert not np.array_equal(sparse.turn[0], sparse.traj)


# Unit tests 4 and 5: the SNR scaling on a 3-point grid; SNR scale invariance.


def test_three_point_slope_near_minus_half():
  sweep = sim.snr_sweep(jax.random.key(2), SPEC, [1, 4, 16], [0.0], num_batches=2000,
                        num_resamples=20)
  fit = fits.loglog_fit(sweep.densities, sweep.ratio_turn[0])
  assert abs(fit.slope + 0.5) < 0.1, fit
  np.testing.assert_allclose(sweep.densities, [1 / 16, 1 / 4, 1])
  np.testing.assert_allclose(sweep.ratio_turn[0, -1], 1.0, rtol=1e-6)
  # The interval brackets the point estimate, and the bootstrap arrays have the documented shapes.
  low, high = sweep.ratio_turn_ci[0, 0]
  assert low <= sweep.ratio_turn[0, 0] <= high
  assert sweep.bootstrap_turn.shape == (20, 1, 3) and sweep.bootstrap_td.shape == (20, 3)
  # The stylized prediction at ρ = 1/16 with an oracle critic is 4; the measurement is close.
  assert 3.2 < sweep.ratio_turn[0, 0] < 5.0


def test_snr_scale_invariant_on_simulated_gradients():
  probs, targets, mask = _tabular_problem()
  samples = SAMPLES(jax.random.key(3), probs, targets, mask, jnp.array([0.0]), SPEC, 200)
  base_snr = density.gradient_snr(samples.traj).snr
  for c in (-3.7, 1e3):
    np.testing.assert_allclose(density.gradient_snr(c * samples.traj).snr, base_snr, rtol=1e-5)


def test_predicted_ratio_hand_checked():
  # m = 4, T = 64, β = 1, σ_ε = 1, G = 8: Var R = 4·¼ + 1 = 2, E[Â²] = 2·8/7 = 16/7.
  # σ_c = 0.4: κ = 0.16·7/16 = 0.07; ρ + κ = 0.0625 + 0.07 = 0.1325 -> 0.1325^(−½) ≈ 2.7472.
  spec = sim.ChainSpec(horizon=64, beta=1.0, noise_std=1.0, group_size=8)
  np.testing.assert_allclose(sim.predicted_ratio(np.array([4]), 64, 0.4, spec), [0.1325**-0.5],
                             rtol=1e-9)
  np.testing.assert_allclose(sim.predicted_ratio(np.array([1, 64]), 64, 0.0, spec), [8.0, 1.0])


# Experiment 2 building blocks.


def test_decision_accuracy_hand_checked():
  # x = e_0, e_1; θ = [log 3, 0] -> p = [3/4, 1/2]; targets [1, 0] -> P(correct) = [3/4, 1/2].
  problem = sim.SharedProblem(features=jnp.eye(2), theta_star=jnp.zeros(2),
                              targets=jnp.array([1.0, 0.0]))
  theta = jnp.array([np.log(3.0), 0.0])
  np.testing.assert_allclose(sim.decision_accuracy(theta, problem, jnp.array([True, True])),
                             0.625, rtol=1e-6)
  np.testing.assert_allclose(sim.decision_accuracy(theta, problem, jnp.array([True, False])),
                             0.75, rtol=1e-6)


def test_steps_to_threshold_learns_and_respects_cap():
  spec = sim.ChainSpec(horizon=16, beta=1.0, noise_std=0.0, group_size=4)
  problem = sim.shared_problem(jax.random.key(4), 16, 4)
  np.testing.assert_allclose(np.linalg.norm(problem.features, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(problem.targets, problem.features @ problem.theta_star > 0)
  run = jax.jit(sim.steps_to_threshold, static_argnames=("spec", "train"))
  train = sim.TrainSpec(num_features=4, max_steps=500)
  full = jnp.ones(16, bool)
  key = jax.random.key(5)
  steps_traj, acc_traj = run(key, problem, full, jnp.int32(0), spec, train)
  steps_turn, acc_turn = run(key, problem, full, jnp.int32(1), spec, train)
  # Same key at ρ = 1: the oracle-gated run is the trajectory run, step for step.
  assert int(steps_traj) == int(steps_turn) < 500
  assert float(acc_traj) == float(acc_turn) >= 0.9
  capped, acc = run(key, problem, full, jnp.int32(0), spec, sim.TrainSpec(num_features=4,
                                                                          max_steps=2))
  assert int(capped) == 2 and float(acc) < 0.9
  with pytest.raises(ValueError, match="threshold"):
    sim.TrainSpec(threshold=1.5)
