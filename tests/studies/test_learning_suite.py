"""The learning suite's bookkeeping: reading a run's metrics, intervals over seeds, resuming."""

import json
import math
import subprocess
import threading
import time

import gin
import jax
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import preemption
from agentrl_jax.studies import learning_suite as ls


def write_metrics(workdir, rows):
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_rows(before, warm, curve):
  rows = [{"step": 0, "eval/greedy_success_before": before}]
  if warm is not None:
    rows.append({"step": 0, "eval/greedy_success_warm_start": warm})
  for it in range(1, curve[-1][0] + 1):
    row = {"step": it, "train/success": 0.5}
    row.update({"eval/greedy_success": s for i, s in curve if i == it})
    rows.append(row)
  return rows


def test_read_run_takes_the_last_evaluation_not_the_best(tmp_path):
  write_metrics(tmp_path, run_rows(0.1, 0.5, [(5, 0.9), (10, 0.7)]))
  got = ls.read_run(tmp_path)
  assert (got["before"], got["warm_start"], got["after"], got["iterations"]) == (0.1, 0.5, 0.7, 10)
  assert got["curve"] == [[0, 0.5], [5, 0.9], [10, 0.7]]


def test_read_run_without_warm_start_starts_the_curve_untrained(tmp_path):
  write_metrics(tmp_path, run_rows(0.2, None, [(4, 0.6)]))
  got = ls.read_run(tmp_path)
  assert got["warm_start"] is None and got["curve"] == [[0, 0.2], [4, 0.6]]


def test_read_run_refuses_an_unfinished_run(tmp_path):
  write_metrics(tmp_path, [{"step": 0, "eval/greedy_success_before": 0.1}, {"step": 1}])
  with pytest.raises(ValueError, match="no evaluation"):
    ls.read_run(tmp_path)


def fake_result(env, seed, before, warm, after):
  return {"env": env, "seed": seed, "before": before, "warm_start": warm, "after": after,
          "curve": [[0, warm if warm is not None else before], [10, after]], "iterations": 10,
          "gin_file": f"{env}.gin", "bindings": [], "wall_s": 1.0}


def test_summary_intervals_match_the_t_formula_and_the_goals():
  after = [0.80, 0.84, 0.86]
  results = [fake_result("a", s, 0.0, 0.6 + 0.01 * s, a) for s, a in enumerate(after)]
  results += [fake_result("b", s, 0.3, None, 0.3 + 0.01 * s) for s in range(3)]
  summary = ls.summarize(results)
  got = summary["a"]["after_rl"]
  half = 4.302653 * np.std(after, ddof=1) / np.sqrt(3)  # t_{0.975, 2}
  assert got["mean"] == pytest.approx(np.mean(after))
  assert (got["low"], got["high"]) == pytest.approx((np.mean(after) - half, np.mean(after) + half),
                                                    abs=1e-5)
  assert summary["a"]["rl_above_untrained"] and summary["a"]["rl_above_start"]
  assert summary["b"]["warm_start"] is None
  assert not summary["b"]["rl_above_start"]  # 0.30..0.32 against an untrained 0.3
  assert summary["a"]["curve"]["mean"][-1] == pytest.approx(np.mean(after))
  assert "| a | 3 |" in ls.table(summary) and "| b | 3 | 0.300" in ls.table(summary)


def test_rl_gain_pairs_each_seed_with_its_own_start():
  # Clones that differ by seed (0.3, 0.6, 0.9) and RL adding 0.02, 0.03, 0.04: the intervals of
  # the warm start and after RL overlap, the paired gain excludes zero.
  results = [fake_result("a", s, 0.0, 0.3 * (s + 1), 0.3 * (s + 1) + 0.02 + 0.01 * s)
             for s in range(3)]
  results += [fake_result("b", s, 0.1 * s, None, 0.1 * s + 0.5) for s in range(3)]
  summary = ls.summarize(results)
  gain = summary["a"]["rl_gain"]
  half = 4.302653 * 0.01 / np.sqrt(3)
  assert gain["mean"] == pytest.approx(0.03)
  assert (gain["low"], gain["high"]) == pytest.approx((0.03 - half, 0.03 + half), abs=1e-5)
  assert not summary["a"]["rl_above_start"]
  assert summary["b"]["rl_gain"]["mean"] == pytest.approx(0.5)  # no warm start: from untrained
  assert ls.summarize(results[:1])["a"]["rl_gain"] is None
  assert "+0.030 [" in ls.table(summary)


