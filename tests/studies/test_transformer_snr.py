"""Tests for agentrl_jax.studies.transformer_snr: the gradients are wired right, the oracle's
credit is where D is, and at ρ = 1/16 the turn-level estimator has the higher SNR."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.advantages import density
from agentrl_jax.envs import dd_chain
from agentrl_jax.models import distribution
from agentrl_jax.studies import transformer_snr as ts

# ρ = 1/16; σ_ε = 0 so that Var(R) = β²/4 and the trajectory-level SNR is measurable on few groups.
# The wiring tests differentiate exactly (sketch None); the SNR test sketches like the study.
SPEC = ts.StudySpec(horizon=16, num_decisions=(1, 16), group_size=8, num_groups=24,
                    chunk_groups=8, noise_std=0.0)


# Jitted once per shape: every call below uses 8 rows and 4 surrogates (more than 2: a vmap over
# the cotangents once compiled to wrong gradients from the third on).
GRADIENTS = jax.jit(ts.trajectory_gradients, static_argnums=0,
                    static_argnames=("temperature", "max_actions"))


@pytest.fixture(scope="module")
def run_and_params():
  return ts.make_run(SPEC)


@pytest.fixture(scope="module")
def chunk(run_and_params):
  run, params = run_and_params
  return ts.play_chunk(run, params, SPEC, 0)


def _batch_surrogate_gradient(run, params, traj, weights):
  """∇ Σ_b Σ_k w[b, k] log π(a_{b,k}) with the learner's batched log-probs (no vmap)."""

  @jax.jit
  def gradient(params, traj, weights):
    view = distribution.action_view(traj.action_mask, weights.shape[-1])
    positions = distribution.trajectory_positions(traj)

    def surrogate(p):
      logp, _ = distribution.action_log_probs(run.graphdef, p, traj.tokens, positions, view,
                                              run.allowed, run.temperature)
      return jnp.sum(weights * logp)

    return jax.grad(surrogate)(params)

  return gradient(params, jax.tree.map(jnp.asarray, traj), weights)


def _gradients(run, params, traj, weights):
  return GRADIENTS(run.graphdef, params, jax.tree.map(jnp.asarray, traj), weights, run.allowed,
                   temperature=run.temperature)


# About 40 s on 2 idle cores (four surrogates, each a full backward): under -m slow; the gate
# gradients' sum check at the study size stays in the default suite.
@pytest.mark.slow
def test_per_trajectory_gradients_sum_to_the_batch_gradient(run_and_params, chunk):
  run, params = run_and_params
  traj = jax.tree.map(lambda x: x[:8], chunk)
  weights = jnp.asarray(np.random.RandomState(0).normal(size=(8, 4, SPEC.horizon)), jnp.float32)
  per_traj = _gradients(run, params, traj, weights)
  for j in range(4):
    batch = _batch_surrogate_gradient(run, params, traj, weights[:, j])
    summed = jax.tree.map(lambda g: g[:, j].sum(axis=0), per_traj)
    # float32 sums of 8 rows in two orders (and two compiled programs): the error is relative
    # to each leaf's scale, since single coordinates may cancel to ~1e-6.
    for a, b in zip(jax.tree.leaves(summed), jax.tree.leaves(batch)):
      error = float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
      assert error < 1e-5, (a.shape, error)
  # Each row's gradient is its own: a row with zero credit has a zero gradient.
  zero = weights.at[2].set(0.0)
  per_traj = _gradients(run, params, traj, zero)
  assert all(float(jnp.abs(g[2]).max()) == 0.0 for g in jax.tree.leaves(per_traj))
  assert all(float(jnp.abs(g[1]).max()) > 0.0 for g in jax.tree.leaves(per_traj)[:3])


