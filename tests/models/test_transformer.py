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


# Published parameter counts of the released checkpoints (their model cards / safetensors totals).
@pytest.mark.parametrize("name,count", [
    ("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304), ("qwen2.5-3b", 3_085_938_688),
    ("qwen2.5-7b", 7_615_616_512), ("llama-3.2-1b", 1_235_814_400),
    ("llama-3.2-3b", 3_212_749_824), ("llama-3.1-8b", 8_030_261_248),
])
def test_presets_have_the_released_parameter_counts(name, count):
  assert tfm.num_params(tfm.PRESETS[name]()) == count


def test_num_params_counts_the_built_arrays():
  for cfg in [tfm.tiny(50, qkv_bias=True, num_kv_heads=2),
              tfm.tiny(50, position="turn_slot", tie_embeddings=False),
              tfm.tiny(50, head="value", head_dim=8)]:
    _, params = tfm.create(cfg, seed=0)
    assert sum(np.size(x) for x in jax.tree.leaves(params)) == tfm.num_params(cfg)


def test_llama3_rope_scaling_hand_case():
  # head_dim 6, theta 1e4: inv_freq = 1, 1e4^(-1/3) = 0.046416, 1e4^(-2/3) = 0.0021544;
  # wavelengths 2π/f = 6.28, 135.4, 2916. With original 256, low 1, high 4, factor 8 the bands
  # are: wavelength < 256/4 = 64 unchanged; > 256/1 = 256 divided by 8; in between interpolated
  # with s = (256/135.37 − 1)/(4 − 1) = 0.29705: f' = (1 − s)·f/8 + s·f.
  f = 10000.0 ** (-1 / 3)
  s = (256 / (2 * np.pi / f) - 1) / 3
  want = [1.0, (1 - s) * f / 8 + s * f, 10000.0 ** (-2 / 3) / 8]
  got = tfm.rope_frequencies(6, 10000.0, scaling_factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position=256)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_allclose(tfm.rope_frequencies(6, 10000.0), [1.0, f, f * f], rtol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(rope_scaling_factor=0.5), "rope_scaling_factor"),
    (dict(rope_scaling_factor=8.0, rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), "low_freq"),
])
def test_bad_rope_scaling_names_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    tfm.TransformerConfig(vocab_size=10, d_model=16, num_heads=4, **kwargs)
