"""Gradient accumulation: an update over micro-batches is the update over the whole minibatch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import step as step_lib
from agentrl_jax.losses import policy as policy_loss
from agentrl_jax.models import transformer as tfm

V, B, L, N = 16, 8, 12, 3


def _traj():
  """Eight rows whose action-token counts differ (1 to 5), so micro-batches hold unequal
  shares of the tokens: averaging per-slice token means would weigh them wrongly."""
  t = types.empty_trajectories(B, L, N)
  rng = np.random.default_rng(0)
  t.tokens[:] = rng.integers(0, V, (B, L))
  t.turn_of_token[:, :3] = 0
  t.turn_of_token[:, 3:] = 1
  for r in range(B):
    n_actions = 1 + r % 5
    t.action_mask[r, 3 - 1:3] = True  # one action token in turn 0
    t.action_mask[r, 6:6 + n_actions] = True
    t.sample_logprob[r] = np.where(t.action_mask[r], -2.0 + 0.1 * r, 0.0)
  t.turn_start[:, 0], t.turn_end[:, 0] = 2, 3
  t.turn_start[:, 1], t.turn_end[:, 1] = 6, 11
  t.turn_mask[:, :2] = True
  t.group_id[:] = np.arange(B) // 2
  outcome = rng.normal(size=B).astype(np.float32)
  t.outcome[:] = outcome
  t.reward[:, 1] = outcome
  t.success[:] = outcome > 0
  return jax.tree.map(jnp.asarray, t)


def _update(loss: step_lib.LossConfig, critic: bool):
  cfg = tfm.tiny(V, d_model=16, num_heads=2, mlp_dim=32)
  graphdef, params = tfm.create(cfg, seed=0)
  critic_cfg = tfm.tiny(V, d_model=16, num_heads=2, mlp_dim=32, head="value")
  critic_graphdef, critic_params = tfm.create(critic_cfg, seed=1) if critic else (None, None)
  opt = optax.adam(1e-2)
  state = types.ActorCriticState(
      step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(jax.random.key(0)),
      policy_params=params, policy_opt_state=opt.init(params),
      critic_params=critic_params, critic_opt_state=opt.init(critic_params) if critic else None,
      ref_params=jax.tree.map(lambda x: x * 0.9, params) if loss.kl_coef else None)
  estimator = (estimators.get_estimator("gae") if critic else
               functools.partial(estimators.get_estimator("grpo"), num_groups=B // 2))
  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=critic_graphdef, policy_optimizer=opt,
      critic_optimizer=opt if critic else None, advantage_fn=estimator, loss=loss, allowed=None,
      max_actions=6)
  return state, update


def _run(loss, critic):
  state, update = _update(loss, critic)
  state, metrics = update(state, _traj())
  return jax.device_get(state), jax.device_get(metrics)


@pytest.mark.parametrize("loss_kwargs,critic", [
    (dict(), False),
    (dict(agg_mode="seq-mean-token-mean", entropy_coef=0.01, kl_coef=0.1, tis_cap=2.0), False),
    (dict(agg_mode="seq-mean-token-sum", num_minibatches=2, ppo_epochs=2), True),
    (dict(agg_mode="seq-mean-token-sum-norm", max_len_norm=8, ratio_level="turn"), False),
])
def test_micro_batches_give_the_minibatch_update(loss_kwargs, critic):
  whole = step_lib.LossConfig(**loss_kwargs)
  sliced = step_lib.LossConfig(**loss_kwargs, micro_batches=2 if whole.num_minibatches > 1 else 4)
  state_a, metrics_a = _run(whole, critic)
  state_b, metrics_b = _run(sliced, critic)
  assert set(metrics_a) == set(metrics_b)
  for key in metrics_a:
    np.testing.assert_allclose(metrics_b[key], metrics_a[key], atol=1e-5, rtol=1e-5, err_msg=key)
  assert abs(float(metrics_a["loss/policy"])) > 1e-3  # a real loss was compared, not zeros
  for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)
  # The step moved the parameters: equality above is not two no-ops.
  initial, _ = _update(whole, critic)
  moved = [not np.allclose(x, y) for x, y in zip(jax.tree.leaves(initial.policy_params),
                                                  jax.tree.leaves(state_a.policy_params))]
  assert any(moved)


def test_micro_batch_share_weighs_token_counts():
  # Rows with 1, 2, 3, 4 action tokens; the first two rows as a slice hold 3 of the 10 tokens.
  mask = jnp.asarray([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], bool)
  values = jnp.arange(16.0).reshape(4, 4)
  for mode, share in (("token-mean", 3 / 10), ("seq-mean-token-sum", 2 / 4),
                      ("seq-mean-token-mean", 2 / 4), ("seq-mean-token-sum-norm", 1.0)):
    got = step_lib.micro_batch_share(mask[:2], mask, mode)
    np.testing.assert_allclose(got, share, rtol=1e-6)
    parts = sum(policy_loss.aggregate(values[s], mask[s], mode, max_len=4)
                * step_lib.micro_batch_share(mask[s], mask, mode) for s in (slice(0, 2), slice(2, 4)))
    np.testing.assert_allclose(parts, policy_loss.aggregate(values, mask, mode, max_len=4),
                               rtol=1e-6, err_msg=mode)


def test_micro_batches_must_divide_the_minibatch():
  state, update = _update(step_lib.LossConfig(micro_batches=3), critic=False)
  with pytest.raises(ValueError, match="micro_batches=3"):
    update(state, _traj())
  with pytest.raises(ValueError, match="micro_batches"):
    step_lib.LossConfig(micro_batches=0)


def _sft(micro_batches: int):
  cfg = tfm.tiny(V, d_model=16, num_heads=2, mlp_dim=32)
  graphdef, params = tfm.create(cfg, seed=0)
  opt = optax.sgd(0.5)
  sft = step_lib.make_sft_fn(policy_graphdef=graphdef, optimizer=opt, allowed=None,
                             max_actions=6, micro_batches=micro_batches)
  initial = jax.device_get(params)  # the step donates its inputs
  return initial, *sft(params, opt.init(params), _traj())


def test_micro_batched_behaviour_cloning_is_the_whole_batch_step():
  initial, whole, _, whole_metrics = _sft(1)
  _, sliced, _, sliced_metrics = _sft(4)
  np.testing.assert_allclose(sliced_metrics["sft/nll"], whole_metrics["sft/nll"], rtol=1e-5)
  assert float(whole_metrics["sft/nll"]) > 1.0  # an untrained policy's NLL, not a zero
  moved = False
  for a, b, x in zip(jax.tree.leaves(whole), jax.tree.leaves(sliced), jax.tree.leaves(initial)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-5)
    moved |= not np.allclose(a, x)
  assert moved
  with pytest.raises(ValueError, match="micro_batches=3"):
    _sft(3)
