"""The LM head over chunks of action positions: the same log-probs, entropies and gradients, less memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer

B, L, K, VOCAB = 3, 40, 13, 2048


@pytest.fixture(scope="module")
def model():
  config = transformer.tiny(VOCAB, num_layers=1, d_model=32, num_heads=2, mlp_dim=64,
                            position="rope", tie_embeddings=True)
  graphdef, params = transformer.create(config, 0)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, VOCAB, (B, L)), jnp.int32)
  # Rows with 13, 9 and 0 action tokens: a chunk of 4 leaves a ragged last chunk and padding.
  mask = np.zeros((B, L), bool)
  mask[0, 5:18], mask[1, 20:29] = True, True
  traj = types.empty_trajectories(B, L, 1).replace(
      tokens=np.asarray(tokens), action_mask=mask, turn_of_token=np.zeros((B, L), np.int32))
  positions = distribution.trajectory_positions(jax.tree.map(jnp.asarray, traj))
  view = distribution.action_view(jnp.asarray(mask), K)
  return graphdef, params, tokens, positions, view


def _objective(model, chunk):
  graphdef, _, tokens, positions, view = model

  def f(params):
    logp, entropy = distribution.action_log_probs(graphdef, params, tokens, positions, view,
                                                  None, 0.7, head_chunk=chunk)
    return jnp.sum(logp * jnp.arange(1, K + 1)) + 0.3 * jnp.sum(entropy), (logp, entropy)

  return f


@pytest.mark.parametrize("chunk", [1, 4, 13])
def test_chunked_head_equals_the_whole_head_in_values_and_gradients(model, chunk):
  params = model[1]
  (v0, (logp0, ent0)), g0 = jax.jit(jax.value_and_grad(_objective(model, None), has_aux=True))(params)
  (v1, (logp1, ent1)), g1 = jax.jit(jax.value_and_grad(_objective(model, chunk), has_aux=True))(params)
  np.testing.assert_allclose(logp1, logp0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent1, ent0, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(logp1)[2] == 0)  # the row without action tokens
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    # Float32 sums in another order: within 1e-5 of each leaf's scale.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.max(np.abs(b))))


def test_chunked_head_holds_less_temporary_memory(model):
  params = model[1]
  temp = lambda chunk: jax.jit(jax.grad(lambda p: _objective(model, chunk)(p)[0])).lower(
      params).compile().memory_analysis().temp_size_in_bytes
  logits_bytes = B * K * VOCAB * 4
  # Whole: several [B, K, V] arrays live in the backward; in chunks of 1, one row's worth.
  assert temp(1) + logits_bytes < temp(None), (temp(1), temp(None), logits_bytes)
