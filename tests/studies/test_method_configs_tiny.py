"""Every method config that no other test launches, at tiny size through the learning suite's
own launch (`learning_suite.run_one`): its gin switch runs end to end, DeltaTTG's meter included."""

import json
import math

import pytest

from agentrl_jax.studies import learning_suite as ls

# The method configs the strategy, driver-method and offline end-to-end tests do not launch.
UNLAUNCHED = ("curiosity_frozenlake", "c3_frozenlake", "deltattg_frozenlake", "pearl_frozenlake",
              "dr_grpo_frozenlake", "gagpo_frozenlake", "gca_search_qa", "t1_terminal",
              "progress_sql", "socialrl_dialogue", "textworld_express_coin_charge")
SPECS = {s.env: s for s in ls.METHODS}


# Dr.GRPO's and GAGPO's configs only choose an estimator, an aggregation and a ratio level, which
# tests/learner/test_micro_batches.py runs through the learner in the default suite; their own
# launches (and the learning suite's rows) are under -m slow.
THROUGH_THE_LEARNER_ELSEWHERE = ("dr_grpo_frozenlake", "gagpo_frozenlake")


@pytest.mark.integration
@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.slow) if n in THROUGH_THE_LEARNER_ELSEWHERE else n
    for n in UNLAUNCHED])
def test_method_config_runs_at_tiny_size(tmp_path, name):
  result = ls.run_one(ls.tiny(SPECS[name]), 0, tmp_path)
  assert result["iterations"] == 1 and 0.0 <= result["after"] <= 1.0
  workdir = ls.workdir_of(tmp_path, name, 0)
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in rows if "loss/policy" in r]
  assert len(train) == 1 and math.isfinite(train[0]["loss/policy"])
  # TITO: the learner's log-probs of the kept tokens equal the sampler's.
  assert train[0]["rollout/logprob_drift"] < 1e-4
  if name == "deltattg_frozenlake":  # the meter came from the suite's command, in the run's dir
    assert (workdir / "meter.npz").is_file()
    assert str(workdir / "meter.npz") in (workdir / "operative_config.gin").read_text()
