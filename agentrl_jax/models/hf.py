"""Hugging Face checkpoints (Qwen2/Qwen2.5, Llama 3): load a safetensors directory, export back.

A checkpoint directory holds `config.json` and either `model.safetensors` or shards listed in
`model.safetensors.index.json`. Loading maps `config.json` to a `TransformerConfig`, checks every
tensor's name, shape and dtype against it, and builds each parameter with
`jax.make_array_from_callback`: each device reads only its own block of each tensor from the
memory-mapped file (`safetensors.safe_open(...).get_slice`), so a large model never exists as one
host copy. Files are read and written with the `safetensors` package (numpy framework, no torch).

Layout differences handled here (HF -> ours):
  * linear weights are stored [out, in] by HF, [in, out] here;
  * attention projections are split into heads: q [D, H, Dh], k/v [D, KV, Dh], o [H, Dh, D];
  * the LM head of untied models is [D, V].
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import json
import math
import os
import struct
from typing import Any, Callable, Iterable, Iterator

import jax
import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy
from flax import nnx

from agentrl_jax.models import transformer

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

# safetensors (0.6 on) reads and writes BF16 as ml_dtypes.bfloat16 in its numpy framework, so
# bf16 checkpoints need no raw-byte fallback; this table bounds what a checkpoint may hold.
_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
_TORCH_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------
# safetensors files


def _open(path: str):
  """`path` opened memory-mapped; any layout problem is a one-line CheckpointError naming it."""
  try:
    return safetensors.safe_open(path, framework="numpy")
  except safetensors.SafetensorError as e:
    # safe_open checks that the header parses and that the tensors' byte ranges tile the file,
    # so a cut-off download fails here, before anything is read.
    reason = " ".join(str(e).split())
    raise CheckpointError(f"{path}: truncated or corrupt safetensors file ({reason})") from None
  except OSError as e:
    raise CheckpointError(f"{path}: cannot open ({e.strerror or e})") from None


class MappedTensors(collections.abc.Mapping):
  """The tensors of one or more .safetensors files by name; `[name]` reads that tensor whole.

  The files stay memory-mapped: nothing is read until a tensor (or a block, `read`) is asked for.
  """

  def __init__(self, paths: Iterable[str]):
    self._where: dict[str, tuple[str, Any]] = {}
    for path in paths:
      handle = _open(path)
      for name in handle.keys():
        dtype = handle.get_slice(name).get_dtype()
        if dtype not in _DTYPES:
          raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
        self._where[name] = (path, handle)

  def __getitem__(self, name: str) -> np.ndarray:
    return self._where[name][1].get_tensor(name)

  def __iter__(self) -> Iterator[str]:
    return iter(self._where)

  def __len__(self) -> int:
    return len(self._where)

  def path(self, name: str) -> str:
    return self._where[name][0]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._where[name][1].get_slice(name).get_shape())

  def dtype(self, name: str) -> str:
    """The safetensors dtype name ('F32', 'BF16', ...)."""
    return self._where[name][1].get_slice(name).get_dtype()

  def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """Only the block `index` of tensor `name` (basic slices, one per dimension)."""
    return self._where[name][1].get_slice(name)[index]


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
  """The header of a .safetensors file and the byte offset where tensor data starts."""
  with _open(path):
    pass  # Validates the layout; the package does not expose the data offsets, so read them.
  with open(path, "rb") as f:
    (size,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(size))
  header.pop("__metadata__", None)
  return header, 8 + size


def open_safetensors(path: str) -> MappedTensors:
  """Every tensor of a .safetensors file, memory-mapped; each is read when it is looked up."""
  return MappedTensors([path])


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  """Writes tensors as one .safetensors file, atomically."""
  arrays = {}
  for name, tensor in tensors.items():
    # save_file copies the raw buffer from the data pointer: a strided view would be written
    # scrambled, hence the contiguous copy.
    arrays[name] = np.ascontiguousarray(tensor)
    if arrays[name].dtype not in _DTYPE_NAMES:
      raise ValueError(f"write_safetensors: tensor {name!r} has unsupported dtype "
                       f"{arrays[name].dtype}")
  tmp = path + ".tmp"
  # transformers' loader rejects a safetensors file whose metadata lacks a known "format".
  safetensors.numpy.save_file(arrays, tmp, metadata={"format": "pt"})
  os.replace(tmp, path)


def _listed_shards(index: str) -> dict[str, str]:
  with open(index) as f:
    try:
      weight_map = json.load(f).get("weight_map")
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{index}: invalid JSON ({e})") from None
  if not isinstance(weight_map, dict):
    raise CheckpointError(f"{index}: no 'weight_map'")
  return weight_map


def _sharded_tensors(directory: str, index: str) -> MappedTensors:
  weight_map = _listed_shards(index)
  paths = []
  for shard in sorted(set(weight_map.values())):
    paths.append(os.path.join(directory, shard))
    if not os.path.exists(paths[-1]):
      raise CheckpointError(f"{index} lists shard {shard!r}, which is missing from {directory}")
  tensors = MappedTensors(paths)
  missing = sorted(set(weight_map) - set(tensors))
  if missing:
    raise CheckpointError(f"{index}: tensors {missing[:5]} are listed but not in their shards")
  return tensors


def checkpoint_tensors(directory: str) -> MappedTensors:
  """Every tensor of a checkpoint directory (single file or shards), memory-mapped."""
  index = os.path.join(directory, INDEX_FILE)
  if os.path.exists(index):
    return _sharded_tensors(directory, index)
  single = os.path.join(directory, SINGLE_FILE)
  if os.path.exists(single):
    return MappedTensors([single])
  raise CheckpointError(f"{directory}: no {SINGLE_FILE} or {INDEX_FILE} (not a safetensors "
                        "checkpoint directory)")


# ---------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig


def _rope_settings(hf: dict, source: str) -> dict[str, Any]:
  # transformers 5 writes `rope_parameters` (holding rope_theta); older files `rope_scaling`.
  params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  rope_type = params.get("rope_type", params.get("type", "default"))
  out: dict[str, Any] = {"rope_theta": float(theta)}
  if rope_type == "llama3":
    out.update(rope_scaling_factor=float(params["factor"]),
               rope_low_freq_factor=float(params["low_freq_factor"]),
               rope_high_freq_factor=float(params["high_freq_factor"]),
               rope_original_max_position=int(params["original_max_position_embeddings"]))
  elif rope_type != "default":
    raise CheckpointError(f"{source}: unsupported RoPE scaling type {rope_type!r} (supported: "
                          "'default', 'llama3')")
  return out


def config_from_hf(hf: dict, source: str = CONFIG_FILE) -> transformer.TransformerConfig:
  """Maps a Qwen2 or Llama `config.json` dict to a `TransformerConfig`.

  Raises:
    CheckpointError: on an unsupported architecture or setting, naming it.
  """
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise CheckpointError(f"{source}: unsupported architecture model_type={model_type!r} "
                          f"(architectures={hf.get('architectures')}); supported: "
                          f"{list(SUPPORTED_MODEL_TYPES)}")
  act = hf.get("hidden_act", "silu")
  if act != "silu":
    raise CheckpointError(f"{source}: unsupported hidden_act={act!r} (only 'silu' / SwiGLU)")
  if hf.get("mlp_bias"):
    raise CheckpointError(f"{source}: unsupported mlp_bias=True")
  if model_type == "qwen2" and hf.get("use_sliding_window"):
    raise CheckpointError(f"{source}: unsupported use_sliding_window=True")
  required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "intermediate_size")
  missing = [k for k in required if k not in hf]
  if missing:
    raise CheckpointError(f"{source}: missing keys {missing}")
  qkv_bias = True if model_type == "qwen2" else bool(hf.get("attention_bias", False))
  try:
    return transformer.TransformerConfig(
        vocab_size=hf["vocab_size"], num_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"), mlp_dim=hf["intermediate_size"], position="rope",
        qkv_bias=qkv_bias, tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), **_rope_settings(hf, source))
  except ValueError as e:
    raise CheckpointError(f"{source}: {e}") from None


def hf_config(config: transformer.TransformerConfig, model_type: str,
              torch_dtype: str = "float32") -> dict:
  """The `config.json` dict of `config` as a Qwen2 or Llama checkpoint."""
  c = config
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"hf_config: model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
  if c.position != "rope" or c.alibi or c.head != "lm" or c.num_experts:
    raise ValueError("hf_config: only rope-position LM-head dense models have an HF equivalent, got "
                     f"position={c.position!r} alibi={c.alibi} head={c.head!r} num_experts={c.num_experts}")
  if model_type == "qwen2" and not c.qkv_bias:
    raise ValueError("hf_config: Qwen2 always has q/k/v biases; this config has qkv_bias=False")
  rope: dict[str, Any] = {"rope_theta": c.rope_theta, "rope_type": "default"}
  if c.rope_scaling_factor is not None:
    rope.update(rope_type="llama3", factor=c.rope_scaling_factor,
                low_freq_factor=c.rope_low_freq_factor, high_freq_factor=c.rope_high_freq_factor,
                original_max_position_embeddings=c.rope_original_max_position)
  out = {
      "architectures": ["Qwen2ForCausalLM" if model_type == "qwen2" else "LlamaForCausalLM"],
      "model_type": model_type, "vocab_size": c.vocab_size, "hidden_size": c.d_model,
      "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.kv_heads, "head_dim": c.dim_per_head,
      "intermediate_size": c.hidden_dim, "hidden_act": "silu", "rms_norm_eps": c.norm_eps,
      "rope_theta": c.rope_theta, "rope_parameters": rope,
      "tie_word_embeddings": c.tie_embeddings, "torch_dtype": torch_dtype, "dtype": torch_dtype,
      "max_position_embeddings": 32768,
  }
  if c.rope_scaling_factor is not None:
    out["rope_scaling"] = dict(rope)
  if model_type == "llama":
    out.update(attention_bias=c.qkv_bias, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out


def load_config(directory: str) -> tuple[transformer.TransformerConfig, dict]:
  """(TransformerConfig, raw config.json dict) of a checkpoint directory."""
  if not os.path.isdir(directory):
    raise CheckpointError(f"HF checkpoint directory {directory!r} does not exist")
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.exists(path):
    raise CheckpointError(f"{directory}: no {CONFIG_FILE} (not a Hugging Face checkpoint directory)")
  with open(path) as f:
    try:
      raw = json.load(f)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: invalid JSON ({e})") from None
  return config_from_hf(raw, source=path), raw


_ARCHITECTURE = ("vocab_size", "num_layers", "d_model", "num_heads", "kv_heads", "dim_per_head",
                 "hidden_dim", "position", "qkv_bias", "tie_embeddings", "rope_theta",
                 "rope_scaling_factor", "norm_eps", "num_experts")


def architecture_diff(checkpoint: transformer.TransformerConfig,
                      expected: transformer.TransformerConfig) -> list[str]:
  """'name: checkpoint X vs configured Y' for every architecture setting that differs.

  Floats agree to float32 precision: a file stores 1e-5 as float32 (9.9999997e-06), a config
  writes it as 1e-5.
  """
  def same(a, b):
    if isinstance(a, float) and isinstance(b, float):
      return math.isclose(a, b, rel_tol=1e-6)
    return a == b
  return [f"{n}: checkpoint {getattr(checkpoint, n)!r} vs configured {getattr(expected, n)!r}"
          for n in _ARCHITECTURE if not same(getattr(checkpoint, n), getattr(expected, n))]


# ---------------------------------------------------------------------------------------------
# parameter name and layout mapping

Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One parameter: its path here, its HF tensor name, and the layout conversions.

  `hf_index` maps a block of our layout (one step-1 slice per dimension) to the HF block that
  holds it plus the index that cuts ours out of `to_ours(that HF block)`; `to_ours` works on any
  such block, not only the whole tensor.
  """

  path: str
  hf_name: str
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  hf_index: Callable[[Index], tuple[Index, Index]]