def test_method_rows_pair_with_the_grpo_row_of_their_budget():
  results = [fake_result("frozenlake", s, 0.0, 0.6, 0.80 + 0.01 * s) for s in range(3)]
  results += [fake_result("c3_frozenlake", s, 0.0, 0.6, 0.85 + 0.03 * s) for s in range(3)]
  # Another budget: no GRPO row ends where it ends, so no pairing.
  results += [dict(fake_result("drift_frozenlake", s, 0.0, 0.6, 0.5), curve=[[0, 0.6], [30, 0.5]])
              for s in range(3)]
  results += [fake_result("terminal", s, 0.0, 0.8, 0.7) for s in range(2)]
  results += [fake_result("t1_terminal", s, 0.0, 0.8, 0.75 + 0.05 * s) for s in range(3)]
  for r in results:
    r["gin_file"] = "quickstart.gin" if r["env"] == "frozenlake" else r["gin_file"]
  summary = ls.summarize(results)
  got = summary["c3_frozenlake"]["against_grpo"]
  diffs = np.array([0.05, 0.07, 0.09])
  half = 4.302653 * np.std(diffs, ddof=1) / np.sqrt(3)
  assert (got["baseline"], got["n"]) == ("frozenlake", 3)
  assert (got["mean"], got["low"], got["high"]) == pytest.approx(
      (0.07, 0.07 - half, 0.07 + half), abs=1e-5)
  assert summary["drift_frozenlake"]["against_grpo"] is None
  assert summary["frozenlake"]["against_grpo"] is None  # the baseline itself
  # Paired over the seeds both rows have (terminal has two).
  assert summary["t1_terminal"]["against_grpo"]["n"] == 2
  assert summary["t1_terminal"]["against_grpo"]["mean"] == pytest.approx(0.075)
  assert "+0.070 [" in ls.table(summary) and "vs frozenlake |" in ls.table(summary)


def test_a_sampling_variant_pairs_with_its_env_row_on_the_same_clones():
  results = [fake_result("negotiation", s, 0.0, 0.3 + 0.1 * s, 0.3 + 0.1 * s) for s in range(3)]
  results += [fake_result("negotiation_sharp", s, 0.0, 0.3 + 0.1 * s, 0.45 + 0.1 * s)
              for s in range(3)]
  summary = ls.summarize(results)
  got = summary["negotiation_sharp"]["against_grpo"]
  assert (got["baseline"], got["measure"], got["n"]) == ("negotiation", "after_rl", 3)
  assert got["mean"] == pytest.approx(0.15)
  assert summary["negotiation"]["against_grpo"] is None


def test_one_seed_has_no_interval_and_writes_valid_json():
  got = ls.interval([0.4])
  assert (got["mean"], got["low"], got["high"], got["n"]) == (0.4, None, None, 1)
  summary = ls.summarize([fake_result("a", 0, 0.1, None, 0.4)])
  json.dumps(summary, allow_nan=False)  # raises on NaN
  assert "| a | 1 | 0.100 (one seed) | — | 0.400 (one seed) |" in ls.table(summary)


def test_intervals_are_clipped_to_success_rates():
  got = ls.interval([0.0, 1.0])
  assert got["low"] == 0.0 and got["high"] == 1.0 and got["mean"] == 0.5


def test_a_finished_run_is_read_back_not_relaunched(tmp_path):
  spec = ls.EnvRun(env="frozenlake", gin_file="no_such_file.gin")
  workdir = ls.workdir_of(tmp_path, "frozenlake", 3)
  workdir.mkdir(parents=True)
  saved = fake_result("frozenlake", 3, 0.0, 0.5, 0.75)
  (workdir / ls.RESULT_FILE).write_text(json.dumps(saved))
  assert ls.run_one(spec, 3, tmp_path) == saved


def test_a_failed_launch_names_its_log(tmp_path):
  spec = ls.EnvRun(env="frozenlake", gin_file="no_such_file.gin")
  with pytest.raises(RuntimeError, match="suite_log.txt"):
    ls.run_one(spec, 0, tmp_path)
  assert "no_such_file.gin" in (ls.workdir_of(tmp_path, "frozenlake", 0) / "suite_log.txt").read_text()


