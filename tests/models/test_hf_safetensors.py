"""Sharded loading reads per-device blocks through safetensors; bad files fail in one line."""

import dataclasses
import functools
import pathlib
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy
from jax.sharding import NamedSharding, PartitionSpec

from agentrl_jax.models import hf
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import rules as rules_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "experiments"))
import make_tiny_hf_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
  """Untied head, no biases, 2 shards: every HF <-> ours layout except the biases."""
  config = dataclasses.replace(make_tiny_hf_checkpoint.tiny_config("llama", vocab_size=48),
                               tie_embeddings=False)
  _, params = transformer.create(config, seed=2)
  path = str(tmp_path_factory.mktemp("llama"))
  hf.export(path, config, params, model_type="llama", max_shard_bytes=60_000)
  return path


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("qwen2") / "c")
  make_tiny_hf_checkpoint.write(path, "qwen2", vocab_size=40)
  return path


def _spread(abstract, mesh):
  """Each mesh axis on the first free dimension it divides: splits heads, and dh where the
  heads run out (the k/v projections and biases), so every block mapping is exercised."""
  def spec(var):
    axes = [None] * len(var.shape)
    for name, size in mesh.shape.items():
      free = [i for i, n in enumerate(var.shape) if axes[i] is None and n % size == 0]
      if free:
        axes[free[0]] = name
    return NamedSharding(mesh, PartitionSpec(*axes))
  return jax.tree.map(spec, abstract, is_leaf=lambda x: isinstance(x, hf.nnx.Variable))


def _full_tensors(path):
  out = {}
  for f in sorted(pathlib.Path(path).glob("*.safetensors")):
    out.update(safetensors.numpy.load_file(str(f)))
  return out


def _recording_reads(monkeypatch):
  reads = []
  original = hf.MappedTensors.read

  def read(self, name, index):
    block = original(self, name, index)
    reads.append((name, block.size))
    return block

  monkeypatch.setattr(hf.MappedTensors, "read", read)
  return reads


def _loaded_leaves(path, params):
  config, _ = hf.load_config(path)
  entries = {e.path: e for e in hf._entries(config)}
  for key, var in jax.tree_util.tree_leaves_with_path(params, is_leaf=hf._is_param):
    yield entries[hf.path_name(key)], var[...]


@pytest.mark.parametrize("fixture", ["llama", "qwen2"])
def test_every_device_holds_its_block_of_the_stored_tensor(fixture, request, monkeypatch):
  path = request.getfixturevalue(fixture)
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  reads = _recording_reads(monkeypatch)
  _, _, params = hf.load(path, shardings=functools.partial(_spread, mesh=mesh))
  full = _full_tensors(path)
  wanted = _spread(params, mesh)
  for (entry, array), sharding in zip(_loaded_leaves(path, params), jax.tree.leaves(wanted)):
    assert array.sharding == sharding, entry.path
    ours = entry.to_ours(full[entry.hf_name])
    assert len(array.addressable_shards) == 8
    for shard in array.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), ours[shard.index], err_msg=entry.path)
  sharded = {e.hf_name for e, a in _loaded_leaves(path, params)
             if not a.sharding.is_fully_replicated}
  assert sharded and all(size < full[name].size for name, size in reads if name in sharded)


def test_head_sharded_load_reads_exactly_the_device_blocks(llama, monkeypatch):
  mesh = mesh_lib.make_mesh(mesh_lib.PRESETS["fsdp_tensor"])
  reads = _recording_reads(monkeypatch)
  _, _, params = hf.load(llama, shardings=functools.partial(rules_lib.param_shardings, mesh=mesh))
  read = {}
  for name, size in reads:
    read[name] = read.get(name, 0) + size
  for entry, array in _loaded_leaves(llama, params):
    assert read[entry.hf_name] == sum(s.data.size for s in array.addressable_shards), entry.path


def test_bfloat16_checkpoint_loads_sharded(tmp_path, qwen2):
  config, _ = hf.load_config(qwen2)
  _, _, params = hf.load(qwen2)
  hf.export(str(tmp_path), config, params, model_type="qwen2", dtype="bfloat16")
  assert {t.dtype.name for t in _full_tensors(tmp_path).values()} == {"bfloat16"}
  mesh = jax.make_mesh((2, 4), ("a", "b"))
  _, _, back = hf.load(str(tmp_path), shardings=functools.partial(_spread, mesh=mesh))
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    rounded = np.asarray(b).astype("bfloat16").astype(np.float32)
    np.testing.assert_array_equal(np.asarray(a), rounded)


def test_written_files_carry_the_metadata_transformers_expects(qwen2):
  with safetensors.safe_open(f"{qwen2}/{hf.SINGLE_FILE}", framework="numpy") as f:
    assert f.metadata() == {"format": "pt"}


def _one_line_error(path, match):
  with pytest.raises(ValueError, match=match) as info:
    hf.load(path)
  assert "\n" not in str(info.value)
  return str(info.value)


def _copy_of(src, dst):
  dst.mkdir()
  for f in pathlib.Path(src).iterdir():
    (dst / f.name).write_bytes(f.read_bytes())
  return dst


@pytest.mark.parametrize("cut", [100, 10_000])
def test_truncated_file_is_one_line_naming_it(qwen2, tmp_path, cut):
  path = _copy_of(qwen2, tmp_path / "c")
  weights = path / hf.SINGLE_FILE
  weights.write_bytes(weights.read_bytes()[:-cut])
  message = _one_line_error(str(path), "truncated")
  assert message.startswith(str(weights))


def test_header_cut_short_is_one_line_naming_it(qwen2, tmp_path):
  path = _copy_of(qwen2, tmp_path / "c")
  (path / hf.SINGLE_FILE).write_bytes((path / hf.SINGLE_FILE).read_bytes()[:20])
  assert _one_line_error(str(path), "truncated").startswith(str(path / hf.SINGLE_FILE))


def test_tensor_missing_from_its_shard_is_one_line(llama, tmp_path):
  path = _copy_of(llama, tmp_path / "c")
  shard = sorted(path.glob("model-*.safetensors"))[0]
  tensors = safetensors.numpy.load_file(str(shard))
  dropped = sorted(tensors)[0]
  del tensors[dropped]
  safetensors.numpy.save_file(tensors, str(shard), metadata={"format": "pt"})
  assert dropped in _one_line_error(str(path), "listed but not in their shards")


def test_wrong_dtype_is_one_line_naming_the_tensor(qwen2, tmp_path):
  path = _copy_of(qwen2, tmp_path / "c")
  tensors = safetensors.numpy.load_file(str(path / hf.SINGLE_FILE))
  tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int32)
  safetensors.numpy.save_file(tensors, str(path / hf.SINGLE_FILE), metadata={"format": "pt"})
  _one_line_error(str(path), r"'model.norm.weight' has dtype I32, but model weights are floating")


def test_wrong_shape_is_one_line_naming_the_tensor(qwen2, tmp_path):
  path = _copy_of(qwen2, tmp_path / "c")
  tensors = safetensors.numpy.load_file(str(path / hf.SINGLE_FILE))
  name = "model.layers.1.self_attn.k_proj.bias"
  tensors[name] = tensors[name][:-1].copy()
  safetensors.numpy.save_file(tensors, str(path / hf.SINGLE_FILE), metadata={"format": "pt"})
  _one_line_error(str(path), rf"'{name}' has shape \(31,\), but config.json implies \(32,\)")
