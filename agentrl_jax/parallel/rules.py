"""Logical axis rules: parameter and batch shardings on the mesh, the sharding table and its check.

Parameters carry `logical_axes` metadata (models/transformer.py). `logical_rules(layout)` maps
each logical name to mesh axes, one function for both layouts:

  * 'train': parameters split over fsdp (embed dimension) and tensor (heads, mlp, vocab); the
    batch over data × fsdp.
  * 'sample': parameters split over tensor only, so decoding a token never gathers fsdp shards;
    the batch over data × fsdp.

A dimension whose size the mesh axes do not divide stays replicated (the table shows it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib

Rules = Mapping[str, tuple[str, ...]]
P = jax.sharding.PartitionSpec
NamedSharding = jax.sharding.NamedSharding

LAYOUTS = ("train", "sample")


def logical_rules(layout: str = "train") -> Rules:
  """Logical axis name -> mesh axes (a tuple; empty = replicated) for a layout."""
  if layout not in LAYOUTS:
    raise ValueError(f"logical_rules: layout must be one of {LAYOUTS}, got {layout!r}")
  data_fsdp = (mesh_lib.DATA, mesh_lib.FSDP)
  tensor = (mesh_lib.TENSOR,)
  return {
      transformer.BATCH: data_fsdp,
      transformer.SEQ: (),
      transformer.TURN: (),
      transformer.EMBED: (mesh_lib.FSDP,) if layout == "train" else (),
      transformer.MLP: tensor,
      transformer.HEADS: tensor,
      transformer.KV: (),
      transformer.VOCAB: tensor,
      transformer.EXPERT: (),
  }


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def spec_for(shape: tuple[int, ...], logical_axes: tuple[str | None, ...] | None,
             mesh: jax.sharding.Mesh, rules: Rules) -> P:
  """The PartitionSpec of one array; a dimension the mesh axes do not divide is replicated."""
  if not logical_axes:
    return P()
  if len(logical_axes) != len(shape):
    raise ValueError(f"logical axes {logical_axes} do not match the shape {shape}")
  used: set[str] = set()
  parts = []
  for size, name in zip(shape, logical_axes):
    if name is not None and name not in rules:
      raise ValueError(f"no sharding rule for logical axis {name!r}; rules name {sorted(rules)}")
    axes = tuple(a for a in (rules[name] if name else ()) if mesh.shape[a] > 1 and a not in used)
    if axes and size % math.prod(mesh.shape[a] for a in axes) == 0:
      used.update(axes)
      parts.append(axes[0] if len(axes) == 1 else axes)
    else:
      parts.append(None)
  return P(*parts)


def _sharding_of(leaf, mesh, rules):
  if _is_variable(leaf):
    axes = leaf.get_metadata().get("logical_axes")
    return leaf.replace(value=NamedSharding(mesh, spec_for(tuple(leaf.shape), axes, mesh, rules)))
  return NamedSharding(mesh, P())


def param_shardings(params: Any, mesh: jax.sharding.Mesh, rules: Rules | None = None) -> Any:
  """A tree like `params` (nnx.State, optimizer state, …) with a NamedSharding per array.

  Arrays inside an `nnx.Variable` with `logical_axes` follow the rules; any other array (an
  optimizer step count, the rng) is replicated.
  """
  rules = logical_rules("train") if rules is None else rules
  return jax.tree.map(lambda leaf: _sharding_of(leaf, mesh, rules), params, is_leaf=_is_variable)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """The sharding of every batch-major array (Trajectories fields): rows over data × fsdp."""
  return NamedSharding(mesh, P(mesh_lib.batch_axes(mesh)))


def shard_batch(batch: Any, mesh: jax.sharding.Mesh) -> Any:
  """Places a batch-major pytree on the mesh; the batch size must divide by data × fsdp."""
  rows = mesh.shape[mesh_lib.DATA] * mesh.shape[mesh_lib.FSDP]
  for leaf in jax.tree.leaves(batch):
    if np.ndim(leaf) and np.shape(leaf)[0] % rows:
      raise ValueError(f"batch of {np.shape(leaf)[0]} rows does not split over data x fsdp = {rows}")
  return jax.device_put(batch, batch_sharding(mesh))


def state_shardings(state: Any, mesh: jax.sharding.Mesh, rules: Rules | None = None) -> Any:
  """Shardings of a whole `ActorCriticState` (or any tree mixing Variables and plain arrays)."""
  return param_shardings(state, mesh, rules)


def shard_state(state: Any, mesh: jax.sharding.Mesh, rules: Rules | None = None) -> Any:
  """Moves an existing state onto the mesh (prefer `create_sharded` for large models)."""
  return jax.device_put(state, state_shardings(state, mesh, rules))


def create_sharded(init: Callable[..., Any], mesh: jax.sharding.Mesh, rules: Rules | None = None,
                   *args) -> Any:
  """Runs `init(*args)` under jit with the rules' output shardings: the state is born sharded.

  No device ever holds the whole state (what lets a 7B policy and its optimizer state start on
  a slice whose chips each hold a fraction). Arrays in `args` (loaded weights) are inputs, not
  constants baked into the program.
  """
  shapes = jax.eval_shape(init, *args)
  return jax.jit(init, out_shardings=state_shardings(shapes, mesh, rules))(*args)


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...], rules: Rules | None = None) -> jax.Array:
  """Activation sharding constraint by logical names; raises when no mesh is set.

  Silently doing nothing without a mesh would let a test on one device pass while never checking
  the sharding, so the caller must set one (`jax.set_mesh`).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    raise RuntimeError("parallel.rules.constrain needs a mesh: call it under jax.set_mesh(mesh)")
  rules = logical_rules("train") if rules is None else rules
  return jax.lax.with_sharding_constraint(x, spec_for(x.shape, logical_axes, mesh, rules))