def test_a_stopped_run_is_logged_and_left_for_the_next_pass(tmp_path, monkeypatch):
  def stopped_at_30_of_60(spec, seed, workdir, argv, runs_dir):
    write_metrics(workdir, run_rows(0.0, 0.7, [(15, 0.7), (30, 0.7)]))
    (workdir / "operative_config.gin").write_text("configs.TrainConfig.num_iterations = 60\n")
  monkeypatch.setattr(ls, "_launch", stopped_at_30_of_60)
  logged = []
  spec = ls.EnvRun(env="frozenlake", gin_file="quickstart.gin")
  assert ls.run_suite([spec], [0], tmp_path, log=logged.append) == []
  assert "iteration 30 of 60" in logged[0]
  assert not (ls.workdir_of(tmp_path, "frozenlake", 0) / ls.RESULT_FILE).exists()


@pytest.mark.parametrize("parallel", [1, 2])
def test_runs_go_parallel_at_a_time_and_report_in_env_seed_order(tmp_path, monkeypatch, parallel):
  running, most, lock = [0], [0], threading.Lock()
  finish_order = []

  def finishes_later_for_lower_seeds(spec, seed, workdir, argv, runs_dir):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.05 * (3 - seed))  # a lower seed takes longer: finishing order is not job order
    write_metrics(workdir, run_rows(0.0, 0.5, [(10, 0.5 + seed / 10)]))
    (workdir / "operative_config.gin").write_text("configs.TrainConfig.num_iterations = 10\n")
    with lock:
      running[0] -= 1
      finish_order.append((spec.env, seed))
  monkeypatch.setattr(ls, "_launch", finishes_later_for_lower_seeds)
  specs = [ls.EnvRun(env=env, gin_file="quickstart.gin") for env in ("frozenlake", "sokoban")]
  results = ls.run_suite(specs, [0, 1, 2], tmp_path, log=lambda _: None, parallel=parallel)
  jobs = [(env, seed) for env in ("frozenlake", "sokoban") for seed in (0, 1, 2)]
  assert [(r["env"], r["seed"]) for r in results] == jobs
  assert [r["after"] for r in results] == pytest.approx([0.5, 0.6, 0.7] * 2)
  assert most[0] == parallel
  if parallel > 1:
    assert finish_order != jobs


def test_a_parallel_suite_keeps_the_failed_runs_out_and_refuses_a_bad_count(tmp_path, monkeypatch):
  def seed_1_fails(spec, seed, workdir, argv, runs_dir):
    if seed == 1:
      raise RuntimeError(f"{spec.env} seed {seed}: run.py exited with 1")
    write_metrics(workdir, run_rows(0.0, 0.5, [(10, 0.5)]))
    (workdir / "operative_config.gin").write_text("configs.TrainConfig.num_iterations = 10\n")
  monkeypatch.setattr(ls, "_launch", seed_1_fails)
  logged = []
  spec = ls.EnvRun(env="frozenlake", gin_file="quickstart.gin")
  results = ls.run_suite([spec], [0, 1, 2], tmp_path, log=logged.append, parallel=3)
  assert [r["seed"] for r in results] == [0, 2]
  assert [line for line in logged if line.startswith("failed")] == [
      "failed: frozenlake seed 1: run.py exited with 1"]
  for bad in (0, 1.5, "2"):
    with pytest.raises(ValueError, match="parallel must be a positive int"):
      ls.run_suite([spec], [5], tmp_path, parallel=bad)
  assert not ls.workdir_of(tmp_path, "frozenlake", 5).exists()


def test_a_launch_that_exits_stopped_is_named_resumable_not_failed(tmp_path):
  # The status `experiments/run.py` gives a run stopped before its last iteration.
  spec = ls.EnvRun(env="frozenlake", gin_file="quickstart.gin")
  workdir = ls.workdir_of(tmp_path, "frozenlake", 0)
  workdir.mkdir(parents=True)
  stop = ["-c", f"import sys; sys.exit({preemption.EXIT_STOPPED})"]
  with pytest.raises(RuntimeError, match="stopped before its last iteration.*next pass resumes"):
    ls._launch(spec, 0, workdir, stop, tmp_path)
  with pytest.raises(RuntimeError, match="exited with 3; see .*suite_log.txt"):
    ls._launch(spec, 0, workdir, ["-c", "import sys; sys.exit(3)"], tmp_path)


