"""Tests for the W&B side of agentrl_jax.learner.metrics.MetricsWriter, in W&B's offline mode.

Each offline run is read back from its `.wandb` file, which W&B writes in LevelDB's log format:
a 7-byte file header, then 32 KiB blocks of records, each `[crc u32][length u16][type u8]` and
a chunk of one serialized `Record` protobuf (types 1 full, 2 first, 3 middle, 4 last).
"""

import glob
import json
import os
import struct
import subprocess
import sys
import textwrap

import gin
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import metrics

wandb = pytest.importorskip("wandb")
from wandb.proto import wandb_internal_pb2  # noqa: E402

METRICS_IMPORT = "from agentrl_jax.learner import metrics"
PROJECT = "agentrl-test"
_BLOCK = 32768
_HEADER = 7


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for variable in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
    monkeypatch.setenv(variable, str(tmp_path / "wandb_home"))
  gin.clear_config()
  yield
  gin.clear_config()


def _bind_wandb(*extra: str) -> None:
  config_errors.parse_config(
      [], ["metrics.MetricsWriter.wandb = @metrics.WandbConfig()",
           f"metrics.WandbConfig.project = '{PROJECT}'",
           "metrics.WandbConfig.mode = 'offline'", *extra],
      default_imports=(METRICS_IMPORT,))


def _records(path: str):
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B"
  position, pending = _HEADER, b""
  while position + _HEADER <= len(data):
    left = _BLOCK - position % _BLOCK
    if left < _HEADER:  # a block's tail too short for a header is padding
      position += left
      continue
    _, length, kind = struct.unpack("<IHB", data[position:position + _HEADER])
    pending += data[position + _HEADER:position + _HEADER + length]
    position += _HEADER + length
    if kind in (1, 4):
      yield wandb_internal_pb2.Record.FromString(pending)
      pending = b""


def _offline_runs(workdir) -> list[dict]:
  """Each offline run under `<workdir>/wandb`: its id, config and `{step: {name: value}}`."""
  # A finished run's records may still sit in W&B's service: stopping it flushes them to disk.
  wandb.teardown()
  runs = []
  for path in glob.glob(os.path.join(workdir, metrics.WANDB_DIR, "offline-run-*", "*.wandb")):
    run = {"history": {}}
    for record in _records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run["id"] = record.run.run_id
        run["project"] = record.run.project
        run["tags"] = list(record.run.tags)
        run["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
      elif kind == "history":
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                 for item in record.history.item}
        run["history"][items.pop("_step")] = {k: v for k, v in items.items()
                                              if not k.startswith("_")}
    runs.append(run)
  return runs


def _stored_id(workdir) -> str:
  with open(os.path.join(workdir, metrics.WANDB_RUN_ID_FILE), encoding="utf-8") as f:
    return f.read()


def test_scalars_and_the_gin_config_reach_the_offline_run(tmp_path):
  workdir = tmp_path / "run"
  _bind_wandb("metrics.WandbConfig.tags = ('grpo', 'frozenlake')")
  metrics.check_workdir(workdir)
  metrics.write_config(workdir)
  with metrics.MetricsWriter(workdir) as writer:
    writer.write(0, {"loss": 1.5, "success": np.float32(0.25)})
    writer.write(1, {"loss": 0.5})
    writer.write(3, {"loss": 0.25, "success": 0.75})

  (run,) = _offline_runs(workdir)
  jsonl = {r.pop("step"): r for r in metrics.read_metrics(workdir)}
  assert run["history"] == jsonl == {0: {"loss": 1.5, "success": 0.25}, 1: {"loss": 0.5},
                                     3: {"loss": 0.25, "success": 0.75}}
  assert run["id"] == _stored_id(workdir)
  assert (run["project"], run["tags"]) == (PROJECT, ["grpo", "frozenlake"])
  assert run["config"]["gin"]["metrics.WandbConfig.project"] == PROJECT
  assert run["config"]["gin_config"] == (workdir / metrics.CONFIG_FILE).read_text()


# Both cases in one process: importing the writer (tensorboardX) takes seconds.
_NO_WANDB_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import gin
    from agentrl_jax import config_errors
    from agentrl_jax.learner import metrics
    root, cases = sys.argv[1], json.loads(sys.argv[2])
    for name, bindings in cases.items():
      gin.clear_config()
      config_errors.parse_config([], bindings, default_imports=[{import_!r}])
      workdir = os.path.join(root, name)
      metrics.check_workdir(workdir)
      with metrics.MetricsWriter(workdir) as writer:
        writer.rewind(None)
        writer.write(0, {{"loss": 1.0}})
        writer.write(1, {{"loss": 0.5}})
    print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "wandb")))
