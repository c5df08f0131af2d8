"""Several processes (TPU pod hosts, multi-GPU nodes, or CPU processes on loopback) as one mesh.

Each process runs its share of the environments, turns its trajectories into its rows of one
global batch (`global_batch`), and joins the same jitted, sharded update. Only process 0 writes
files (`is_writer`, `on_writer`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence, TypeVar

import jax
import numpy as np

from agentrl_jax.parallel import rules as rules_lib

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MultihostConfig:
  """How to join the cluster.

  Attributes:
    enabled: call `jax.distributed.initialize` at start-up.
    coordinator_address: 'host:port' of process 0; None lets JAX detect it (TPU VMs, SLURM).
    num_processes, process_id: required together with coordinator_address outside a managed
      cluster (e.g. CPU processes on loopback).
    local_device_ids: restrict this process to these local devices (None: all).
  """

  enabled: bool = False
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    explicit = (self.num_processes, self.process_id)
    if self.coordinator_address is not None and None in explicit:
      raise ValueError("MultihostConfig: coordinator_address needs num_processes and process_id, got "
                       f"num_processes={self.num_processes}, process_id={self.process_id}")
    if self.num_processes is not None and self.num_processes < 1:
      raise ValueError(f"MultihostConfig.num_processes must be >= 1, got {self.num_processes}")
    if self.process_id is not None and not 0 <= self.process_id < (self.num_processes or 1):
      raise ValueError(f"MultihostConfig.process_id must be in [0, num_processes), got "
                       f"{self.process_id} of {self.num_processes}")


def initialize(config: MultihostConfig) -> None:
  """Joins the cluster when enabled; a single process (the default) needs nothing."""
  if not config.enabled:
    return
  kwargs: dict[str, Any] = {}
  if config.coordinator_address is not None:
    kwargs.update(coordinator_address=config.coordinator_address,
                  num_processes=config.num_processes, process_id=config.process_id)
  if config.local_device_ids is not None:
    kwargs["local_device_ids"] = list(config.local_device_ids)
  jax.distributed.initialize(**kwargs)


def host_share(num_items: int, process_index: int | None = None,
               process_count: int | None = None) -> slice:
  """The contiguous block of `num_items` (environments, batch rows) this process owns."""
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if num_items % count:
    raise ValueError(f"{num_items} items do not split evenly over {count} processes")
  per = num_items // count
  return slice(index * per, (index + 1) * per)


def global_batch(local: Any, mesh: jax.sharding.Mesh) -> Any:
  """Each process's rows (a batch-major pytree of host arrays) -> one global sharded batch.

  Processes pass their shares in process order; the batch dimension is sharded over data × fsdp,
  so the mesh's devices must be ordered with each process's devices holding its rows (the
  default `jax.make_mesh` ordering does this when the batch axes span the processes).
  """
  sharding = rules_lib.batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local)


def is_writer() -> bool:
  """True on the one process that writes checkpoints, metrics and configs."""
  return jax.process_index() == 0


def on_writer(fn: Callable[..., T], *args, **kwargs) -> T | None:
  """Runs `fn` on process 0 only; other processes get None."""
  return fn(*args, **kwargs) if is_writer() else None


def gather_to_host(tree: Any) -> Any:
  """A fully replicated host (NumPy) copy of a sharded tree, on every process (a collective)."""
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def processes_of(devices: Sequence[jax.Device]) -> list[int]:
  return sorted({d.process_index for d in devices})


def gather_rows(local: Any) -> Any:
  """Concatenates every process's rows (a batch-major tree of host arrays) in process order.

  The identity on one process. Every process gets the whole result (a collective: all must call).
  """
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, local)
  from jax.experimental import multihost_utils
  return jax.tree.map(np.asarray, multihost_utils.process_allgather(local, tiled=True))


def agree_max(value: int) -> int:
  """The largest `value` over processes (e.g. the padded length every host must use)."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(gather_rows(np.asarray([value], np.int64))))


def agree_names(names: Sequence[str]) -> list[str]:
  """The sorted union of `names` over processes.

  Hosts build their batch trees independently; a key one host never saw (an env info field
  that none of its episodes emitted) must still exist on every host, or the global arrays
  would not line up.
  """
  mine = sorted(set(names))
  if jax.process_count() == 1:
    return mine
  encoded = np.frombuffer("\n".join(mine).encode(), np.uint8)
  width = agree_max(len(encoded))
  padded = np.zeros((1, width), np.uint8)
  padded[0, :len(encoded)] = encoded
  union: set[str] = set()
  for row in gather_rows(padded):
    text = bytes(row).rstrip(b"\0").decode()
    union.update(name for name in text.split("\n") if name)
  return sorted(union)


def local_replica(tree: Any) -> Any:
  """A full copy of a (possibly multi-host sharded) tree on this process's first device.

  Each host samples its own environments with a whole policy; fine for policies that fit one
  device (a host that cannot hold the policy needs the sampler on the global mesh instead).
  """
  if jax.process_count() == 1:
    return tree
  return jax.device_put(gather_to_host(tree), jax.local_devices()[0])
