"""The jitted update: action view, on-policy PPO step, zero-advantage no-op, NaN guard, no retrace."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm

V, B, L, N = 12, 4, 10, 3


def _traj(outcome):
  """Four rows: turn 0 = 3 obs tokens + 1 action token, turn 1 = 2 obs + 2 action, then padding."""
  t = types.empty_trajectories(B, L, N)
  rng = np.random.default_rng(0)
  t.tokens[:, :8] = rng.integers(0, V, (B, 8))
  t.turn_of_token[:, :4] = 0
  t.turn_of_token[:, 4:8] = 1
  t.action_mask[:, 3] = True
  t.action_mask[:, 6:8] = True
  t.turn_start[:, 0], t.turn_end[:, 0] = 3, 4
  t.turn_start[:, 1], t.turn_end[:, 1] = 6, 8
  t.turn_mask[:, :2] = True
  t.group_id[:] = [0, 0, 1, 1]
  t.outcome[:] = outcome
  t.reward[:, 1] = outcome
  t.success[:] = np.asarray(outcome) > 0
  return jax.tree.map(jnp.asarray, t)


def _state_and_update(entropy_coef=0.0, dtype="float32", optimizer=None):
  cfg = tfm.tiny(V, d_model=16, num_heads=2, mlp_dim=32, dtype=dtype)
  graphdef, params = tfm.create(cfg, seed=0)
  opt = optimizer or optax.adam(1e-2)
  state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                 rng=jax.random.key_data(jax.random.key(0)),
                                 policy_params=params, policy_opt_state=opt.init(params))
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=opt, critic_optimizer=None,
      advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=B),
      loss=step_lib.LossConfig(entropy_coef=entropy_coef), allowed=None, max_actions=4)
  return state, update


def _leaves(params):
  return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_action_view_lists_action_tokens_in_order():
  mask = jnp.asarray([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]], bool)
  view = distribution.action_view(mask, 3)
  np.testing.assert_array_equal(view.index[0], [1, 3, 4])
  np.testing.assert_array_equal(view.valid, [[1, 1, 1], [1, 0, 0]])
  x = jnp.arange(12.0).reshape(2, 6)
  np.testing.assert_array_equal(view.gather(x), [[1, 3, 4], [6, 0, 0]])


def test_update_changes_params_and_reports_finite_metrics():
  state, update = _state_and_update()
  before = _leaves(state.policy_params)
  state, metrics = update(state, _traj([1.0, 0.0, 1.0, 0.0]))
  assert int(state.step) == 1
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert float(metrics["loss/skipped_nonfinite"]) == 0
  # On-policy single step: ratio = 1, so the loss is -mean advantage over action tokens (the PPO loss test 1).
  # GRPO with groups {1, 0}: A = ±1/std = ±1/0.7071 = ±1.4142 on every token; equal token counts
  # per row → token-mean 0.
  np.testing.assert_allclose(float(metrics["loss/policy"]), 0.0, atol=1e-5)
  assert any(not np.array_equal(a, b) for a, b in zip(before, _leaves(state.policy_params)))


def test_equal_rewards_leave_params_unchanged():
  """Every group has equal rewards ⇒ zero advantages ⇒ zero gradient ⇒ Adam moves nothing."""
  state, update = _state_and_update()
  before = _leaves(state.policy_params)
  state, _ = update(state, _traj([1.0, 1.0, 0.0, 0.0]))
  for a, b in zip(before, _leaves(state.policy_params)):
    np.testing.assert_array_equal(a, b)


def test_nan_reward_skips_the_step_and_is_reported():
  state, update = _state_and_update()
  before = _leaves(state.policy_params)
  state, metrics = update(state, _traj([np.nan, 0.0, 1.0, 0.0]))
  assert float(metrics["loss/skipped_nonfinite"]) == 1
  for a, b in zip(before, _leaves(state.policy_params)):
    np.testing.assert_array_equal(a, b)


def test_same_shapes_compile_once():
  state, update = _state_and_update()
  state, _ = update(state, _traj([1.0, 0.0, 1.0, 0.0]))
  state, _ = update(state, _traj([0.0, 1.0, 1.0, 0.0]))
  assert update._cache_size() == 1


def test_loss_config_rejects_bad_values():
  with pytest.raises(ValueError, match="dual_clip"):
    step_lib.LossConfig(dual_clip=0.5)
  with pytest.raises(ValueError, match="max_len_norm"):
    step_lib.LossConfig(agg_mode="seq-mean-token-sum-norm")


def test_nan_advantages_skip_the_step():
  state, _ = _state_and_update()
  grpo = functools.partial(estimators.get_estimator("grpo"), num_groups=B)

  def poisoned(traj, values):
    out = grpo(traj, values)
    return out._replace(advantages=out.advantages.at[0, 3].set(jnp.nan))

  cfg = tfm.tiny(V, d_model=16, num_heads=2, mlp_dim=32)
  graphdef, _ = tfm.create(cfg, seed=0)
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optax.adam(1e-2),
      critic_optimizer=None, advantage_fn=poisoned, loss=step_lib.LossConfig(), allowed=None,
      max_actions=4)
  before = _leaves(state.policy_params)
  state, metrics = update(state, _traj([1.0, 0.0, 1.0, 0.0]))
  assert float(metrics["loss/skipped_nonfinite"]) == 1
  for a, b in zip(before, _leaves(state.policy_params)):
    np.testing.assert_array_equal(a, b)


def test_nan_logits_skip_the_step():
  """A NaN in the LM head's input (the embedding) makes the logits NaN: the step is skipped."""
  state, update = _state_and_update()
  params = jax.tree.map(lambda x: x, state.policy_params)
  params["embed"].value = params["embed"].value.at[0, 0].set(jnp.nan)
  state = state.replace(policy_params=params)
  before = _leaves(state.policy_params)
  state, metrics = update(state, _traj([1.0, 0.0, 1.0, 0.0]))
  assert float(metrics["loss/skipped_nonfinite"]) == 1
  for a, b in zip(before, _leaves(state.policy_params)):
    np.testing.assert_array_equal(a, b)


def test_bfloat16_update_follows_the_float32_update():
  # The same GRPO step with the policy computing in bfloat16 (its gradient matmuls too): the
  # parameters stay float32 and move as the float32 step moves them, within bfloat16 rounding.
  # Plain SGD, so the step is the gradient itself (Adam's first step is its sign).
  deltas = {}
  for dtype in ("float32", "bfloat16"):
    state, update = _state_and_update(dtype=dtype, optimizer=optax.sgd(1.0))
    before = _leaves(state.policy_params)
    new_state, metrics = update(state, _traj([1.0, 0.0, 0.0, 1.0]))
    assert all(x.dtype == np.float32 for x in _leaves(new_state.policy_params))
    assert np.isfinite(float(metrics["loss/policy"]))
    deltas[dtype] = np.concatenate(
        [(a - b).ravel() for a, b in zip(_leaves(new_state.policy_params), before)])
  full, half = deltas["float32"], deltas["bfloat16"]
  assert np.linalg.norm(full) > 0
  cosine = full @ half / (np.linalg.norm(full) * np.linalg.norm(half))
  assert cosine > 0.99, cosine
  np.testing.assert_allclose(np.linalg.norm(half), np.linalg.norm(full), rtol=0.05)
