"""LoRA adapters for the policy: W' = W + (alpha / rank) · A·B on chosen weights, base frozen.

Adapters are a separate pytree, `{param path: {"a": [in..., r], "b": [r, out...]}}`; `b` starts at
zero, so the adapted model starts equal to the base. Training keeps the base and the adapters in
one tree, `{"base": params, "lora": adapters}`: `merged(tree)` is what the forward pass reads (the
base behind `stop_gradient`), and `optimizer(tx)` updates the adapters only (the base gets no
optimizer state). Export either merges into the base (`export_merged`, a plain HF checkpoint) or
writes the adapters alone (`save_adapters`), named and shaped like PEFT adapter files:
`…<module>.lora_A.weight` [r, in] and `…lora_B.weight` [out, r] plus adapter_config.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from agentrl_jax import config_errors
from agentrl_jax.models import hf
from agentrl_jax.models import transformer

# Target name -> (number of leading input dims, HF module name). wq/wk/wv are [D, H, Dh] (1 input
# dim), wo is [H, Dh, D] (2 input dims), the MLP weights and lm_head are [in, out].
TARGETS = {
    "wq": (1, "self_attn.q_proj"), "wk": (1, "self_attn.k_proj"), "wv": (1, "self_attn.v_proj"),
    "wo": (2, "self_attn.o_proj"), "w_gate": (1, "mlp.gate_proj"), "w_up": (1, "mlp.up_proj"),
    "w_down": (1, "mlp.down_proj"),
}
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoRAConfig:
  """Adapter rank, scale numerator and the weights it adapts (names in `TARGETS`)."""

  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("wq", "wk", "wv", "wo")

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.rank < 1:
      raise ValueError(f"LoRAConfig.rank must be >= 1, got {self.rank}")
    if self.alpha <= 0:
      raise ValueError(f"LoRAConfig.alpha must be > 0, got {self.alpha}")
    unknown = sorted(set(self.targets) - set(TARGETS))
    if unknown or not self.targets:
      raise ValueError(f"LoRAConfig.targets: unknown {unknown or 'empty'}; choose from {sorted(TARGETS)}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _targets(params, config: LoRAConfig) -> dict[str, jax.Array]:
  out = {}
  for path, var in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable):
    name = hf.path_name(path)
    if name.split(".")[-1] in config.targets:
      if name.split(".")[-1] in ("w_gate", "w_up", "w_down") and len(var.shape) != 2:
        raise ValueError(f"LoRA on MoE expert weights is not supported ({name} {tuple(var.shape)})")
      out[name] = var
  if not out:
    raise ValueError(f"LoRA targets {config.targets} match no parameter")
  return out


def init_adapters(params: nnx.State, config: LoRAConfig, seed: int) -> dict[str, dict[str, jax.Array]]:
  """Adapters for every targeted weight: a ~ N(0, 1/fan_in), b = 0 (so the start is the base)."""
  key = jax.random.key(seed)
  adapters = {}
  for i, (name, var) in enumerate(sorted(_targets(params, config).items())):
    n_in = TARGETS[name.split(".")[-1]][0]
    shape = tuple(var.shape)
    fan_in = math.prod(shape[:n_in])
    a = jax.random.normal(jax.random.fold_in(key, i), shape[:n_in] + (config.rank,), jnp.float32)
    adapters[name] = {"a": a / math.sqrt(fan_in),
                      "b": jnp.zeros((config.rank,) + shape[n_in:], jnp.float32)}
  return adapters


def delta(adapter: dict[str, jax.Array], scale: float) -> jax.Array:
  """scale · A·B, contracted over the rank, in the weight's own shape."""
  return scale * jnp.tensordot(adapter["a"], adapter["b"], axes=1)


def merge(base: nnx.State, adapters: dict, config: LoRAConfig) -> nnx.State:
  """Base parameters with every adapter's delta added (pure; differentiable in the adapters)."""

  def add(path, var):
    name = hf.path_name(path)
    if name not in adapters:
      return var
    return var.replace(value=var[...] + delta(adapters[name], config.scale).astype(var.dtype))

  return jax.tree_util.tree_map_with_path(add, base, is_leaf=_is_variable)


def trainable(base: nnx.State, adapters: dict) -> dict[str, Any]:
  """The tree the learner holds as policy params: {"base": frozen, "lora": trained}."""
  return {"base": base, "lora": adapters}


def merged(tree: dict[str, Any], config: LoRAConfig) -> nnx.State:
  """What the forward pass reads: the base (no gradient) plus the adapters' deltas."""
  return merge(jax.lax.stop_gradient(tree["base"]), tree["lora"], config)


