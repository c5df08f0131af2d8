"""Hugging Face checkpoints (Qwen2/Qwen2.5, Llama 3): load a safetensors directory, export back.

A checkpoint directory holds `config.json` and either `model.safetensors` or shards listed in
`model.safetensors.index.json`. Loading maps `config.json` to a `TransformerConfig`, checks every
tensor's name and shape against it, and builds each parameter with
`jax.make_array_from_callback` from a memory-mapped view of the file: each device reads only its
own shard of each tensor, so a large model never exists as one host copy. The safetensors format
is read and written here directly (a JSON header and raw little-endian bytes), so neither torch
nor the `safetensors` package is needed at run time.

Layout differences handled here (HF -> ours):
  * linear weights are stored [out, in] by HF, [in, out] here;
  * attention projections are split into heads: q [D, H, Dh], k/v [D, KV, Dh], o [H, Dh, D];
  * the LM head of untied models is [D, V].
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from agentrl_jax.models import transformer

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}
_TORCH_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


class CheckpointError(ValueError):
  """A checkpoint directory that cannot be loaded; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------
# safetensors files


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
  """The header of a .safetensors file and the byte offset where tensor data starts."""
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
    (size,) = struct.unpack("<Q", raw)
    if size > os.path.getsize(path) - 8:
      raise CheckpointError(f"{path}: not a safetensors file (header size {size} exceeds the file)")
    try:
      header = json.loads(f.read(size))
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from None
  header.pop("__metadata__", None)
  return header, 8 + size


def open_safetensors(path: str) -> dict[str, np.ndarray]:
  """Memory-mapped, read-only views of every tensor in a .safetensors file (no data is read)."""
  header, start = read_safetensors_header(path)
  file_size = os.path.getsize(path)
  out = {}
  for name, info in header.items():
    if info["dtype"] not in _DTYPES:
      raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    dtype = _DTYPES[info["dtype"]]
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end - begin != int(np.prod(shape)) * dtype.itemsize or start + end > file_size:
      raise CheckpointError(f"{path}: tensor {name!r} data range {begin}..{end} does not match "
                            f"its shape {shape} and dtype {info['dtype']} (truncated file?)")
    out[name] = np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)
  return out


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
  """Writes tensors (in name order) as one .safetensors file, atomically."""
  header, offset, ordered = {}, 0, []
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    if array.dtype not in _DTYPE_NAMES:
      raise ValueError(f"write_safetensors: tensor {name!r} has unsupported dtype {array.dtype}")
    header[name] = {"dtype": _DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
    ordered.append(array)
  header["__metadata__"] = {"format": "pt"}
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)  # The data section starts 8-byte aligned.
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for array in ordered:
      f.write(array.tobytes())
  os.replace(tmp, path)


def checkpoint_tensors(directory: str) -> dict[str, np.ndarray]:
  """Memory-mapped views of every tensor of a checkpoint directory (single file or shards)."""
  index = os.path.join(directory, INDEX_FILE)
  single = os.path.join(directory, SINGLE_FILE)
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index}: no 'weight_map'")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
      shard_path = os.path.join(directory, shard)
      if not os.path.exists(shard_path):
        raise CheckpointError(f"{index} lists shard {shard!r}, which is missing from {directory}")
      tensors.update(open_safetensors(shard_path))
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
      raise CheckpointError(f"{index}: tensors {missing[:5]} are listed but not in their shards")
    return tensors
  if os.path.exists(single):
    return open_safetensors(single)
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
  """'name: checkpoint X vs configured Y' for every architecture setting that differs."""
  return [f"{n}: checkpoint {getattr(checkpoint, n)!r} vs configured {getattr(expected, n)!r}"
          for n in _ARCHITECTURE if getattr(checkpoint, n) != getattr(expected, n)]


