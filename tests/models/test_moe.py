"""MoE feed-forward: top-k routing, a NumPy reference, and routing record/replay (R3)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import moe
from agentrl_jax.models import transformer

CFG = transformer.tiny(40, d_model=16, num_heads=2, mlp_dim=24, num_experts=4, experts_per_token=2)
# Jitted once per input shape: op-by-op execution of a whole model is slow on CPU.
_apply_with_routing = jax.jit(transformer.apply_with_routing, static_argnums=0)


def test_route_hand_case():
  logits = jnp.asarray([[1.0, 3.0, 0.0, 2.0]])
  experts, gates = moe.route(logits, k=2)
  np.testing.assert_array_equal(experts, [[1, 3]])
  # softmax over the selected logits (3, 2): e/(e+1) = 0.7311, 1/(e+1) = 0.2689.
  np.testing.assert_allclose(gates, [[math.e / (math.e + 1), 1 / (math.e + 1)]], rtol=1e-6)
  # Replayed experts (0, 2): gates from the current logits over exactly those, softmax(1, 0).
  experts, gates = moe.route(logits, k=2, replay=jnp.asarray([[0, 2]]))
  np.testing.assert_array_equal(experts, [[0, 2]])
  np.testing.assert_allclose(gates, [[math.e / (math.e + 1), 1 / (math.e + 1)]], rtol=1e-6)


def _np_silu(x):
  return x / (1 + np.exp(-x))


def test_moe_layer_matches_numpy_loop_with_forced_experts():
  layer = moe.MoEFeedForward(CFG, transformer.nnx.Rngs(params=0))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 3, 16)).astype(np.float32)
  replay = rng.integers(0, 4, (2, 3, 2)).astype(np.int32)
  replay[..., 1] = (replay[..., 0] + 1 + rng.integers(0, 3, (2, 3))) % 4  # two distinct experts
  out, used = layer(jnp.asarray(x), jnp.asarray(replay))
  np.testing.assert_array_equal(used, replay)
  router, wg, wu, wd = (np.asarray(p[...]) for p in (layer.router, layer.w_gate, layer.w_up, layer.w_down))
  want = np.zeros_like(x)
  for b in range(2):
    for t in range(3):
      z = x[b, t] @ router
      sel = z[replay[b, t]]
      g = np.exp(sel - sel.max()) / np.exp(sel - sel.max()).sum()
      for j, e in enumerate(replay[b, t]):
        h = _np_silu(x[b, t] @ wg[e]) * (x[b, t] @ wu[e])
        want[b, t] += g[j] * (h @ wd[e])
  np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def _logp(logits, tokens):
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
  return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def test_recorded_routing_replayed_in_training_gives_sampler_log_probs():
  graphdef, params = transformer.create(CFG, seed=0)
  tokens = jax.random.randint(jax.random.key(1), (2, 10), 0, 40)
  pos = transformer.positions_from_turns(jnp.zeros((2, 10), jnp.int32))

  # Sample time: a prefill chunk then one token at a time through the KV cache, recording experts.
  cache = transformer.init_cache(CFG, batch_size=2, capacity=16)
  chunks, recorded = [], []
  for a, b in [(0, 4)] + [(t, t + 1) for t in range(4, 10)]:
    sub = transformer.Positions(*(p[:, a:b] for p in pos))
    out, cache, experts = _apply_with_routing(graphdef, params, tokens[:, a:b], sub, cache)
    cache = cache.replace(length=cache.length + (b - a))
    chunks.append(out)
    recorded.append(experts)
  sample_logits = jnp.concatenate(chunks, axis=1)
  recorded = jnp.concatenate(recorded, axis=1)
  assert recorded.shape == (2, 10, CFG.num_layers, CFG.experts_per_token)

  # Train time: one full forward pass with the recorded experts replayed.
  train_logits, _, used = _apply_with_routing(graphdef, params, tokens, pos,
                                                         routing=recorded)
  np.testing.assert_array_equal(used, recorded)
  np.testing.assert_allclose(_logp(train_logits, tokens), _logp(sample_logits, tokens), atol=1e-5)
  # `apply` (here eager, the other jitted) with the same routing is the same computation.
  plain, _ = transformer.apply(graphdef, params, tokens, pos, routing=recorded)
  np.testing.assert_allclose(plain, train_logits, atol=1e-5)


def test_replay_overrides_the_router_and_gradients_reach_it():
  graphdef, params = transformer.create(CFG, seed=0)
  tokens = jax.random.randint(jax.random.key(2), (1, 6), 0, 40)
  pos = transformer.positions_from_turns(jnp.zeros((1, 6), jnp.int32))
  _, _, free = _apply_with_routing(graphdef, params, tokens, pos)
  forced = (free + 1) % CFG.num_experts  # a different, still distinct, pair everywhere
  _, _, used = _apply_with_routing(graphdef, params, tokens, pos, routing=forced)
  np.testing.assert_array_equal(used, forced)

  def loss(params):
    logits, _ = transformer.apply(graphdef, params, tokens, pos, routing=forced)
    return -jnp.mean(_logp(logits, tokens))

  grads = jax.jit(jax.grad(loss))(params)
  router_grad = np.asarray(grads["blocks"][0]["mlp"]["router"][...])
  assert np.all(np.isfinite(router_grad)) and np.abs(router_grad).max() > 0


def test_moe_params_count_and_dense_model_rejects_replay():
  _, params = transformer.create(CFG, seed=0)
  assert sum(np.size(x) for x in jax.tree.leaves(params)) == transformer.num_params(CFG)
  dense = transformer.tiny(40, d_model=16, num_heads=2, mlp_dim=24)
  graphdef, dense_params = transformer.create(dense, seed=0)
  pos = transformer.positions_from_turns(jnp.zeros((1, 3), jnp.int32))
  with pytest.raises(ValueError, match="dense model"):
    transformer.apply(graphdef, dense_params, jnp.zeros((1, 3), jnp.int32), pos,
                      routing=jnp.zeros((1, 3, 2, 2), jnp.int32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_experts=-1), "num_experts"), (dict(num_experts=4, experts_per_token=5), "experts_per_token"),
])
def test_bad_moe_config_names_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    transformer.TransformerConfig(vocab_size=10, d_model=16, num_heads=4, **kwargs)
