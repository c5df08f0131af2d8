"""The transformer's memory options: per-layer rematerialisation and the bfloat16 compute dtype."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from agentrl_jax.models import transformer as tfm


def _batch(vocab, batch=2, length=10):
  tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, vocab)
  turns = jnp.broadcast_to(jnp.repeat(jnp.arange(2, dtype=jnp.int32), length // 2), (batch, length))
  return tokens, tfm.positions_from_turns(turns)


def _loss_fn(cfg):
  graphdef, params = tfm.create(cfg, seed=0)
  tokens, pos = _batch(cfg.vocab_size)

  def loss(p):
    logits, _ = tfm.apply(graphdef, p, tokens, pos)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  return loss, params


@pytest.mark.parametrize("remat", ["layer", "layer_dots"])
@pytest.mark.parametrize("position", ["rope", "turn_slot"])
def test_remat_gradients_equal_plain_gradients(position, remat):
  cfg = tfm.tiny(40, d_model=32, num_heads=4, num_kv_heads=2, mlp_dim=64, position=position,
                 alibi=position == "turn_slot", qkv_bias=True)
  plain_loss, params = _loss_fn(cfg)
  remat_loss, _ = _loss_fn(dataclasses.replace(cfg, remat=remat))
  v0, g0 = jax.jit(jax.value_and_grad(plain_loss))(params)
  v1, g1 = jax.jit(jax.value_and_grad(remat_loss))(params)
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_remat_layer_keeps_one_layers_intermediates_alive():
  # Equal gradients alone would pass with remat silently off: XLA's temporary memory for the
  # gradient must shrink to about the layers' inputs plus one layer's intermediates.
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=512, num_layers=8)

  def temporary_bytes(remat):
    graphdef, params = tfm.create(dataclasses.replace(cfg, remat=remat), seed=0)
    tokens, pos = _batch(40, batch=4, length=64)

    def loss(p):
      return jnp.sum(tfm.apply(graphdef, p, tokens, pos)[0] ** 2)

    return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

  plain, remat = temporary_bytes("none"), temporary_bytes("layer")
  assert remat < 0.5 * plain, (remat, plain)
  # Keeping the weight matmuls' outputs costs memory between the two (more than 'layer', whose
  # backward recomputes them; less than the plain pass, which also keeps the elementwise ones).
  dots = temporary_bytes("layer_dots")
  assert remat < dots < plain, (remat, dots, plain)


def test_remat_layer_dots_recomputes_no_weight_matmul():
  # The backward of 'layer' runs every layer's forward matmuls again; 'layer_dots' keeps their
  # outputs, so its gradient program has as many weight dots as the plain pass's.
  # One layer: the scan's body is then the whole stack, as the plain pass's unrolled layers are.
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=64, num_layers=1)
  tokens, pos = _batch(40)

  def dots(remat):
    graphdef, params = tfm.create(dataclasses.replace(cfg, remat=remat), seed=0)
    loss = lambda p: jnp.sum(tfm.apply(graphdef, p, tokens, pos)[0] ** 2)
    jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
    return _count_weight_dots(jaxpr.jaxpr)

  assert dots("layer_dots") == dots("none") < dots("layer"), (
      dots("layer_dots"), dots("none"), dots("layer"))


def _count_weight_dots(jaxpr) -> int:
  """dot_generals without batch dimensions in `jaxpr` and its sub-jaxprs."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (_, _), (batch_lhs, _) = eqn.params["dimension_numbers"]
      count += not batch_lhs
    for sub in jax.core.jaxprs_in_params(eqn.params):
      count += _count_weight_dots(sub)
  return count