# ---------------------------------------------------------------------------------------------
# the start-up table and the replicated-bytes check


@dataclasses.dataclass(frozen=True)
class ShardingRow:
  name: str
  shape: tuple[int, ...]
  spec: P
  bytes: int
  shards: int  # how many distinct pieces the array is cut into

  @property
  def bytes_per_device(self) -> int:
    return self.bytes // self.shards


def _name(path) -> str:
  parts = []
  for key in path:
    name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
    if not (isinstance(key, jax.tree_util.GetAttrKey) and name == "value"):
      parts.append(str(name))
  return ".".join(parts)


def sharding_rows(params: Any, shardings: Any) -> list[ShardingRow]:
  """One row per array: name, shape, PartitionSpec, bytes and number of shards."""
  rows = []
  flat_s = dict(jax.tree_util.tree_leaves_with_path(shardings))
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    sharding = flat_s[path]
    spec = sharding.spec
    mesh = sharding.mesh
    shards = 1
    for part in spec:
      for axis in (part if isinstance(part, tuple) else (part,)):
        if axis is not None:
          shards *= mesh.shape[axis]
    nbytes = int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
    rows.append(ShardingRow(_name(path), tuple(leaf.shape), spec, nbytes, shards))
  return rows


def sharding_table(params: Any, shardings: Any) -> str:
  """A readable table (one line per array) ending with a one-line summary."""
  rows = sharding_rows(params, shardings)
  width = max((len(r.name) for r in rows), default=4)
  lines = [f"{'param':<{width}}  {'shape':<22} {'spec':<36} {'MiB/device':>10}"]
  for r in rows:
    lines.append(f"{r.name:<{width}}  {str(r.shape):<22} {str(tuple(r.spec)):<36} "
                 f"{r.bytes_per_device / 2**20:>10.3f}")
  lines.append(summary_line(rows))
  return "\n".join(lines)


def summary_line(rows: list[ShardingRow]) -> str:
  total = sum(r.bytes for r in rows)
  per_device = sum(r.bytes_per_device for r in rows)
  replicated = sum(r.bytes for r in rows if r.shards == 1)
  return (f"params: {len(rows)} arrays, {total / 2**20:.2f} MiB total, {per_device / 2**20:.2f} "
          f"MiB per device, {replicated / max(total, 1):.1%} of bytes fully replicated")


def check_sufficiently_sharded(params: Any, shardings: Any, mesh: jax.sharding.Mesh,
                               tolerance: float = 0.25) -> None:
  """Fails when a device holds more than (1 + tolerance) × its ideal share of parameter bytes.

  The ideal share is total / (fsdp × tensor): data-parallel replicas hold a full copy by design.

  Raises:
    ValueError: naming the per-device bytes, the ideal, and the largest unsharded arrays.
  """
  rows = sharding_rows(params, shardings)
  total = sum(r.bytes for r in rows)
  ideal = total / mesh_lib.model_parallel_size(mesh)
  per_device = sum(r.bytes_per_device for r in rows)
  if per_device > ideal * (1 + tolerance):
    worst = sorted((r for r in rows if r.shards == 1), key=lambda r: -r.bytes)[:5]
    raise ValueError(
        f"parameters are not sufficiently sharded: {per_device / 2**20:.2f} MiB per device vs the "
        f"ideal {ideal / 2**20:.2f} MiB (total / fsdp*tensor = {mesh_lib.model_parallel_size(mesh)}) "
        f"+{tolerance:.0%}; largest replicated: "
        + ", ".join(f"{r.name} {r.shape}" for r in worst))