def _identity(x):
  return x


def _transpose(x):
  return x.T


def _same_block(index: Index) -> tuple[Index, Index]:
  return index, ()


def _transposed_block(index: Index) -> tuple[Index, Index]:
  return index[::-1], ()


def _head_rows(heads: slice, dh: int) -> slice:
  # The HF axis holding heads*dh: a run of whole heads is one contiguous run of rows. A block
  # that splits dh reads its heads whole and is cut down after (no rule shards dh today).
  return slice(heads.start * dh, heads.stop * dh)


def _mlp_entries(ours: str, hf: str) -> list[_Entry]:
  return [_Entry(f"{ours}.mlp.w_{n}", f"{hf}.mlp.{n}_proj.weight", _transpose, _transpose,
                 _transposed_block) for n in ("gate", "up", "down")]


def _attention_entries(config: transformer.TransformerConfig, ours: str, hf: str) -> list[_Entry]:
  c = config
  d, h, kv, dh = c.d_model, c.num_heads, c.kv_heads, c.dim_per_head
  every = slice(None)

  def proj(name, heads):  # HF [heads*dh, D] <-> ours [D, heads, dh]
    return _Entry(f"{ours}.attn.w{name}", f"{hf}.self_attn.{name}_proj.weight",
                  lambda w: w.T.reshape(w.shape[1], -1, dh),
                  lambda w: w.reshape(d, heads * dh).T,
                  lambda i: ((_head_rows(i[1], dh), i[0]), (every, every, i[2])))

  def bias(name, heads):  # HF [heads*dh] <-> ours [heads, dh]
    return _Entry(f"{ours}.attn.b{name}", f"{hf}.self_attn.{name}_proj.bias",
                  lambda b: b.reshape(-1, dh), lambda b: b.reshape(heads * dh),
                  lambda i: ((_head_rows(i[0], dh),), (every, i[1])))

  out = [proj("q", h), proj("k", kv), proj("v", kv),
         _Entry(f"{ours}.attn.wo", f"{hf}.self_attn.o_proj.weight",  # HF [D, H*dh], ours [H, dh, D]
                lambda w: w.T.reshape(-1, dh, w.shape[0]), lambda w: w.reshape(h * dh, d).T,
                lambda i: ((i[2], _head_rows(i[0], dh)), (every, i[1], every)))]
  if c.qkv_bias:
    out += [bias("q", h), bias("k", kv), bias("v", kv)]
  return out


