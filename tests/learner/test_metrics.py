"""Tests for agentrl_jax.learner.metrics: JSONL + TensorBoard writers and the progress display."""

import glob
import io
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from agentrl_jax import files
from agentrl_jax.learner import metrics


def _tensorboard_events(workdir) -> list[event_pb2.Event]:
  """Parses the TFRecord event files: [len u64][crc u32][payload][crc u32] per record."""
  events = []
  for path in sorted(glob.glob(os.path.join(workdir, metrics.TENSORBOARD_DIR, "events.*"))):
    with open(path, "rb") as f:
      data = f.read()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      payload = data[offset + 12:offset + 12 + length]
      events.append(event_pb2.Event.FromString(payload))
      offset += 12 + length + 4
  return events


def _scalars(events) -> dict[tuple[str, int], float]:
  return {(v.tag, e.step): v.simple_value
          for e in events if e.HasField("summary") for v in e.summary.value
          if v.HasField("simple_value")}


def test_write_appends_json_lines_and_tensorboard_scalars(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(0, {"loss": 1.5, "success": np.float32(0.25)})
    # Flushed per write: readable before close.
    assert metrics.read_metrics(tmp_path) == [{"step": 0, "loss": 1.5, "success": 0.25}]
    writer.write(1, {"loss": jnp.asarray(0.5), "success": 1})
    writer.write_text(1, "sample", "> go north\nYou are in a kitchen.")

  assert metrics.read_metrics(tmp_path) == [
      {"step": 0, "loss": 1.5, "success": 0.25},
      {"step": 1, "loss": 0.5, "success": 1.0},
  ]
  events = _tensorboard_events(tmp_path)
  assert _scalars(events) == {("loss", 0): 1.5, ("success", 0): 0.25,
                              ("loss", 1): 0.5, ("success", 1): 1.0}
  texts = [v for e in events if e.HasField("summary") for v in e.summary.value
           if v.tag.startswith("sample")]
  assert len(texts) == 1 and b"kitchen" in texts[0].tensor.string_val[0]


def test_resumed_writer_appends_to_the_same_record(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(0, {"loss": 2.0})
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"loss": 1.0})
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [0, 1]


def test_truncated_last_line_is_tolerated_and_not_glued_to_the_next(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(0, {"loss": 2.0})
  with open(tmp_path / metrics.METRICS_FILE, "a") as f:
    f.write('{"step": 1, "lo')  # A crash mid-write.
  assert metrics.read_metrics(tmp_path) == [{"step": 0, "loss": 2.0}]
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"loss": 1.0})
  assert metrics.read_metrics(tmp_path) == [{"step": 0, "loss": 2.0}, {"step": 1, "loss": 1.0}]


def test_non_finite_values_round_trip(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(0, {"loss": float("nan"), "kl": float("inf")})
  (record,) = metrics.read_metrics(tmp_path)
  assert np.isnan(record["loss"]) and record["kl"] == float("inf")


def test_step_is_a_reserved_name(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    with pytest.raises(ValueError, match="step"):
      writer.write(0, {"step": 1.0})


def test_other_processes_write_nothing(tmp_path):
  with metrics.MetricsWriter(tmp_path, process_index=1) as writer:
    writer.write(0, {"loss": 1.0})
    writer.write_text(0, "tag", "text")
  assert os.listdir(tmp_path) == []
  assert metrics.read_metrics(tmp_path) == []


def test_progress_prints_one_line_every_n_iterations_when_not_a_terminal():
  stream = io.StringIO()  # isatty() is False, as for a log file.
  with metrics.ProgressBar(total=10, stream=stream, log_every=4) as bar:
    for iteration in range(1, 11):
      bar.update(iteration, {"success": 0.5, "loss": 1.23456})
  lines = stream.getvalue().splitlines()
  # The first update, every 4th iteration, and the last one.
  assert [line.split()[1] for line in lines] == ["1/10", "4/10", "8/10", "10/10"]
  assert "\r" not in stream.getvalue()
  assert lines[-1].startswith("iteration 10/10 (100%)")
  assert lines[-1].endswith("success=0.5 loss=1.23")


def test_progress_resumed_counts_from_initial():
  stream = io.StringIO()
  bar = metrics.ProgressBar(total=100, initial=60, stream=stream, log_every=20)
  for iteration in range(61, 101):
    bar.update(iteration)
  bar.close()
  assert [line.split()[1] for line in stream.getvalue().splitlines()] == [
      "61/100", "80/100", "100/100"]


def test_progress_forced_bar_uses_tqdm():
  stream = io.StringIO()
  with metrics.ProgressBar(total=5, stream=stream, force_bar=True) as bar:
    for iteration in range(1, 6):
      bar.update(iteration, {"loss": 0.5})
  out = stream.getvalue()
  assert "5/5" in out and "loss=0.5" in out and "\r" in out


def test_progress_disabled_prints_nothing():
  stream = io.StringIO()
  with metrics.ProgressBar(total=5, stream=stream, enabled=False) as bar:
    bar.update(5, {"loss": 0.5})
  assert stream.getvalue() == ""


def test_object_store_workdir_is_rewritten_whole_and_resumes(tmp_path, monkeypatch):
  # An object store cannot append; the writer uploads the whole record each time. Exercised on
  # a local directory through the same epath calls a gs:// workdir goes through.
  monkeypatch.setattr(files, "is_remote", lambda path: True)
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(1, {"a": 1.0})
    assert metrics.read_metrics(tmp_path) == [{"step": 1, "a": 1.0}]
    writer.write(2, {"a": 2.0})
  with metrics.MetricsWriter(tmp_path) as writer:  # a resumed run keeps the earlier records
    writer.write(3, {"a": 3.0})
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [1, 2, 3]
  assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_config_files_go_through_the_object_store_path(tmp_path, monkeypatch):
  monkeypatch.setattr(files, "is_remote", lambda path: True)
  path = metrics.write_config(tmp_path / "nested")
  assert os.path.exists(path) and not [p for p in os.listdir(tmp_path / "nested") if ".tmp" in p]
