"""Critics: copied from the policy's trunk, or a value head on the shared trunk."""

import jax
import jax.numpy as jnp
import numpy as np

from agentrl_jax.models import critic
from agentrl_jax.models import transformer

CFG = transformer.tiny(30, d_model=16, num_heads=2, mlp_dim=32, tie_embeddings=False)


def _inputs():
  tokens = jax.random.randint(jax.random.key(0), (2, 6), 0, 30)
  return tokens, transformer.positions_from_turns(jnp.zeros((2, 6), jnp.int32))


def test_critic_from_policy_copies_the_trunk_and_starts_at_zero():
  p_def, p_params = transformer.create(CFG, seed=0)
  c_def, c_params = critic.critic_from_policy(CFG, p_params)
  tokens, pos = _inputs()
  values, _ = transformer.apply(c_def, c_params, tokens, pos)
  np.testing.assert_array_equal(values, np.zeros((2, 6)))
  # Same features as the policy: the trunk is an exact copy.
  p_feat, _ = transformer.nnx.merge(p_def, p_params).features(tokens, pos)
  c_feat, _ = transformer.nnx.merge(c_def, c_params).features(tokens, pos)
  np.testing.assert_array_equal(c_feat, p_feat)
  assert "lm_head" not in c_params and "value_head" in c_params


def test_shared_trunk_values_and_detached_gradient():
  graphdef, params = transformer.create(CFG, seed=0)
  tokens, pos = _inputs()
  head = critic.value_head_params(CFG) + 0.5
  values = critic.shared_trunk_values(graphdef, params, head, tokens, pos)
  feat, _ = transformer.nnx.merge(graphdef, params).features(tokens, pos)
  np.testing.assert_allclose(values, 0.5 * feat.sum(-1), rtol=1e-5, atol=1e-5)

  def loss(params, head, detach):
    return jnp.mean(critic.shared_trunk_values(graphdef, params, head, tokens, pos, detach) ** 2)

  g_params, g_head = jax.grad(loss, argnums=(0, 1))(params, head, True)
  assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree.leaves(g_params))
  assert float(jnp.abs(g_head).max()) > 0
  g_params, _ = jax.grad(loss, argnums=(0, 1))(params, head, False)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g_params)) > 0