def _entries(config: transformer.TransformerConfig) -> list[_Entry]:
  def plain(path, name):
    return _Entry(path, name, _identity, _identity, _same_block)

  out = [plain("embed", "model.embed_tokens.weight"),
         plain("final_norm.scale", "model.norm.weight")]
  if not config.tie_embeddings:
    out.append(_Entry("lm_head", "lm_head.weight", _transpose, _transpose, _transposed_block))
  for i in range(config.num_layers):
    ours, hf = f"blocks.{i}", f"model.layers.{i}"
    out += [plain(f"{ours}.attn_norm.scale", f"{hf}.input_layernorm.weight"),
            plain(f"{ours}.mlp_norm.scale", f"{hf}.post_attention_layernorm.weight")]
    out += _attention_entries(config, ours, hf) + _mlp_entries(ours, hf)
  return out


def path_name(path) -> str:
  """'blocks.0.attn.wq' for a pytree key path into an nnx.State (the `.value` key dropped)."""
  parts = []
  for key in path:
    name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
    if name == "value" and isinstance(key, jax.tree_util.GetAttrKey):
      continue
    parts.append(str(name))
  return ".".join(parts)


def _is_param(x) -> bool:
  return isinstance(x, nnx.Variable)


def abstract_params(config: transformer.TransformerConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params of ShapeDtypeStructs with their logical-axes metadata); allocates nothing."""
  model = nnx.eval_shape(lambda: transformer.Transformer(config, nnx.Rngs(params=0)))
  return nnx.split(model, nnx.Param)


# ---------------------------------------------------------------------------------------------
# load / export


def _check_names(directory: str, config: transformer.TransformerConfig,
                 tensors: MappedTensors, entries: dict[str, _Entry]) -> None:
  known = {e.hf_name for e in entries.values()}
  unexpected = sorted(n for n in tensors if n not in known and not n.endswith("rotary_emb.inv_freq")
                      and not (config.tie_embeddings and n == "lm_head.weight"))
  if unexpected:
    raise CheckpointError(f"{directory}: tensors {unexpected[:5]} (of {len(unexpected)}) do not "
                          f"belong to a {config.num_layers}-layer model as config.json describes")
  missing = [e.hf_name for e in entries.values() if e.hf_name not in tensors]
  if missing:
    raise CheckpointError(f"{directory}: tensors {missing[:5]} (of {len(missing)} missing) are "
                          "absent, but config.json describes a model that needs them")


def _check_layout(directory: str, tensors: MappedTensors, entry: _Entry, shape) -> None:
  """Every stored shape and dtype is checked before any tensor data is read."""
  name = entry.hf_name
  want = jax.eval_shape(entry.to_hf, jax.ShapeDtypeStruct(tuple(shape), np.float32)).shape
  if tensors.shape(name) != tuple(want):
    raise CheckpointError(f"{directory}: tensor {name!r} has shape {tensors.shape(name)}, but "
                          f"config.json implies {tuple(want)}")
  if tensors.dtype(name) not in _FLOAT_DTYPES:
    raise CheckpointError(f"{tensors.path(name)}: tensor {name!r} has dtype {tensors.dtype(name)}, "
                          f"but model weights are floating point ({', '.join(_FLOAT_DTYPES)})")


def _read_block(tensors: MappedTensors, entry: _Entry, shape, dtype, index: Index) -> np.ndarray:
  # jax leaves undivided dimensions as slice(None); the head arithmetic needs their bounds.
  index = tuple(slice(*s.indices(n)) for s, n in zip(index, shape))
  hf_index, within = entry.hf_index(index)
  block = entry.to_ours(tensors.read(entry.hf_name, hf_index))
  return np.asarray(block[within], dtype=dtype)


def load(directory: str, *, shardings: Any = None, dtype=np.float32,
         expect: transformer.TransformerConfig | None = None
         ) -> tuple[transformer.TransformerConfig, nnx.GraphDef, nnx.State]:
  """Loads a Qwen2 or Llama safetensors checkpoint directory.

  Args:
    directory: holds config.json and model.safetensors (or an index and shards).
    shardings: None (default device), or a function (abstract params) -> a params-shaped tree of
      `jax.sharding.Sharding` (e.g. `functools.partial(parallel.rules.param_shardings, mesh=...,
      rules=...)`); each device then reads only its own shard of every tensor.
    dtype: parameter dtype on device.
    expect: when given, the checkpoint's architecture must equal it (fields compared one by one).
  Returns:
    (config, graphdef, params).
  Raises:
    CheckpointError: naming the missing directory/file, the unsupported architecture, the
      truncated or corrupt file, or the tensor whose name, shape or dtype disagrees with
      config.json; all before any tensor data is read.
  """
  config, _ = load_config(directory)
  if expect is not None:
    diffs = architecture_diff(config, expect)
    if diffs:
      raise CheckpointError(f"{directory}: config.json differs from the configured model: "
                            + "; ".join(diffs))
  tensors = checkpoint_tensors(directory)
  graphdef, abstract = abstract_params(config)
  entries = {e.path: e for e in _entries(config)}
  _check_names(directory, config, tensors, entries)
  for path, var in jax.tree_util.tree_leaves_with_path(abstract, is_leaf=_is_param):
    _check_layout(directory, tensors, entries[path_name(path)], var.shape)
  target = shardings(abstract) if shardings is not None else None

  def build(path, var, sharding=None):
    entry = entries[path_name(path)]
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    read = functools.partial(_read_block, tensors, entry, var.shape, dtype)
    return var.replace(value=jax.make_array_from_callback(var.shape, sharding, read))

  if target is None:
    params = jax.tree_util.tree_map_with_path(build, abstract, is_leaf=_is_param)
  else:
    params = jax.tree_util.tree_map_with_path(
        lambda p, v, s: build(p, v, s.value if isinstance(s, nnx.Variable) else s),
        abstract, target, is_leaf=_is_param)
  return config, graphdef, params


def export(directory: str, config: transformer.TransformerConfig, params: nnx.State, *,
           model_type: str, dtype: str = "float32", max_shard_bytes: int | None = None) -> None:
  """Writes `params` as a Hugging Face checkpoint directory (config.json + safetensors).

  Args:
    directory: created if needed.
    config: the architecture of `params`.
    params: the parameter state (as from `transformer.create` or `load`).
    model_type: 'qwen2' or 'llama'.
    dtype: stored dtype, 'float32', 'bfloat16' or 'float16'.
    max_shard_bytes: split into shards with an index file above this size (None: one file).
  """
  if dtype not in _TORCH_DTYPES:
    raise ValueError(f"export: dtype must be one of {sorted(_TORCH_DTYPES)}, got {dtype!r}")
  os.makedirs(directory, exist_ok=True)
  _write_shards(directory, _hf_tensors(config, params, _DTYPES[_TORCH_DTYPES[dtype]]),
                max_shard_bytes)
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf_config(config, model_type, dtype), f, indent=2)


def _hf_tensors(config: transformer.TransformerConfig, params: nnx.State,
                dtype: np.dtype) -> dict[str, np.ndarray]:
  flat = {path_name(p): v for p, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_param)}
  tensors = {}
  for entry in _entries(config):
    if entry.path not in flat:
      raise ValueError(f"export: params have no {entry.path!r} (do they match the config?)")
    host = np.asarray(jax.device_get(flat[entry.path][...]))
    tensors[entry.hf_name] = np.array(entry.to_hf(host), dtype=dtype, order="C")
  return tensors


def _write_shards(directory: str, tensors: dict[str, np.ndarray],
                  max_shard_bytes: int | None) -> None:
  shards = _split_shards(tensors, max_shard_bytes)
  if len(shards) == 1:
    write_safetensors(os.path.join(directory, SINGLE_FILE), shards[0])
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    write_safetensors(os.path.join(directory, name), shard)
    weight_map.update({k: name for k in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _split_shards(tensors: dict[str, np.ndarray], max_bytes: int | None) -> list[dict]:
  if max_bytes is None:
    return [tensors]
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    if current and size + tensors[name].nbytes > max_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += tensors[name].nbytes
  shards.append(current)
  return shards