# ---------------------------------------------------------------------------------------------
# parameter name and layout mapping


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One parameter: its path here, its HF tensor name, and the two layout conversions."""

  path: str
  hf_name: str
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _identity(x):
  return x


def _transpose(x):
  return x.T


def _entries(config: transformer.TransformerConfig) -> list[_Entry]:
  c = config
  d, h, kv, dh = c.d_model, c.num_heads, c.kv_heads, c.dim_per_head

  def proj(heads):  # HF [heads*dh, D] <-> ours [D, heads, dh]; views, no copy on the way in.
    return (lambda w: w.T.reshape(d, heads, dh), lambda w: w.reshape(d, heads * dh).T)

  def bias(heads):
    return (lambda b: b.reshape(heads, dh), lambda b: b.reshape(heads * dh))

  out = [_Entry("embed", "model.embed_tokens.weight", _identity, _identity),
         _Entry("final_norm.scale", "model.norm.weight", _identity, _identity)]
  if not c.tie_embeddings:
    out.append(_Entry("lm_head", "lm_head.weight", _transpose, _transpose))
  for i in range(c.num_layers):
    ours, hf = f"blocks.{i}", f"model.layers.{i}"
    out += [
        _Entry(f"{ours}.attn_norm.scale", f"{hf}.input_layernorm.weight", _identity, _identity),
        _Entry(f"{ours}.mlp_norm.scale", f"{hf}.post_attention_layernorm.weight", _identity, _identity),
        _Entry(f"{ours}.attn.wq", f"{hf}.self_attn.q_proj.weight", *proj(h)),
        _Entry(f"{ours}.attn.wk", f"{hf}.self_attn.k_proj.weight", *proj(kv)),
        _Entry(f"{ours}.attn.wv", f"{hf}.self_attn.v_proj.weight", *proj(kv)),
        _Entry(f"{ours}.attn.wo", f"{hf}.self_attn.o_proj.weight",
               lambda w: w.T.reshape(h, dh, d), lambda w: w.reshape(h * dh, d).T),
        _Entry(f"{ours}.mlp.w_gate", f"{hf}.mlp.gate_proj.weight", _transpose, _transpose),
        _Entry(f"{ours}.mlp.w_up", f"{hf}.mlp.up_proj.weight", _transpose, _transpose),
        _Entry(f"{ours}.mlp.w_down", f"{hf}.mlp.down_proj.weight", _transpose, _transpose),
    ]
    if c.qkv_bias:
      out += [_Entry(f"{ours}.attn.bq", f"{hf}.self_attn.q_proj.bias", *bias(h)),
              _Entry(f"{ours}.attn.bk", f"{hf}.self_attn.k_proj.bias", *bias(kv)),
              _Entry(f"{ours}.attn.bv", f"{hf}.self_attn.v_proj.bias", *bias(kv))]
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
    CheckpointError: naming the missing directory/file, the unsupported architecture, or the
      tensor whose name or shape disagrees with config.json.
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
  target = shardings(abstract) if shardings is not None else None

  def build(path, var, sharding=None):
    name = path_name(path)
    entry = entries[name]
    stored = tensors[entry.hf_name]
    view = entry.to_ours(stored) if stored.ndim else stored
    if view.shape != var.shape:
      raise CheckpointError(
          f"{directory}: tensor {entry.hf_name!r} has shape {tuple(stored.shape)}, but config.json "
          f"implies {tuple(entry.to_hf(np.empty(var.shape, np.uint8)).shape)}")
    if sharding is None:
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return var.replace(value=jax.make_array_from_callback(
        var.shape, sharding, lambda index: np.asarray(view[index], dtype=dtype)))

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
  np_dtype = _DTYPES[_TORCH_DTYPES[dtype]]
  os.makedirs(directory, exist_ok=True)
  flat = {path_name(p): v for p, v in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_param)}
  tensors = {}
  for entry in _entries(config):
    if entry.path not in flat:
      raise ValueError(f"export: params have no {entry.path!r} (do they match the config?)")
    host = np.asarray(jax.device_get(flat[entry.path][...]))
    tensors[entry.hf_name] = np.ascontiguousarray(entry.to_hf(host)).astype(np_dtype)
  shards = _split_shards(tensors, max_shard_bytes)
  if len(shards) == 1:
    write_safetensors(os.path.join(directory, SINGLE_FILE), shards[0])
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      write_safetensors(os.path.join(directory, name), shard)
      weight_map.update({k: name for k in shard})
    total = sum(t.nbytes for t in tensors.values())
    with open(os.path.join(directory, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf_config(config, model_type, dtype), f, indent=2)


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
