"""HF checkpoint directories without torch: safetensors I/O, round trips, sharded load, errors."""

import dataclasses
import functools
import json
import os
import pathlib
import sys

import jax
import ml_dtypes
import numpy as np
import pytest

from agentrl_jax.models import hf
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import rules as rules_lib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "experiments"))
import make_tiny_hf_checkpoint  # noqa: E402


def _flat(params):
  return {hf.path_name(p): np.asarray(v[...]) for p, v in
          jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, hf.nnx.Variable))}


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("ckpt") / "qwen2")
  config = make_tiny_hf_checkpoint.write(path, "qwen2", vocab_size=40)
  return path, config


def test_safetensors_write_read_round_trip(tmp_path):
  tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
             "b": np.asarray([1.5, -2.25], ml_dtypes.bfloat16),
             "c": np.asarray([[7]], np.int64)}
  path = str(tmp_path / "x.safetensors")
  hf.write_safetensors(path, tensors)
  back = hf.open_safetensors(path)
  assert sorted(back) == ["a", "b", "c"]
  for k, v in tensors.items():
    assert back[k].dtype == v.dtype
    np.testing.assert_array_equal(back[k], v)
  # The header length (first 8 bytes) keeps the data section 8-byte aligned.
  _, start = hf.read_safetensors_header(path)
  assert start % 8 == 0


def test_tiny_script_writes_a_loadable_checkpoint(tiny_qwen2):
  path, config = tiny_qwen2
  loaded, _, params = hf.load(path)
  assert hf.architecture_diff(loaded, config) == []
  assert sum(np.size(x) for x in jax.tree.leaves(params)) == transformer.num_params(config)


@pytest.mark.parametrize("tie,shard_bytes", [(True, None), (False, 20_000)])
def test_export_then_load_is_exact(tmp_path, tie, shard_bytes):
  config = make_tiny_hf_checkpoint.tiny_config("llama", vocab_size=40)
  config = dataclasses.replace(config, tie_embeddings=tie)
  _, params = transformer.create(config, seed=3)
  hf.export(str(tmp_path), config, params, model_type="llama", max_shard_bytes=shard_bytes)
  if shard_bytes:
    assert os.path.exists(tmp_path / hf.INDEX_FILE)
  loaded_config, _, loaded = hf.load(str(tmp_path))
  assert hf.architecture_diff(loaded_config, config) == []
  want, got = _flat(params), _flat(loaded)
  assert sorted(want) == sorted(got)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_bfloat16_export_rounds_once(tmp_path, tiny_qwen2):
  _, config = tiny_qwen2
  _, params = transformer.create(config, seed=1)
  hf.export(str(tmp_path), config, params, model_type="qwen2", dtype="bfloat16")
  assert json.load(open(tmp_path / "config.json"))["torch_dtype"] == "bfloat16"
  _, _, loaded = hf.load(str(tmp_path))
  for k, v in _flat(params).items():
    np.testing.assert_array_equal(_flat(loaded)[k], v.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_load_onto_mesh_follows_the_rules(tiny_qwen2):
  path, _ = tiny_qwen2
  mesh = mesh_lib.make_mesh(mesh_lib.PRESETS["fsdp_tensor"])
  shardings = functools.partial(rules_lib.param_shardings, mesh=mesh)
  _, _, on_mesh = hf.load(path, shardings=shardings)
  _, _, single = hf.load(path)
  want = shardings(on_mesh)
  for leaf, s in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(want)):
    assert leaf.sharding.is_equivalent_to(s, leaf.ndim)
  for a, b in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(single)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  w_up = on_mesh["blocks"][0]["mlp"]["w_up"][...]
  assert w_up.addressable_shards[0].data.shape == (64 // 4, 256 // 2)  # fsdp 4 x tensor 2


# ----------------------------------------------------------------------------- error messages


def _copy(src, dst):
  os.makedirs(dst)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
      g.write(f.read())
  return dst


def _edit_config(path, **changes):
  cfg = json.load(open(os.path.join(path, "config.json")))
  cfg.update(changes)
  json.dump(cfg, open(os.path.join(path, "config.json"), "w"))


def test_wrong_path_names_it(tmp_path):
  with pytest.raises(hf.CheckpointError, match="does not exist"):
    hf.load(str(tmp_path / "nowhere"))
  with pytest.raises(hf.CheckpointError, match="no config.json"):
    hf.load(str(tmp_path))


def test_unsupported_architecture_names_it(tiny_qwen2, tmp_path):
  path = _copy(tiny_qwen2[0], str(tmp_path / "c"))
  _edit_config(path, model_type="gpt2", architectures=["GPT2LMHeadModel"])
  with pytest.raises(hf.CheckpointError, match=r"unsupported architecture model_type='gpt2'.*GPT2LMHeadModel"):
    hf.load(path)


def test_unsupported_rope_scaling_names_it(tiny_qwen2, tmp_path):
  path = _copy(tiny_qwen2[0], str(tmp_path / "c"))
  _edit_config(path, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6})
  with pytest.raises(hf.CheckpointError, match="unsupported RoPE scaling type 'yarn'"):
    hf.load(path)


def test_config_weights_shape_mismatch_names_the_tensor(tiny_qwen2, tmp_path):
  path = _copy(tiny_qwen2[0], str(tmp_path / "c"))
  _edit_config(path, intermediate_size=128)
  with pytest.raises(hf.CheckpointError,
                     match=r"'model.layers.0.mlp.(gate|up|down)_proj.weight' has shape \(\d+, \d+\), "
                           r"but config.json implies"):
    hf.load(path)


def test_layer_count_mismatch_names_the_tensors(tiny_qwen2, tmp_path):
  path = _copy(tiny_qwen2[0], str(tmp_path / "c"))
  _edit_config(path, num_hidden_layers=1)
  with pytest.raises(hf.CheckpointError, match=r"model.layers.1.*do not belong to a 1-layer model"):
    hf.load(path)
  _edit_config(path, num_hidden_layers=3)
  with pytest.raises(hf.CheckpointError, match=r"'model.layers.2.input_layernorm.weight'.*absent"):
    hf.load(path)


def test_configured_model_mismatch_names_the_field(tiny_qwen2):
  path, config = tiny_qwen2
  other = dataclasses.replace(config, d_model=32)
  with pytest.raises(hf.CheckpointError, match="d_model: checkpoint 64 vs configured 32"):
    hf.load(path, expect=other)


def test_truncated_file_is_reported(tiny_qwen2, tmp_path):
  path = _copy(tiny_qwen2[0], str(tmp_path / "c"))
  weights = os.path.join(path, "model.safetensors")
  size = os.path.getsize(weights)
  with open(weights, "r+b") as f:
    f.truncate(size - 100)
  with pytest.raises(hf.CheckpointError, match="truncated"):
    hf.load(path)
