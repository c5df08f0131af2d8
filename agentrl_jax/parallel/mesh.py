"""The device mesh: three axes `data`, `fsdp`, `tensor`, sizes from gin (−1 = the rest).

`data` replicates parameters and splits the batch; `fsdp` splits both the batch and the
parameters (gathered per layer by XLA); `tensor` splits heads, MLP width and vocabulary.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax

from agentrl_jax import config_errors

DATA, FSDP, TENSOR = "data", "fsdp", "tensor"
AXES = (DATA, FSDP, TENSOR)


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MeshConfig:
  """Mesh axis sizes; exactly one may be −1 (all the devices the others leave)."""

  data: int = -1
  fsdp: int = 1
  tensor: int = 1

  def __post_init__(self):
    config_errors.check_field_types(self)
    sizes = self.sizes
    if any(s == 0 or s < -1 for s in sizes):
      raise ValueError(f"MeshConfig sizes must be positive or -1, got {dict(zip(AXES, sizes))}")
    if sizes.count(-1) > 1:
      raise ValueError(f"MeshConfig: at most one axis may be -1, got {dict(zip(AXES, sizes))}")

  @property
  def sizes(self) -> tuple[int, int, int]:
    return (self.data, self.fsdp, self.tensor)

  def resolve(self, num_devices: int) -> tuple[int, int, int]:
    """The concrete axis sizes on `num_devices` devices."""
    sizes = list(self.sizes)
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % fixed:
        raise ValueError(f"MeshConfig {dict(zip(AXES, self.sizes))}: {num_devices} devices are not "
                         f"divisible by the fixed axes' product {fixed}")
      sizes[sizes.index(-1)] = num_devices // fixed
    elif fixed != num_devices:
      raise ValueError(f"MeshConfig {dict(zip(AXES, self.sizes))} needs {fixed} devices, "
                       f"{num_devices} are available")
    return tuple(sizes)


# The three layouts the tests and configs name.
PRESETS = {
    "data": MeshConfig(data=-1),
    "fsdp": MeshConfig(data=1, fsdp=-1),
    "fsdp_tensor": MeshConfig(data=1, fsdp=-1, tensor=2),
}


def make_mesh(config: MeshConfig = MeshConfig(),
              devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """A mesh over `devices` (default: all, across every process) with axes data, fsdp, tensor.

  Axes are `Auto`: shardings are given on inputs/outputs and XLA propagates the rest.
  """
  devices = list(devices if devices is not None else jax.devices())
  shape = config.resolve(len(devices))
  return jax.make_mesh(shape, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES),
                       devices=devices)


def batch_axes(mesh: jax.sharding.Mesh) -> tuple[str, ...]:
  """The mesh axes the batch dimension is split over."""
  return (DATA, FSDP)


def model_parallel_size(mesh: jax.sharding.Mesh) -> int:
  """Devices one parameter copy is spread over (fsdp × tensor)."""
  return mesh.shape[FSDP] * mesh.shape[TENSOR]