""").format(import_=METRICS_IMPORT)


def test_a_run_without_wandb_never_imports_it_nor_writes_its_files(tmp_path):
  cases = {"unbound": [],
           "disabled": ["metrics.MetricsWriter.wandb = @metrics.WandbConfig()",
                        "metrics.WandbConfig.project = 'p'",
                        "metrics.WandbConfig.mode = 'disabled'"]}
  result = subprocess.run(
      [sys.executable, "-c", _NO_WANDB_SCRIPT, str(tmp_path), json.dumps(cases)],
      capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr
  assert json.loads(result.stdout.splitlines()[-1]) == []
  for name in cases:
    workdir = tmp_path / name
    assert len(metrics.read_metrics(workdir)) == 2, name
    assert not (workdir / metrics.WANDB_DIR).exists(), name
    assert not (workdir / metrics.WANDB_RUN_ID_FILE).exists(), name
  assert not (tmp_path / "wandb_home").exists()


def test_only_process_0_logs_to_wandb(tmp_path):
  config = metrics.WandbConfig(project=PROJECT, mode="offline")
  with metrics.MetricsWriter(tmp_path, process_index=1, wandb=config) as writer:
    writer.write(0, {"loss": 1.0})
  assert not (tmp_path / metrics.WANDB_DIR).exists()
  assert not (tmp_path / metrics.WANDB_RUN_ID_FILE).exists()


def test_a_bad_mode_fails_in_one_line_naming_the_field(tmp_path):
  errors = []
  with pytest.raises(config_errors.ConfigError) as parsed:  # a literal: refused while parsing
    _bind_wandb("metrics.WandbConfig.mode = 'onlin'")
  errors.append(parsed.value)
  with pytest.raises(config_errors.ConfigError) as built:
    metrics.WandbConfig(project=PROJECT, mode="onlin")
  errors.append(built.value)
  gin.clear_config()
  _bind_wandb("MODE = 'onlin'", "metrics.WandbConfig.mode = %MODE")  # a macro: at the launch check
  with pytest.raises(config_errors.ConfigError) as launched:
    metrics.check_workdir(tmp_path / "run")
  errors.append(launched.value)
  for error in errors:
    message = str(error)
    assert "\n" not in message, message
    assert "metrics.WandbConfig.mode" in message and "'onlin'" in message, message
  assert not (tmp_path / "run").exists()


def test_missing_wandb_fails_at_launch_naming_the_install(tmp_path, monkeypatch):
  _bind_wandb()
  monkeypatch.setitem(sys.modules, "wandb", None)  # what importing an absent package finds
  workdir = tmp_path / "run"
  for launch in (metrics.check_workdir, metrics.MetricsWriter):
    with pytest.raises(config_errors.ConfigError) as error:
      launch(workdir)
    assert str(error.value) == ("metrics.WandbConfig binds a W&B run, but wandb is not installed: "
                                "pip install 'agentrl_jax[wandb]'")
  assert not (workdir / metrics.WANDB_DIR).exists()
  assert not (workdir / metrics.METRICS_FILE).exists()


def test_a_resumed_launch_continues_the_stored_run(tmp_path):
  config = metrics.WandbConfig(project=PROJECT, mode="offline")
  with metrics.MetricsWriter(tmp_path, wandb=config) as writer:
    writer.rewind(None)
    for step in range(4):
      writer.write(step, {"loss": float(step)})
  first_id = _stored_id(tmp_path)
  with metrics.MetricsWriter(tmp_path, wandb=config) as writer:
    writer.rewind(2)  # restored checkpoint 2: iteration 3 is re-run
    writer.write(3, {"loss": 30.0})
    writer.write(4, {"loss": 40.0})

  assert _stored_id(tmp_path) == first_id
  runs = _offline_runs(tmp_path)
  assert [run["id"] for run in runs] == [first_id, first_id]
  assert sorted(sorted(run["history"]) for run in runs) == [[0, 1, 2, 3], [3, 4]]
  resumed = next(run for run in runs if 4 in run["history"])
  assert resumed["history"] == {3: {"loss": 30.0}, 4: {"loss": 40.0}}


def test_a_launch_without_a_checkpoint_starts_a_new_run(tmp_path):
  config = metrics.WandbConfig(project=PROJECT, mode="offline")
  with metrics.MetricsWriter(tmp_path, wandb=config) as writer:
    writer.rewind(None)
    writer.write(0, {"loss": 1.0})
  first_id = _stored_id(tmp_path)
  with metrics.MetricsWriter(tmp_path, wandb=config) as writer:
    writer.rewind(None)  # nothing to resume: the JSONL record starts over, and so does W&B
    writer.write(0, {"loss": 2.0})

  second_id = _stored_id(tmp_path)
  assert second_id != first_id
  runs = {run["id"]: run["history"] for run in _offline_runs(tmp_path)}
  assert runs == {first_id: {0: {"loss": 1.0}}, second_id: {0: {"loss": 2.0}}}