def test_runs_share_one_compilation_cache_unless_the_caller_names_one(tmp_path, monkeypatch):
  env = ls.launch_environment(tmp_path, {"PATH": "/bin"})
  assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax_cache")
  assert env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0" and env["PATH"] == "/bin"
  assert ls.launch_environment(tmp_path, {"JAX_COMPILATION_CACHE_DIR": "/elsewhere"})[
      "JAX_COMPILATION_CACHE_DIR"] == "/elsewhere"
  # What a launched process sees: its prepare step prints the variable into the run's log.
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  spec = ls.EnvRun(env="frozenlake", gin_file="no_such_file.gin", prepare=(
      "-c", "import os; print('cache at', os.environ['JAX_COMPILATION_CACHE_DIR'])"))
  with pytest.raises(RuntimeError):  # the run itself fails on the missing gin file
    ls.run_one(spec, 0, tmp_path)
  log = (ls.workdir_of(tmp_path, "frozenlake", 0) / "suite_log.txt").read_text()
  assert f"cache at {tmp_path / 'jax_cache'}" in log


def test_every_full_size_config_exists_and_every_method_config_is_in_the_suite():
  for spec in (spec for specs in ls.SETS.values() for spec in specs):
    assert (ls.CONFIGS / spec.gin_file).is_file(), spec
  env_configs = {s.gin_file for s in ls.FULL} | {"quickstart.gin", "hf_tiny_qwen2_grpo.gin"}
  # Plain GRPO on an env: the tiny model's *_grpo.gin and the pretrained model's smollm2_*.gin.
  env_configs |= {p.name for p in ls.CONFIGS.glob("*_grpo.gin")}
  env_configs |= {p.name for p in ls.CONFIGS.glob("smollm2_*.gin")}
  methods = {p.name for p in ls.CONFIGS.glob("*.gin")} - env_configs
  assert methods <= {s.gin_file for s in ls.METHODS}, methods - {s.gin_file for s in ls.METHODS}


def test_restored_runs_are_read_back_and_finished_ones_kept(tmp_path):
  recorded = [{"env": "terminal", "seed": 1, "before": 0.0, "warm_start": 0.8, "after": 0.75,
               "curve": [[0, 0.8], [30, 0.75]], "wall_s": 600.0},
              {"env": "terminal", "seed": 2, "before": 0.0, "warm_start": 0.5, "after": 0.5,
               "curve": [[0, 0.5], [30, 0.5]], "wall_s": 500.0}]
  finished = ls.workdir_of(tmp_path, "terminal", 2) / ls.RESULT_FILE
  finished.parent.mkdir(parents=True)
  finished.write_text(json.dumps({**recorded[1], "after": 0.9}))
  assert ls.restore_runs(recorded, tmp_path) == 1
  spec = ls.EnvRun(env="terminal", gin_file="terminal_grpo.gin")
  # Nothing is launched: both come back from their directories, the local one unchanged.
  assert ls.run_one(spec, 1, tmp_path)["after"] == 0.75
  assert ls.run_one(spec, 2, tmp_path)["after"] == 0.9


def test_rows_whose_warm_starts_differ_compare_rl_gains():
  # Same config but clones that did not reproduce (0.60 vs 0.70 on seed 0): the after-RL gap
  # (+0.10 on seed 0) would be the clones' gap; the RL gains (+0.02 and +0.02) are equal.
  results = [fake_result("search_qa", s, 0.0, 0.6, 0.62 + 0.01 * s) for s in range(3)]
  results += [fake_result("gca_search_qa", s, 0.0, 0.6 + 0.1 * (s == 0), 0.62 + 0.01 * s
                          + 0.1 * (s == 0)) for s in range(3)]
  summary = ls.summarize(results)
  got = summary["gca_search_qa"]["against_grpo"]
  assert (got["measure"], got["warm_starts_differ"]) == ("rl_gain", [0])
  assert got["mean"] == pytest.approx(0.0, abs=1e-9)
  assert "warm starts differ" in ls.table(summary)
  # Equal clones: the plain after-RL difference, nothing flagged.
  same = ls.summarize(results[:3] + [fake_result("gca_search_qa", s, 0.0, 0.6, 0.65 + 0.01 * s)
                                      for s in range(3)])["gca_search_qa"]["against_grpo"]
  assert (same["measure"], same["warm_starts_differ"]) == ("after_rl", [])
  assert same["mean"] == pytest.approx(0.03)


