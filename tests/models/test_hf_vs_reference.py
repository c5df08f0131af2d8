"""Logit and greedy-generation parity with HF transformers on tiny random checkpoints.

Each checkpoint is built here with `transformers` (torch CPU), saved as safetensors, and loaded by
`models/hf.py`. Needs the `hf` extra (torch, transformers, safetensors); skipped without it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from agentrl_jax.models import hf  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402

V = 96
SHAPE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
               "rope_theta": 500000.0}


def _build(kind: str):
  torch.manual_seed(0 if kind == "qwen2" else 1)
  if kind == "qwen2":  # q/k/v biases, tied embeddings
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SHAPE, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6))
  else:  # Llama 3 rope scaling, untied head, explicit head_dim
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SHAPE, tie_word_embeddings=False, head_dim=8, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE))
  with torch.no_grad():
    for p in model.parameters():  # init std 0.02 would make every logit nearly equal
      p.normal_(0.0, 0.3)
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  return model.eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def checkpoint(request, tmp_path_factory):
  model = _build(request.param)
  path = str(tmp_path_factory.mktemp(request.param))
  model.save_pretrained(path, safe_serialization=True)
  config, graphdef, params = hf.load(path)
  return request.param, model, path, config, graphdef, params


def _tokens(batch, length, seed=0):
  return np.random.default_rng(seed).integers(0, V, (batch, length)).astype(np.int32)


def test_logits_match_hf_in_float32(checkpoint):
  kind, model, _, config, graphdef, params = checkpoint
  assert config.qkv_bias == (kind == "qwen2")
  tokens = _tokens(2, 48)
  with torch.no_grad():
    want = model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  pos = transformer.positions_from_turns(jnp.zeros(tokens.shape, jnp.int32))
  got, _ = transformer.apply(graphdef, params, jnp.asarray(tokens), pos)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
  if kind == "llama":
    # The Llama 3 frequency scaling matters: dropping it moves the logits far past the tolerance.
    import dataclasses
    plain = dataclasses.replace(config, rope_scaling_factor=None)
    plain_def, _ = transformer.create(plain, 0)
    off, _ = transformer.apply(plain_def, params, jnp.asarray(tokens), pos)
    assert np.abs(np.asarray(off) - want).max() > 1e-2


def test_greedy_generation_matches_hf_generate(checkpoint):
  _, model, _, config, graphdef, params = checkpoint
  prompt, new = _tokens(4, 10, seed=1), 12
  with torch.no_grad():
    want = model.generate(torch.tensor(prompt, dtype=torch.long), do_sample=False,
                          max_new_tokens=new, min_new_tokens=new).numpy()[:, prompt.shape[1]:]
  sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=new)
  turn = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  cache = transformer.init_cache(config, batch_size=4, capacity=32)
  out = turn(params, cache, jnp.asarray(prompt), jnp.full((4,), 10, jnp.int32),
             jnp.ones((4,), bool), jnp.int32(0), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.tokens), want)


def test_export_round_trip_is_exact_and_hf_reads_it(checkpoint, tmp_path):
  kind, model, path, config, _, params = checkpoint
  hf.export(str(tmp_path), config, params, model_type=kind)
  original = safetensors_numpy.load_file(f"{path}/model.safetensors")
  exported = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
  assert sorted(exported) == sorted(original)
  for name in original:
    assert exported[name].dtype == original[name].dtype, name
    np.testing.assert_array_equal(exported[name], original[name], err_msg=name)
  again = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
  tokens = torch.tensor(_tokens(1, 20, seed=2), dtype=torch.long)
  with torch.no_grad():
    np.testing.assert_array_equal(again(tokens).logits.numpy(), model(tokens).logits.numpy())