def test_remat_layer_replays_moe_routing_like_the_plain_pass():
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=32, num_layers=2, num_experts=4,
                 experts_per_token=2)
  graphdef, params = tfm.create(cfg, seed=0)
  remat_graphdef, _ = tfm.create(dataclasses.replace(cfg, remat="layer"), seed=0)
  tokens, pos = _batch(40)
  model = lambda g: nnx.merge(g, params)
  x0, _, experts0 = model(graphdef).features_and_routing(tokens, pos)
  x1, _, experts1 = model(remat_graphdef).features_and_routing(tokens, pos)
  np.testing.assert_array_equal(experts1, experts0)
  np.testing.assert_allclose(x1, x0, atol=1e-5, rtol=1e-5)
  # Replaying other experts changes the output the same way on both paths.
  other = (experts0 + 1) % 4
  y0, _, _ = model(graphdef).features_and_routing(tokens, pos, routing=other)
  y1, _, replayed = model(remat_graphdef).features_and_routing(tokens, pos, routing=other)
  np.testing.assert_array_equal(replayed, other)
  np.testing.assert_allclose(y1, y0, atol=1e-5, rtol=1e-5)
  assert not np.allclose(y0, x0)


def test_remat_does_not_change_the_cached_forward():
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=64)
  graphdef, params = tfm.create(cfg, seed=0)
  remat_graphdef, _ = tfm.create(dataclasses.replace(cfg, remat="layer"), seed=0)
  tokens, pos = _batch(40)
  cache = tfm.init_cache(cfg, batch_size=2, capacity=16)
  a, _ = tfm.apply(graphdef, params, tokens, pos, cache)
  b, _ = tfm.apply(remat_graphdef, params, tokens, pos, cache)
  np.testing.assert_array_equal(a, b)


def test_bfloat16_logits_are_within_bfloat16_tolerance_of_float32():
  cfg = tfm.tiny(64, d_model=64, num_heads=4, num_kv_heads=2, mlp_dim=128, qkv_bias=True)
  graphdef, params = tfm.create(cfg, seed=0)
  bf16_graphdef, _ = tfm.create(dataclasses.replace(cfg, dtype="bfloat16"), seed=0)
  tokens, pos = _batch(64, length=12)
  full, _ = tfm.apply(graphdef, params, tokens, pos)
  half, _ = tfm.apply(bf16_graphdef, params, tokens, pos)
  assert full.dtype == half.dtype == jnp.float32  # logits accumulate in float32 either way
  # bfloat16 keeps 8 significant bits (relative step 2^-8 ≈ 0.4%); two layers of rounded
  # activations stay within a few steps of the logits' scale.
  scale = float(jnp.max(jnp.abs(full)))
  err = float(jnp.max(jnp.abs(half - full)))
  assert err < 0.05 * scale, (err, scale)
  assert err > 0.0  # the bfloat16 path really rounds (it is not the float32 path)
  # The log-probs the learner reads agree to bfloat16 precision too.
  lp_full, lp_half = jax.nn.log_softmax(full), jax.nn.log_softmax(half)
  np.testing.assert_allclose(lp_half, lp_full, atol=0.05)


def test_float32_dtype_is_the_unchanged_path():
  # No cast to or from bfloat16 anywhere in the float32 program, so its numbers are the old ones
  # (tests/models/test_transformer.py checks those against the cached forward and HF).
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=64, qkv_bias=True)
  graphdef, params = tfm.create(cfg, seed=0)
  tokens, pos = _batch(40)
  jaxpr = str(jax.make_jaxpr(lambda p: tfm.apply(graphdef, p, tokens, pos)[0])(params))
  assert "bf16" not in jaxpr
  bf16_graphdef, _ = tfm.create(dataclasses.replace(cfg, dtype="bfloat16"), seed=0)
  assert "bf16" in str(jax.make_jaxpr(lambda p: tfm.apply(bf16_graphdef, p, tokens, pos)[0])(params))


@pytest.mark.parametrize("kwargs,match", [
    (dict(remat="all"), "remat"), (dict(dtype="float16"), "dtype")])
def test_bad_memory_options_are_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    tfm.tiny(40, **kwargs)