def optimizer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the adapters; the base gets zero updates and no optimizer state."""
  return optax.multi_transform({"lora": tx, "base": optax.set_to_zero()},
                               lambda tree: {"base": jax.tree.map(lambda _: "base", tree["base"]),
                                             "lora": jax.tree.map(lambda _: "lora", tree["lora"])})


# Odd position weights are invertible mod 2**32: changing any one word changes a leaf's sum.
def _word_sum(x: jax.Array) -> jax.Array:
  unsigned = {4: jnp.uint32, 2: jnp.uint16, 1: jnp.uint8}[x.dtype.itemsize]
  words = jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)
  weights = jnp.arange(words.size, dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(words * weights, dtype=jnp.uint32)


def fingerprint(params: nnx.State) -> str:
  """A hex digest of a base's every weight: names, shapes, dtypes and bits.

  The sums run on the devices that hold the (possibly sharded) weights, so only one word per
  weight comes to the host. What a LoRA checkpoint keeps of its base instead of the base itself.
  """
  leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_variable)
  arrays = [var[...] if _is_variable(var) else var for _, var in leaves]
  sums = jax.device_get(jax.jit(lambda xs: [_word_sum(x) for x in xs])(arrays))
  digest = hashlib.sha256()
  for (path, _), x, total in zip(leaves, arrays, sums):
    digest.update(f"{hf.path_name(path)}:{tuple(x.shape)}:{x.dtype}:{int(total)};".encode())
  return digest.hexdigest()[:32]


def export_merged(directory: str, model: transformer.TransformerConfig, tree: dict,
                  config: LoRAConfig, *, model_type: str, dtype: str = "float32") -> None:
  """Writes base + adapters merged as a plain HF checkpoint directory."""
  hf.export(directory, model, merge(tree["base"], tree["lora"], config), model_type=model_type,
            dtype=dtype)


def _hf_module(name: str) -> str:
  parts = name.split(".")  # blocks.<i>.<attn|mlp>.<target>
  return f"base_model.model.model.layers.{parts[1]}.{TARGETS[parts[-1]][1]}"


def save_adapters(directory: str, adapters: dict, config: LoRAConfig,
                  model: transformer.TransformerConfig) -> None:
  """Writes the adapters alone (safetensors + adapter_config.json), as 2-D [r, in] / [out, r]."""
  os.makedirs(directory, exist_ok=True)
  tensors = {}
  for name, ad in adapters.items():
    a, b = np.asarray(jax.device_get(ad["a"])), np.asarray(jax.device_get(ad["b"]))
    module = _hf_module(name)
    # Our weights are stored [in, out] (wq: [D, H, Dh]); HF linear weights are [out, in].
    tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, config.rank).T)
    tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(b.reshape(config.rank, -1).T)
  hf.write_safetensors(os.path.join(directory, ADAPTER_FILE), tensors)
  modules = sorted({TARGETS[n.split(".")[-1]][1].split(".")[-1] for n in adapters})
  with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
    json.dump({"peft_type": "LORA", "r": config.rank, "lora_alpha": config.alpha,
               "target_modules": modules, "bias": "none", "task_type": "CAUSAL_LM",
               "agentrl_targets": list(config.targets)}, f, indent=2)


def load_adapters(directory: str, params: nnx.State) -> tuple[dict, LoRAConfig]:
  """Reads adapters written by `save_adapters` back into the shapes of `params`' weights."""
  path = os.path.join(directory, ADAPTER_CONFIG)
  if not os.path.exists(path):
    raise hf.CheckpointError(f"{directory}: no {ADAPTER_CONFIG} (not an adapter directory)")
  with open(path) as f:
    meta = json.load(f)
  config = LoRAConfig(rank=int(meta["r"]), alpha=float(meta["lora_alpha"]),
                      targets=tuple(meta["agentrl_targets"]))
  tensors = hf.open_safetensors(os.path.join(directory, ADAPTER_FILE))
  adapters = {}
  for name, var in sorted(_targets(params, config).items()):
    n_in = TARGETS[name.split(".")[-1]][0]
    shape = tuple(var.shape)
    module = _hf_module(name)
    try:
      a, b = tensors[f"{module}.lora_A.weight"], tensors[f"{module}.lora_B.weight"]
    except KeyError:
      raise hf.CheckpointError(f"{directory}: adapter for {module} is missing") from None
    adapters[name] = {"a": jnp.asarray(np.asarray(a).T.reshape(shape[:n_in] + (config.rank,))),
                      "b": jnp.asarray(np.asarray(b).T.reshape((config.rank,) + shape[n_in:]))}
  return adapters, config