def test_oracle_credit_is_zero_on_routine_turns_and_gradients_are_linear(run_and_params, chunk):
  run, params = run_and_params
  env = dd_chain.DDChain(horizon=16, num_decisions=4)
  mask = env.decision_mask  # D = {0, 5, 10, 15}
  advantages = jnp.array([1.5, -0.5, 0.0, 2.0])
  credit = np.asarray(ts.turn_credit(advantages, mask))
  assert np.all(credit[:, ~mask] == 0.0)
  np.testing.assert_array_equal(credit[:, mask], np.repeat(np.asarray(advantages)[:, None], 4, 1))
  np.testing.assert_array_equal(np.asarray(ts.trajectory_credit(advantages, 16)),
                                np.repeat(np.asarray(advantages)[:, None], 16, 1))
  # group_samples (Â times each gate's gradient, jitted) equals the batch gradient of the credit
  # itself (no vmap), for three gates: every turn, D, and none (an exactly zero gradient).
  traj = jax.tree.map(lambda x: x[:8], chunk)
  gates = np.stack([np.ones(16, bool), mask, np.zeros(16, bool)])
  gate_grads = ts.gate_gradients(run, params, traj, gates, None)
  assert np.all(gate_grads[:, 2] == 0.0)
  adv = np.random.RandomState(1).normal(size=(1, 8)).astype(np.float32)
  samples = ts.group_samples(gate_grads, adv, np.array([[0], [1], [2]]), group_size=8)
  for e, gate in enumerate(gates[:2]):
    batch = _batch_surrogate_gradient(run, params, traj, ts.turn_credit(jnp.asarray(adv[0]), gate))
    expected = np.concatenate([np.ravel(g) for g in jax.tree.leaves(batch)]) / 8
    # Mixed-sign credit over 8 rows, two compiled programs: relative to the gradient's scale.
    error = np.linalg.norm(samples[e, 0, 0] - expected) / np.linalg.norm(expected)
    assert error < 1e-5, error
  assert np.all(samples[2] == 0.0)


def test_gate_gradients_at_the_study_size():
  # T = 32, 8 rows, 3 gates: where a vmap over the cotangents compiled to a nonzero gradient for
  # the all-zero gate (and a wrong one for D); at T = 16 the same program was right.
  spec = dataclasses.replace(SPEC, horizon=32, num_decisions=(2,), num_groups=2, chunk_groups=1)
  run, params = ts.make_run(spec)
  traj = ts.play_chunk(run, params, spec, 0)
  mask = dd_chain.DDChain(horizon=32, num_decisions=2).decision_mask
  gates = np.stack([np.ones(32, bool), mask, np.zeros(32, bool)])
  gate_grads = ts.gate_gradients(run, params, traj, gates, None)
  assert np.all(gate_grads[:, 2] == 0.0)
  for e, gate in enumerate(gates[:2]):
    batch = _batch_surrogate_gradient(run, params, traj,
                                      jnp.broadcast_to(jnp.asarray(gate, jnp.float32), (8, 32)))
    expected = np.concatenate([np.ravel(g) for g in jax.tree.leaves(batch)])
    error = np.linalg.norm(gate_grads[:, e].sum(axis=0) - expected) / np.linalg.norm(expected)
    assert error < 1e-5, (e, error)


def test_returns_replay_the_played_env(run_and_params, chunk):
  run, _ = run_and_params
  actions = ts.action_choices(chunk, run.tokenizer, SPEC.horizon)
  returns = ts.chain_returns(actions, np.arange(actions.shape[0]), SPEC)
  np.testing.assert_allclose(returns[0], chunk.outcome, atol=1e-6)
  # m = 1: D = {0}, so the return is 1[a_0 = y_0]; routine actions do not move it.
  target = int(dd_chain.DDChain(horizon=16, num_decisions=1).targets[0])
  np.testing.assert_array_equal(returns[0], (actions[:, 0] == target).astype(np.float32))
  assert np.all(returns[1] >= returns[0])


def test_learned_critic_finds_the_decision_turns():
  rng = np.random.RandomState(0)
  actions = rng.randint(0, 2, (2000, 16))
  mask = dd_chain.DDChain(horizon=16, num_decisions=4).decision_mask
  returns = (actions[:, mask] == 1).sum(axis=1) + rng.normal(0, 1.0, 2000)
  effects, decisions, rho = ts.learned_decision_turns(actions, returns, threshold=0.25)
  np.testing.assert_array_equal(decisions, mask)
  np.testing.assert_allclose(effects[mask], 1.0, atol=0.15)
  assert abs(rho - 0.25) < 0.02


def test_sketch_preserves_snr():
  rng = np.random.RandomState(0)
  samples = rng.normal(size=(64, 4000)).astype(np.float32) + 0.05
  sketch = ts.count_sketch(jax.random.key(0), 4000, 1024)
  exact = float(density.gradient_snr(samples).snr)
  approx = float(density.gradient_snr(ts.sketched(sketch, jnp.asarray(samples))).snr)
  # Signal 4000·0.05² = 10 against noise 4000: SNR ≈ 0.05; the sketch's error is O(sqrt(2/k)).
  assert abs(approx / exact - 1) < 0.15, (exact, approx)


def test_turn_level_snr_beats_trajectory_level_at_density_one_sixteenth(run_and_params):
  measurement = ts.measure(SPEC, log=lambda _: None, built=run_and_params)
  analysis = ts.analyse(measurement, jax.random.key(0), num_resamples=100)
  traj, oracle = analysis.snr[0], analysis.snr[1]
  assert oracle[0] > traj[0], analysis.snr
  assert analysis.ratio_ci[0, 0, 0] > 1.0, analysis.ratio_ci
  # ρ = 1: the oracle's gate is every turn, so both estimators are the same samples.
  np.testing.assert_array_equal(measurement.samples[1, 1], measurement.samples[0, 1])
  assert analysis.ratio[0, 1] == 1.0


