"""Several processes (TPU pod hosts, multi-GPU nodes, or CPU processes on loopback) as one mesh.

Each process runs its share of the environments, turns its trajectories into its rows of one
global batch (`global_batch`), and joins the same jitted, sharded update. Only process 0 writes
files (`is_writer`, `on_writer`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax.parallel import rules as rules_lib

T = TypeVar("T")


@config_errors.config_class
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
    config_errors.check_field_types(self)
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


# Google's PCI vendor id: a TPU chip attached to this host (what JAX itself looks for).
_GOOGLE_PCI_VENDOR = "0x1ae0"
_METADATA_URL = "http://{host}/computeMetadata/v1/instance/attributes/{key}"


def _gce_tpu_metadata(key: str, environ: Mapping[str, str]) -> str | None:
  """An attribute from the Cloud TPU VM's metadata server; None off a TPU VM or on any failure.

  The server is only asked on a host with a TPU chip attached (so a laptop or a GPU node never
  waits on a network timeout), and not when TPU_SKIP_MDS_QUERY is set (JAX's own opt-out).
  """
  if environ.get("TPU_SKIP_MDS_QUERY") is not None:
    return None
  vendors = []
  for path in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(path) as f:
        vendors.append(f.read().strip())
    except OSError:
      continue
  if _GOOGLE_PCI_VENDOR not in vendors:
    return None
  url = _METADATA_URL.format(host=environ.get("GCE_METADATA_IP", "metadata.google.internal"),
                             key=key)
  request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
  try:
    with urllib.request.urlopen(request, timeout=10) as response:
      return response.read().decode()
  except (OSError, urllib.error.URLError):
    return None


def _count(items: str | None) -> int:
  return len([item for item in (items or "").split(",") if item.strip()])


def detected_cluster(environ: Mapping[str, str],
                     tpu_metadata: Callable[[str], str | None] | None = None
                     ) -> tuple[str, int] | None:
  """The cluster `jax.distributed.initialize()` would find here, as (kind, process count).

  Reads the signals JAX's own cluster detectors (`jax._src.clusters`) read, in their order:
  a GKE TPU slice (TPU_PROCESS_ADDRESSES or TPU_WORKER_HOSTNAMES), a Cloud TPU VM slice (the
  metadata server's `worker-network-endpoints`, asked through `tpu_metadata`), SLURM (the
  SLURM_* variables of a `srun` step, SLURM_NTASKS processes) and Open MPI (`mpirun` sets
  OMPI_MCA_orte_hnp_uri, OMPI_COMM_WORLD_SIZE processes). TPU slices multiply by
  MEGASCALE_NUM_SLICES. None where none of them is present.

  Args:
    environ: the process environment (os.environ, or a dict in tests).
    tpu_metadata: key -> metadata attribute text or None; default: ask the Cloud TPU VM's
      metadata server when a TPU chip is attached, else None.
  """
  if tpu_metadata is None:
    def tpu_metadata(key):
      return _gce_tpu_metadata(key, environ)
  slices = int(environ.get("MEGASCALE_NUM_SLICES") or 1)
  gke_workers = environ.get("TPU_PROCESS_ADDRESSES") or environ.get("TPU_WORKER_HOSTNAMES")
  if gke_workers is not None:
    return "gke_tpu", _count(gke_workers) * slices
  gce_workers = tpu_metadata("worker-network-endpoints")
  if gce_workers is not None:
    return "cloud_tpu_vm", _count(gce_workers) * slices
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  if all(name in environ for name in slurm):
    return "slurm", int(environ["SLURM_NTASKS"])
  if "OMPI_MCA_orte_hnp_uri" in environ:
    return "ompi", int(environ.get("OMPI_COMM_WORLD_SIZE") or 1)
  return None


def initialize_from_environment(
    environ: Mapping[str, str] | None = None, *,
    initialize: Callable[..., None] | None = None,
    tpu_metadata: Callable[[str], str | None] | None = None) -> str | None:
  """Joins a multi-process job at start-up, as the environment says; returns how, or None.

  * JAX_COORDINATOR_ADDRESS set (tpu/gpu_launch.sh, CPU processes on loopback): the explicit
    `initialize(address, JAX_NUM_PROCESSES, JAX_PROCESS_ID)`; returns "explicit".
  * Otherwise, where `detected_cluster` finds more than one process (a multi-host Cloud TPU or
    GKE slice, a SLURM step, an `mpirun` job): `initialize()` with no arguments, so that JAX's
    own detection fills them in; returns the cluster's kind.
  * Otherwise (one process, e.g. a single-host TPU VM or a workstation): nothing; returns None.

  Call it before anything touches a device.

  Args:
    environ: the process environment; default os.environ.
    initialize: default `jax.distributed.initialize` (tests pass a recorder).
    tpu_metadata: passed to `detected_cluster`.

  Raises:
    ValueError: JAX_COORDINATOR_ADDRESS is set without JAX_NUM_PROCESSES or JAX_PROCESS_ID.
  """
  environ = os.environ if environ is None else environ
  initialize = jax.distributed.initialize if initialize is None else initialize
  address = environ.get("JAX_COORDINATOR_ADDRESS")
  if address:
    missing = [name for name in ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID") if not environ.get(name)]
    if missing:
      raise ValueError(f"JAX_COORDINATOR_ADDRESS={address!r} needs {' and '.join(missing)} "
                       "in the environment too")
    initialize(address, int(environ["JAX_NUM_PROCESSES"]), int(environ["JAX_PROCESS_ID"]))
    return "explicit"
  cluster = detected_cluster(environ, tpu_metadata)
  if cluster is not None and cluster[1] > 1:
    initialize()
    return cluster[0]
  return None


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
