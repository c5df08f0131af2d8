"""The PPO update on 8 fake CPU devices equals the single-device update under every layout."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import rules as rules_lib

B, L, N, V = 8, 16, 2, 64


def _trajectories() -> types.Trajectories:
  """8 rows of two turns: obs 0-4 | act 5-7 | obs 8-11 | act 12-14 | one padding token."""
  rng = np.random.default_rng(0)
  traj = types.empty_trajectories(B, L, N)
  turn = np.full(L, -1, np.int32)
  turn[0:8], turn[8:15] = 0, 1
  act = np.zeros(L, bool)
  act[5:8] = act[12:15] = True
  traj = traj.replace(
      tokens=rng.integers(0, V, (B, L)).astype(np.int32),
      action_mask=np.broadcast_to(act, (B, L)).copy(),
      turn_of_token=np.broadcast_to(turn, (B, L)).copy(),
      sample_logprob=np.where(act, -2.0, 0.0).astype(np.float32) * np.ones((B, 1), np.float32),
      turn_mask=np.ones((B, N), bool),
      reward=rng.normal(size=(B, N)).astype(np.float32),
      done=np.array([[False, True]] * B),
      turn_start=np.array([[5, 12]] * B, np.int32), turn_end=np.array([[8, 15]] * B, np.int32),
      group_id=np.repeat(np.arange(2), 4).astype(np.int32),
      outcome=rng.normal(size=B).astype(np.float32))
  traj.validate()
  return traj


def _setup():
  config = transformer.tiny(V, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, qkv_bias=True)
  # Momentum SGD at lr 1: the step is the gradient itself, so the comparison below bounds the
  # gradients' difference, and the momentum buffer is optimizer state to shard. (Adam's first
  # step, lr·g/(|g|+eps), turns round-off in a near-zero gradient into a visible step: with
  # reductions reordered by the layout, one weight in 2048 moved 1.1e-5 differently.)
  optimizer = optax.sgd(1.0, momentum=0.9)
  graphdef, _ = transformer.create(config, 0)

  def init():
    _, params = transformer.create(config, 0)
    return types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                  rng=jax.random.key_data(jax.random.key(0)),
                                  policy_params=params, policy_opt_state=optimizer.init(params))

  update = step_lib.make_update_fn(
      policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optimizer,
      critic_optimizer=None,
      advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=2),
      loss=step_lib.LossConfig(), allowed=None, max_actions=6)
  return init, update


@functools.cache
def _single_device_result():
  init, update = _setup()
  with jax.default_device(jax.devices()[0]):
    state, metrics = update(init(), jax.tree.map(jnp.asarray, _trajectories()))
  return jax.device_get(state.policy_params), jax.device_get(metrics)


# Each layout compiles the update once (~20-40 s on 2 shared cores); fsdp+tensor, which exercises
# every rule, runs by default and the other two with -m slow.
@pytest.mark.parametrize("preset", [pytest.param("data", marks=pytest.mark.slow),
                                    pytest.param("fsdp", marks=pytest.mark.slow), "fsdp_tensor"])
def test_sharded_update_equals_single_device(preset):
  assert jax.device_count() == 8
  mesh = mesh_lib.make_mesh(mesh_lib.PRESETS[preset])
  rules = rules_lib.logical_rules("train")
  init, update = _setup()
  state = rules_lib.create_sharded(init, mesh, rules)
  expected_shardings = rules_lib.state_shardings(state, mesh, rules)

  # Parameters live where the table says, and (for fsdp layouts) really are split.
  for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected_shardings)):
    assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
  rules_lib.check_sufficiently_sharded(state.policy_params, expected_shardings.policy_params, mesh)
  wq = state.policy_params["blocks"][0]["attn"]["wq"][...]
  n_shards = len({tuple((s.start, s.stop) for s in idx) for idx in
                  wq.sharding.devices_indices_map(wq.shape).values()})
  assert n_shards == mesh_lib.model_parallel_size(mesh)

  new_state, metrics = update(state, rules_lib.shard_batch(_trajectories(), mesh))
  # XLA keeps the layout through the update, so the donated buffers are reused in place.
  for leaf, want in zip(jax.tree.leaves(new_state.policy_params),
                        jax.tree.leaves(expected_shardings.policy_params)):
    assert leaf.sharding.is_equivalent_to(want, leaf.ndim)
  want_params, want_metrics = _single_device_result()
  got = jax.device_get(new_state.policy_params)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want_params)):
    np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
  for key in want_metrics:
    np.testing.assert_allclose(metrics[key], want_metrics[key], atol=1e-5, rtol=1e-5, err_msg=key)
  # The update really moved the parameters (so the equality above is not vacuous).
  moved = max(float(np.abs(g - b).max()) for g, b in zip(
      jax.tree.leaves(got), jax.tree.leaves(jax.device_get(init().policy_params))))
  assert moved > 1e-3
