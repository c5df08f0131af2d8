"""metrics.jsonl holds exactly one record per iteration however often the run is killed.

Each "launch" below plays what the driver does: rewind the record to the checkpoint it restored
(None when there is none), then write every iteration from there, checkpointing every K. A kill
is a launch that stops at a random iteration, possibly with half a line written.
"""

import json
import random

import pytest

from agentrl_jax import files
from agentrl_jax.learner import metrics

ITERATIONS = 40
CHECKPOINT_EVERY = 3


def _launch(workdir, checkpoints, stop_at, *, torn=False):
  """One launch; `checkpoints` is the list of saved steps (a stand-in for the checkpoint dir)."""
  restored = checkpoints[-1] if checkpoints else None
  with metrics.MetricsWriter(workdir) as writer:
    writer.rewind(restored)
    start = 0 if restored is None else restored
    if restored is None:
      writer.write(0, {"eval/greedy_success_before": 0.0})
    for done in range(start + 1, stop_at + 1):
      writer.write(done, {"loss": 1.0 / done, "launch": len(checkpoints)})
      if done % CHECKPOINT_EVERY == 0 or done == ITERATIONS:
        checkpoints.append(done)
  if torn:
    with open(workdir / metrics.METRICS_FILE, "a") as f:
      f.write('{"step": 99, "lo')  # killed mid-write


@pytest.mark.parametrize("seed", range(5))
def test_one_record_per_iteration_after_random_kills(tmp_path, seed):
  rng = random.Random(seed)
  checkpoints = []
  for _ in range(rng.randint(1, 12)):
    _launch(tmp_path, checkpoints, rng.randint(0, ITERATIONS - 1), torn=rng.random() < 0.5)
  _launch(tmp_path, checkpoints, ITERATIONS)
  steps = [r["step"] for r in metrics.read_metrics(tmp_path)]
  assert steps == list(range(ITERATIONS + 1)), steps


def test_rewind_drops_later_steps_and_keeps_earlier_ones(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    for step in range(6):
      writer.write(step, {"x": float(step)})
  with metrics.MetricsWriter(tmp_path) as writer:
    assert writer.rewind(3) == 2
    writer.write(4, {"x": 40.0})
  assert [(r["step"], r["x"]) for r in metrics.read_metrics(tmp_path)] == [
      (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_rewind_to_none_drops_everything(tmp_path):
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.write(0, {"x": 1.0})
  with metrics.MetricsWriter(tmp_path) as writer:
    assert writer.rewind(None) == 1
  assert metrics.read_metrics(tmp_path) == []


def test_rewind_on_an_object_store_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(files, "is_remote", lambda path: True)
  with metrics.MetricsWriter(tmp_path) as writer:
    for step in range(4):
      writer.write(step, {"x": 1.0})
  with metrics.MetricsWriter(tmp_path) as writer:
    writer.rewind(1)
    writer.write(2, {"x": 2.0})
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [0, 1, 2]


def test_rewind_off_process_0_touches_nothing(tmp_path):
  (tmp_path / metrics.METRICS_FILE).write_text(json.dumps({"step": 5, "x": 1.0}) + "\n")
  with metrics.MetricsWriter(tmp_path, process_index=1) as writer:
    assert writer.rewind(None) == 0
  assert len(metrics.read_metrics(tmp_path)) == 1
