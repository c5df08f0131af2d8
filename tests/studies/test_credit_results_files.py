"""The committed credit-study tables are what their results JSON gives (notebooks/results)."""

import json
import pathlib

import numpy as np
import pytest

from agentrl_jax.studies import credit_comparison as cc

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "results"


def _planned_runs(payload):
  """The runs of the file's plan (a file may also hold runs of settings still in progress)."""
  plan = payload["plan"]
  envs = list(plan)
  runs = [r for r in payload["runs"] if r["env"] in plan and r["method"] in plan[r["env"]]]
  # In the plan's order, as the notebook trains and tabulates them.
  runs.sort(key=lambda r: (envs.index(r["env"]), plan[r["env"]].index(r["method"]), r["seed"]))
  return [cc.result_from_record(r) for r in runs]


@pytest.mark.parametrize("name", ["credit_comparison", "credit_benchmark"])
def test_table_is_regenerated_from_the_results_json(name):
  payload = json.loads((RESULTS / f"{name}.json").read_text())
  runs = _planned_runs(payload)
  table = cc.results_table(cc.summarize(runs))
  assert (RESULTS / f"{name}.md").read_text().strip() == table


def test_benchmark_comparisons_are_recomputed_from_its_runs():
  payload = json.loads((RESULTS / "credit_benchmark.json").read_text())
  runs = _planned_runs(payload)
  recorded = {(c["method"], c["env"], c["statistic"]): c for c in payload["against_grpo"]}
  recomputed = [c for statistic in cc.STATISTICS
                for c in cc.against_baseline(runs, statistic=statistic)]
  assert {(c.method, c.env, c.statistic) for c in recomputed} == set(recorded)
  for c in recomputed:
    want = recorded[c.method, c.env, c.statistic]
    np.testing.assert_allclose([c.difference, c.p_value, c.paired_p_value],
                               [want["difference"], want["p_value"], want["paired_p_value"]],
                               rtol=1e-12, atol=1e-12)
    assert c.num_seeds == want["num_seeds"] >= 5
