"""Tests for agentrl_jax.credit.deltattg (docs/methods.md#deltattg)."""

import jax
import numpy as np
import optax
import pytest

from agentrl_jax.credit import deltattg

from credit_batches import Turn, make_batch, outcome_advantages, random_batch

WEIGHTS = jax.jit(deltattg.progress_weights)


def numpy_weights(meter, ntok, turns, completed, direction, tau=1.0, eta=0.5, z_max=3.0):
  out = np.ones_like(meter)
  for b in range(meter.shape[0]):
    k = turns[b]
    m = list(meter[b, :k]) + [0.0 if completed[b] else meter[b, k - 1]]
    delta = np.array([m[i] - m[i + 1] for i in range(k)])
    n = ntok[b, :k]
    mu = (n * delta).sum() / n.sum()
    sigma = np.sqrt((n * (delta - mu) ** 2).sum() / n.sum())
    z = np.clip((delta - mu) / (sigma + 1e-6), -z_max, z_max)
    u = np.exp(tau * direction[b] * z)
    w = u * n.sum() / (n * u).sum()
    out[b, :k] = (1 - eta) + eta * w
  return out


def test_hand_checked_weights():
  # Completed, two turns of one token each, meter [2, 1] → m = [2, 1, 0], Δ = [1, 1]: identity.
  # Meter [2, 2]: Δ = [0, 2], μ = 1, σ = 1, z = [−1, 1] (to 1e-6); A_b > 0:
  # u = [e^−1, e], w̃ = 2u/(e^−1 + e) = [0.2384, 1.7616], w = 0.5 + 0.5·w̃ = [0.6192, 1.3808].
  mask = np.array([[True, True]] * 2)
  w = np.asarray(WEIGHTS(np.array([[2.0, 1.0], [2.0, 2.0]]), np.ones((2, 2)), mask,
                         np.array([True, True]), np.array([1.0, 1.0])))
  np.testing.assert_allclose(w[0], [1.0, 1.0], atol=1e-5)
  e = np.e
  np.testing.assert_allclose(w[1], 0.5 + 0.5 * 2 * np.array([1 / e, e]) / (1 / e + e), atol=1e-5)


def test_matches_numpy_reference():
  rng = np.random.default_rng(0)
  b, n = 6, 5
  turns = rng.integers(1, n + 1, b)
  mask = np.arange(n)[None] < turns[:, None]
  meter = (rng.random((b, n)) * 3 * mask).astype(np.float32)
  ntok = (rng.integers(1, 4, (b, n)) * mask).astype(np.float32)
  completed, direction = rng.random(b) < 0.5, rng.choice([-1.0, 1.0], b)
  w = np.asarray(WEIGHTS(meter, ntok, mask, completed, direction))
  np.testing.assert_allclose(w, numpy_weights(meter, ntok, turns, completed, direction), atol=1e-5)


def test_sign_and_token_average_preserved_and_extremes():
  rng = np.random.default_rng(1)
  traj = random_batch(rng, b=8)
  a_b = np.array([1.5, -0.7, 0.0, 2.0, -1.0, 0.3, -0.2, 1.0], np.float32)
  a = outcome_advantages(traj, a_b)
  meter = (rng.random(traj.turn_mask.shape) * 3).astype(np.float32)
  out = np.asarray(jax.jit(deltattg.ttg_redistribution)(traj, a, meter))
  mask = traj.action_mask
  assert np.all(np.sign(out[mask]) == np.sign(a[mask]))
  np.testing.assert_allclose(out.sum(1) / mask.sum(1), a_b, atol=1e-5)
  # For A_b > 0 the turn with the largest Δ has the largest |A|; for A_b < 0 the smallest Δ does.
  m = np.where(traj.turn_mask, meter, 0.0)
  for b in range(8):
    k = traj.turn_mask[b].sum()
    if k < 2 or a_b[b] == 0:
      continue
    nxt = list(m[b, 1:k]) + [0.0 if traj.success[b] else m[b, k - 1]]
    delta = m[b, :k] - np.array(nxt)
    per_turn = [abs(out[b][(traj.turn_of_token[b] == t) & mask[b]][0]) for t in range(k)]
    target = np.argmax(delta) if a_b[b] > 0 else np.argmin(delta)
    assert per_turn[target] == pytest.approx(max(per_turn), abs=1e-6)


def test_constant_progress_is_identity():
  # A meter falling by one per turn to 0 at completion: every Δ = 1.
  traj = make_batch([[Turn(), Turn(act=(10, 11)), Turn()]], success=[True])
  traj = traj.replace(extras={"ttg_meter": np.array([[3.0, 2.0, 1.0, 0.0]], np.float32)})
  a = outcome_advantages(traj, [0.8])
  np.testing.assert_allclose(deltattg.ttg_progress_credit(traj, a), a, atol=1e-6)


def test_meter_targets_training_and_round_trip(tmp_path):
  # Targets: action tokens per turn [1, 2, 1] → TTG = [4, 3, 1] → log1p.
  traj = make_batch([[Turn(), Turn(act=(10, 11)), Turn()]] * 4, success=[True] * 4)
  np.testing.assert_allclose(deltattg.ttg_targets(traj)[0, :3], np.log1p([4, 3, 1]), atol=1e-6)
  config = deltattg.MeterConfig(num_buckets=64, width=8, hidden=16)
  params = deltattg.init_meter(config, jax.random.key(0))
  opt = optax.adam(1e-2)

  @jax.jit
  def fit(params):
    def step(carry, _):
      params, state = carry
      loss, grads = jax.value_and_grad(deltattg.meter_loss)(params, traj)
      updates, state = opt.update(grads, state)
      return (optax.apply_updates(params, updates), state), loss
    (params, _), losses = jax.lax.scan(step, (params, opt.init(params)), None, length=50)
    return params, losses

  params, losses = fit(params)
  assert float(losses[-1]) < 0.5 * float(losses[0])
  path = str(tmp_path / "meter.npz")
  deltattg.save_meter(path, params, config)
  corrector = deltattg.DeltaTTG(path)
  assert corrector.config == config
  np.testing.assert_allclose(jax.jit(corrector.meter)(traj),
                             jax.jit(deltattg.meter_apply)(params, traj), atol=1e-6)
  fresh = deltattg.DeltaTTG(params=deltattg.init_meter(config, jax.random.key(1)), config=config)
  fresh.load_state_dict(corrector.state_dict())
  a = outcome_advantages(traj, [1.0, -1.0, 0.5, 0.0])
  np.testing.assert_allclose(jax.jit(fresh)(traj, a), jax.jit(corrector)(traj, a), atol=1e-6)


def test_validation():
  with pytest.raises(ValueError, match="mix must be in"):
    deltattg.DeltaTTG(params={}, mix=1.0)
  with pytest.raises(ValueError, match="exactly one of meter_path"):
    deltattg.DeltaTTG()
  traj = make_batch([[Turn()]])
  with pytest.raises(ValueError, match=r"needs traj.extras\['ttg_meter'\]"):
    deltattg.ttg_progress_credit(traj, outcome_advantages(traj, [1.0]))
