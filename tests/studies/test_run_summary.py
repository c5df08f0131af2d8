"""Tests of the per-run summary: counts, intervals and changes read from a workdir."""

import json
import subprocess
import sys

import pytest

from agentrl_jax.studies import binomial
from agentrl_jax.studies import run_summary

CONFIG = """# Parameters for configs.EvalConfig:
configs.EvalConfig.num_tasks = 200
configs.EvalConfig.pass_k = 0
# Parameters for configs.TrainConfig:
configs.TrainConfig.num_iterations = 16
"""


def _workdir(tmp_path, rows):
  (tmp_path / "config.gin").write_text(CONFIG)
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return tmp_path


ROWS = [
    {"step": 0, "eval/greedy_success_before": 0.0, "eval/invalid_action_rate_before": 0.0},
    {"step": 1, "train/success": 0.25, "loss/entropy": 0.9, "time/iteration_s": 100.0},
    {"step": 2, "train/success": 0.5, "loss/entropy": 0.8},
    {"step": 2, "eval/greedy_success": 0.38499999046325684, "eval/mean_turns": 4.0,
     "eval/invalid_action_rate": 0.01},
]


def test_summary_counts_intervals_and_change_from_the_untrained_policy(tmp_path):
  summary = run_summary.summarize_workdir(_workdir(tmp_path, ROWS))
  assert summary["held_out_tasks"] == 200 and summary["planned_iterations"] == 16
  assert summary["start"]["from"] == "before" and summary["start"]["successes"] == 0
  (last,) = summary["evaluations"]
  assert last["step"] == 2 and last["successes"] == 77
  assert last["interval"] == [round(x, 4) for x in binomial.clopper_pearson(77, 200)]
  assert last["change"] == pytest.approx(0.385)
  low, high = last["change_interval"]
  assert 0 < low < 0.385 < high
  assert [c["step"] for c in summary["train_curve"]] == [1, 2]
  assert summary["iterations_done"] == 2


def test_warm_start_is_the_start_when_the_run_has_one(tmp_path):
  rows = ROWS[:1] + [{"step": 0, "eval/greedy_success_warm_start": 0.5}] + ROWS[1:]
  summary = run_summary.summarize_workdir(_workdir(tmp_path, rows))
  assert summary["start"]["from"] == "warm_start"
  assert summary["evaluations"][0]["change"] == pytest.approx(0.385 - 0.5)


def test_a_rate_that_is_no_count_of_the_tasks_is_an_error(tmp_path):
  rows = [{"step": 3, "eval/greedy_success": 0.1234}]
  with pytest.raises(ValueError, match="not a count out of 200"):
    run_summary.summarize_workdir(_workdir(tmp_path, rows))


def test_command_writes_the_json_and_fails_in_one_line_without_a_run(tmp_path):
  (tmp_path / "run").mkdir()
  workdir = _workdir(tmp_path / "run", ROWS)
  out = tmp_path / "result.json"
  ok = subprocess.run([sys.executable, "experiments/summarize_run.py", f"--workdir={workdir}",
                       "--config=x.gin", f"--out={out}"], capture_output=True, text=True)
  assert ok.returncode == 0, ok.stderr
  assert json.loads(out.read_text())["evaluations"][0]["successes"] == 77
  assert "step 2: 0.385" in ok.stdout
  bad = subprocess.run([sys.executable, "experiments/summarize_run.py",
                        f"--workdir={tmp_path / 'missing'}", "--config=x.gin",
                        f"--out={tmp_path / 'x.json'}"], capture_output=True, text=True)
  assert bad.returncode == 2 and bad.stderr.startswith("error:")
  assert len(bad.stderr.strip().splitlines()) == 1
