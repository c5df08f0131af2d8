"""Mesh sizes from MeshConfig (−1 = the rest) on the 8 fake CPU devices."""

import jax
import pytest

from agentrl_jax.parallel import mesh as mesh_lib


@pytest.mark.parametrize("config,shape", [
    (mesh_lib.MeshConfig(), (8, 1, 1)),
    (mesh_lib.PRESETS["fsdp"], (1, 8, 1)),
    (mesh_lib.PRESETS["fsdp_tensor"], (1, 4, 2)),
    (mesh_lib.MeshConfig(data=2, fsdp=2, tensor=2), (2, 2, 2)),
])
def test_sizes_resolve_to_the_device_count(config, shape):
  mesh = mesh_lib.make_mesh(config)
  assert tuple(mesh.shape[a] for a in mesh_lib.AXES) == shape
  assert mesh.devices.size == jax.device_count() == 8


@pytest.mark.parametrize("kwargs,match", [
    (dict(data=-1, fsdp=-1), "at most one"),
    (dict(tensor=0), "positive or -1"),
])
def test_bad_config_names_the_problem(kwargs, match):
  with pytest.raises(ValueError, match=match):
    mesh_lib.MeshConfig(**kwargs)


def test_sizes_that_do_not_fit_the_devices_are_reported():
  with pytest.raises(ValueError, match="not divisible by the fixed axes' product 3"):
    mesh_lib.make_mesh(mesh_lib.MeshConfig(tensor=3))
  with pytest.raises(ValueError, match="needs 4 devices, 8 are available"):
    mesh_lib.make_mesh(mesh_lib.MeshConfig(data=2, fsdp=2, tensor=1))