def test_measure_resumes_from_its_cache_and_refuses_another_spec(run_and_params, tmp_path):
  spec = dataclasses.replace(SPEC, num_groups=2, chunk_groups=1, sketch_dim=1024)
  first = ts.measure(spec, cache_dir=str(tmp_path), log=lambda _: None, built=run_and_params)
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "episodes_0000.npz", "episodes_0001.npz", "samples_0000.npz", "samples_0001.npz",
      "spec.json"]
  logged = []
  again = ts.measure(spec, cache_dir=str(tmp_path), log=logged.append, built=run_and_params)
  assert not logged  # nothing played or differentiated again
  np.testing.assert_array_equal(again.samples, first.samples)
  with pytest.raises(ValueError, match="another spec"):
    ts.measure(dataclasses.replace(spec, num_groups=3), cache_dir=str(tmp_path),
               built=run_and_params)


def _record(seed, slope_oracle, ratios_oracle, ratios_learned):
  est = lambda s, r: {"slope": s, "ratio": r}
  return {"seed": seed, "densities": [0.25, 0.5, 1.0],
          "estimators": {"oracle": est(slope_oracle, ratios_oracle),
                         "learned": est(None, ratios_learned)}}


def test_across_seeds_pools_slopes_and_geometric_mean_ratios():
  records = [_record(0, -0.4, [2.0, 1.5, 1.0], [0.0, 1.2, 1.0]),
             _record(1, -0.6, [8.0, 1.5, 1.0], [3.0, 1.4, 1.0])]
  got = ts.across_seeds(records)
  oracle = got["estimators"]["oracle"]
  assert oracle["slope_mean"] == pytest.approx(-0.5)
  half = 12.706 * np.std([-0.4, -0.6], ddof=1) / np.sqrt(2)  # t_{0.975, 1}
  assert oracle["slope_ci"] == pytest.approx([-0.5 - half, -0.5 + half], rel=1e-3)
  np.testing.assert_allclose(oracle["geometric_mean_ratio"], [4.0, 1.5, 1.0])
  expected = np.polyfit(np.log([0.25, 0.5, 1.0]), np.log([4.0, 1.5, 1.0]), 1)[0]
  assert oracle["pooled_fit"]["slope"] == pytest.approx(expected)
  learned = got["estimators"]["learned"]
  # Seed 0's learned critic found nothing at rho = 1/4: that density leaves the pooled fit.
  assert learned["pooled_fit"]["densities"] == [0.5, 1.0]
  assert learned["slope_mean"] is None  # undefined slopes make the mean undefined, not 0
  with pytest.raises(ValueError, match="different densities"):
    ts.across_seeds([records[0], {**records[1], "densities": [0.5, 1.0]}])


def test_warm_up_moves_every_turn_towards_one_half_and_zero_steps_change_nothing(run_and_params,
                                                                                 chunk):
  run, params = run_and_params
  assert ts.warm_to_uniform(run, params, SPEC) is params  # warmup_steps = 0
  warm = ts.warm_to_uniform(run, params, dataclasses.replace(SPEC, warmup_steps=25))
  # The warm-up plays chunk `num_chunks` (unused by the measurement); judge it on chunk 0.
  actions = ts.action_choices(chunk, run.tokenizer, SPEC.horizon)
  view = distribution.action_view(jnp.asarray(chunk.action_mask), SPEC.horizon)
  positions = distribution.trajectory_positions(jax.tree.map(jnp.asarray, chunk))

  @jax.jit  # one compile for both parameter sets instead of two op-by-op forwards
  def log_probs(p):
    return distribution.action_log_probs(run.graphdef, p, jnp.asarray(chunk.tokens), positions,
                                         view, run.allowed, run.temperature)[0]

  def distance_from_half(p):
    taken = np.exp(np.asarray(log_probs(p)))
    return np.abs(np.where(actions == 1, taken, 1.0 - taken) - 0.5).mean(axis=0)

  before, after = distance_from_half(params), distance_from_half(warm)
  # At initialisation the first turns sit far from ½ (π("1") ≈ 0.05); the notebook's 25 steps
  # (Adam's first steps overshoot: after 8 the mean distance had grown) bring every turn within
  # 0.05 of ½.
  assert before.max() > 0.2, before
  assert after.max() < 0.05, (before, after)
  with pytest.raises(ValueError, match="warmup_steps"):
    dataclasses.replace(SPEC, warmup_steps=-1)
