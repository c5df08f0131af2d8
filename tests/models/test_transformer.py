"""Decoder LM: cached chunked forward equals the full forward; config validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import transformer as tfm


def _turns(lengths, total):
  row = np.full(total, -1, np.int32)
  start = 0
  for turn, n in enumerate(lengths):
    row[start:start + n] = turn
    start += n
  return row


@pytest.mark.parametrize("position,alibi,kv_heads,qkv_bias", [
    ("rope", False, 2, True),
    ("turn_slot", True, None, False),
])
def test_chunked_cached_forward_equals_full_forward(position, alibi, kv_heads, qkv_bias):
  cfg = tfm.tiny(50, d_model=32, num_heads=4, mlp_dim=64, position=position, alibi=alibi,
                 num_kv_heads=kv_heads, qkv_bias=qkv_bias)
  graphdef, params = tfm.create(cfg, seed=0)
  tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 50)
  turns = jnp.asarray(np.stack([_turns([5, 7], 12)] * 2))
  pos = tfm.positions_from_turns(turns)
  full, _ = tfm.apply(graphdef, params, tokens, pos)

  cache = tfm.init_cache(cfg, batch_size=2, capacity=24)
  pieces = []
  for a, b in [(0, 5), (5, 9), (9, 12)]:
    sub = tfm.Positions(*(x[:, a:b] for x in pos))
    out, cache = tfm.apply(graphdef, params, tokens[:, a:b], sub, cache)
    cache = cache.replace(length=cache.length + (b - a))
    pieces.append(out)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-4, rtol=1e-4)


def test_positions_from_turns_slots_restart_each_turn():
  turns = jnp.asarray([_turns([3, 2, 4], 11)])
  pos = tfm.positions_from_turns(turns)
  # Turn 0 covers tokens 0-2, turn 1 tokens 3-4, turn 2 tokens 5-8, then two padding tokens.
  np.testing.assert_array_equal(pos.slot[0], [0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0])
  np.testing.assert_array_equal(pos.turn[0], [0, 0, 0, 1, 1, 2, 2, 2, 2, 0, 0])
  np.testing.assert_array_equal(pos.position[0], np.arange(11))


def test_value_head_outputs_one_value_per_token():
  cfg = tfm.tiny(30, d_model=16, num_heads=2, mlp_dim=32, head="value")
  graphdef, params = tfm.create(cfg, seed=0)
  tokens = jnp.zeros((3, 7), jnp.int32)
  values, _ = tfm.apply(graphdef, params, tokens, tfm.positions_from_turns(jnp.zeros((3, 7), jnp.int32)))
  assert values.shape == (3, 7)


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=3), "not divisible"),
    (dict(num_heads=4, num_kv_heads=3), "multiple"),
    (dict(position="alibi"), "position"),
    (dict(num_layers=0), "num_layers"),
])
def test_bad_config_names_the_field(kwargs, match):
  base = dict(vocab_size=10, d_model=16, num_heads=4)
  base.update(kwargs)
  with pytest.raises(ValueError, match=match):
    tfm.TransformerConfig(**base)


def test_parameters_carry_logical_axes():
  cfg = tfm.tiny(20, d_model=16, num_heads=2, mlp_dim=32)
  model = tfm.Transformer(cfg, tfm.nnx.Rngs(params=0))
  axes = {v.get_metadata()["logical_axes"] for _, v in tfm.nnx.iter_graph(model)
          if isinstance(v, tfm.nnx.Param)}
  assert ("vocab", "embed") in axes and ("embed", "mlp") in axes