def test_code_version_names_the_checkout_commit_and_the_numeric_packages():
  got = ls.code_version()
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ls.REPO, capture_output=True,
                        text=True, check=False)
  if head.returncode == 0:
    assert got["commit"] == head.stdout.strip() and isinstance(got["dirty"], bool)
  else:
    assert got["commit"] is None and got["dirty"] is None
  assert got["packages"]["jax"] == jax.__version__ and got["packages"]["numpy"] == np.__version__


@pytest.mark.parametrize("set_name", sorted(ls.SETS))
def test_every_runs_bindings_parse_against_its_config(set_name, tmp_path):
  # A misspelt binding would otherwise surface only when that run is launched, minutes in.
  for spec in ls.SETS[set_name]:
    argv = spec.argv(0, str(tmp_path))
    files = [a.removeprefix("--gin_file=") for a in argv if a.startswith("--gin_file=")]
    bindings = [a.removeprefix("--gin_bindings=") for a in argv if a.startswith("--gin_bindings=")]
    gin.clear_config()
    try:
      config_errors.parse_config(files, bindings,
                                 default_imports=("from agentrl_jax.learner import learner",))
    finally:
      gin.clear_config()


def test_read_run_records_the_held_out_task_count(tmp_path):
  write_metrics(tmp_path, run_rows(0.0, 0.4, [(5, 0.5)]))
  assert ls.read_run(tmp_path)["num_tasks"] is None
  (tmp_path / "operative_config.gin").write_text(
      "configs.EvalConfig.every = 15\nconfigs.EvalConfig.num_tasks = 200\n")
  assert ls.read_run(tmp_path)["num_tasks"] == 200


def test_read_run_refuses_a_run_stopped_before_its_last_iteration(tmp_path):
  # SIGTERM stops a run cleanly at an iteration boundary: its last evaluation is at 30 of 60.
  write_metrics(tmp_path, run_rows(0.0, 0.695, [(15, 0.695), (30, 0.695)]))
  (tmp_path / "operative_config.gin").write_text("configs.TrainConfig.num_iterations = 60\n")
  with pytest.raises(ValueError, match="iteration 30 of 60"):
    ls.read_run(tmp_path)
  write_metrics(tmp_path, run_rows(0.0, 0.695, [(15, 0.695), (30, 0.695), (60, 0.7)]))
  assert ls.read_run(tmp_path)["after"] == 0.7


def test_a_one_clone_row_measures_its_start_over_the_tasks_not_the_seeds():
  # Every seed starts from the clone at 81 / 200; the seeds' spread of the start is zero.
  results = [{**fake_result("one", s, 0.0, 0.405, a), "num_tasks": 200,
              "bindings": ["configs.TrainConfig.init_seed = 0"]}
             for s, a in enumerate([0.50, 0.52, 0.49, 0.51])]
  summary = ls.summarize(results)["one"]
  low, high = summary["warm_start"]["low"], summary["warm_start"]["high"]
  # The exact interval holds 81 at both ends' tail probability 2.5%.
  n, k = 200, 81
  pmf = lambda i, p: math.comb(n, i) * p**i * (1 - p) ** (n - i)
  assert sum(pmf(i, low) for i in range(k, n + 1)) == pytest.approx(0.025, abs=1e-6)
  assert sum(pmf(i, high) for i in range(k + 1)) == pytest.approx(0.025, abs=1e-6)
  assert summary["one_clone"] and summary["rl_above_start"] == (summary["after_rl"]["low"] > high)
  assert "over its 200 held-out tasks" in ls.table(ls.summarize(results))
  # Without the binding the same figures are an ordinary row: the start's interval is over seeds.
  plain = ls.summarize([{**r, "bindings": []} for r in results])["one"]
  assert not plain["one_clone"] and plain["warm_start"]["low"] == pytest.approx(0.405)
  with pytest.raises(ValueError, match="without num_tasks"):
    ls.summarize([{**r, "num_tasks": None} for r in results])
