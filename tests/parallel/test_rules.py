"""Logical axis rules: specs, the start-up table, and the replicated-bytes check."""

import jax
import pytest

from agentrl_jax.models import hf
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import rules as rules_lib

P = jax.sharding.PartitionSpec


def _mesh(name):
  return mesh_lib.make_mesh(mesh_lib.PRESETS[name])


def test_spec_follows_rules_and_skips_size_one_axes():
  train = rules_lib.logical_rules("train")
  # [D, H, Dh] on fsdp 4 x tensor 2: embed -> fsdp, heads -> tensor, kv replicated.
  assert rules_lib.spec_for((64, 4, 16), ("embed", "heads", "kv"), _mesh("fsdp_tensor"), train) == \
      P("fsdp", "tensor", None)
  # Pure data parallel: every axis but data has size 1, so parameters are replicated.
  assert rules_lib.spec_for((64, 4, 16), ("embed", "heads", "kv"), _mesh("data"), train) == P(None, None, None)
  # Sampling layout keeps the embed dimension whole (no fsdp gathers per decoded token).
  sample = rules_lib.logical_rules("sample")
  assert rules_lib.spec_for((64, 256), ("embed", "mlp"), _mesh("fsdp_tensor"), sample) == P(None, "tensor")


def test_indivisible_dimension_stays_replicated():
  # 14 heads (Qwen2.5-0.5B) do not split over tensor 4.
  mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(data=1, fsdp=2, tensor=4))
  spec = rules_lib.spec_for((896, 14, 64), ("embed", "heads", "kv"), mesh, rules_lib.logical_rules())
  assert spec == P("fsdp", None, None)


def test_unknown_logical_axis_and_bad_layout_are_named():
  with pytest.raises(ValueError, match="no sharding rule for logical axis 'depth'"):
    rules_lib.spec_for((4,), ("depth",), _mesh("fsdp"), rules_lib.logical_rules())
  with pytest.raises(ValueError, match="layout must be one of"):
    rules_lib.logical_rules("serve")


def test_real_shapes_are_sufficiently_sharded_and_the_table_says_so():
  # Abstract arrays only: nothing of Qwen2.5-7B is allocated.
  _, params = hf.abstract_params(transformer.qwen2_5_7b())
  mesh = _mesh("fsdp_tensor")
  shardings = rules_lib.param_shardings(params, mesh)
  rules_lib.check_sufficiently_sharded(params, shardings, mesh)
  table = rules_lib.sharding_table(params, shardings)
  assert "blocks.0.attn.wq" in table and "('fsdp', 'tensor', None)" in table
  rows = rules_lib.sharding_rows(params, shardings)
  total = sum(r.bytes for r in rows)
  assert total == 4 * transformer.num_params(transformer.qwen2_5_7b())  # float32
  assert table.splitlines()[-1].startswith(f"params: {len(rows)} arrays")


def test_replicated_parameters_fail_the_check():
  _, params = hf.abstract_params(transformer.tiny(512, d_model=64))
  mesh = _mesh("fsdp")
  everything_replicated = {name: () for name in rules_lib.logical_rules()}
  shardings = rules_lib.param_shardings(params, mesh, everything_replicated)
  with pytest.raises(ValueError, match=r"not sufficiently sharded.*largest replicated: embed \(512, 64\)"):
    rules_lib.check_sufficiently_sharded(params, shardings, mesh)
  # Under pure data parallelism a full copy per device is the design, not a failure.
  data = _mesh("data")
  rules_lib.check_sufficiently_sharded(params, rules_lib.param_shardings(params, data), data)


def test_constrain_needs_a_mesh():
  x = jax.numpy.zeros((8, 4))
  with pytest.raises(RuntimeError, match="needs a mesh"):
    rules_lib.constrain(x, ("batch", None))
  mesh = _mesh("fsdp")
  with jax.set_mesh(mesh):
    y = jax.jit(lambda x: rules_lib.constrain(x, ("batch", None)))(x)
  # data has size 1 on this mesh, so rows split over fsdp alone.
  assert y.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P("fsdp", None)), 2)


def test_batch_that_does_not_split_is_named():
  with pytest.raises(ValueError, match="batch of 6 rows does not split over data x fsdp = 8"):
    rules_lib.shard_batch({"x": jax.numpy.zeros((6, 2))}, _mesh("fsdp"))
