"""The credit benchmark notebook's analysis covers the whole results file, whatever one launch ran."""

import json

import numpy as np

from agentrl_jax.studies import credit_comparison as cc


def _finished_run(setting, method, seed, spec):
  n = spec.num_iterations
  success = np.linspace(0.2, 1.0, n) if method == "grpo" else np.linspace(0.2, 0.9, n)
  success[0] = 0.2  # every method's first batch is the same sample
  return cc.RunResult(method=method, env=setting, seed=seed, success=success,
                      invalid_action_rate=np.zeros(n), repeated_action_rate=np.zeros(n),
                      eval_success=0.5 + 0.01 * seed, grad_norm=np.ones(n))


def test_a_launch_on_one_setting_rewrites_the_table_with_every_finished_setting(
    tmp_path, launch_notebook):
  settings = ("dd_chain_t32_m2", "dd_chain_t32_m4")
  runs = [_finished_run(s, m, seed, cc.benchmark_spec(s)) for s in settings
          for m in ("grpo", "gigpo") for seed in cc.benchmark_seeds(s)]
  runs = runs[:-1]  # m4's GiGPO misses a seed: unfinished, so not analysed
  path = tmp_path / "results" / "credit_benchmark.json"
  cc.merge_results_file(str(path), runs,
                        {s: cc.spec_record(cc.benchmark_spec(s)) for s in settings})
  result = launch_notebook("credit_comparison", STUDY_SET="benchmark", STUDY_SETTINGS=settings[0],
                           STUDY_ANALYSE_ONLY="1")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "all checks passed" in result.stdout
  table = (tmp_path / "results" / "credit_benchmark.md").read_text()
  rows = {tuple(cell.strip() for cell in line.split("|")[1:3])
          for line in table.splitlines() if line.startswith("| dd_chain")}
  assert rows == {("dd_chain_t32_m2", "grpo"), ("dd_chain_t32_m2", "gigpo"),
                  ("dd_chain_t32_m4", "grpo")}, table
  payload = json.loads(path.read_text())
  compared = {(c["env"], c["method"]) for c in payload["against_grpo"]}
  assert compared == {("dd_chain_t32_m2", "gigpo")}
  assert payload["plan"] == {"dd_chain_t32_m2": ["grpo", "gigpo"], "dd_chain_t32_m4": ["grpo"]}
  assert len(payload["runs"]) == len(runs)  # the unfinished setting's runs are kept


def test_a_seed_outside_the_chosen_settings_stops_before_any_run(tmp_path, launch_notebook):
  result = launch_notebook("credit_comparison", STUDY_SET="benchmark",
                           STUDY_SETTINGS="frozenlake_6x6", STUDY_SEEDS="4,7")
  assert result.returncode != 0
  assert "STUDY_SEEDS='4,7' must name seeds of every chosen setting" in result.stderr
  assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("frozenlake*"))
