"""Tests for agentrl_jax.studies.credit_comparison (the plumbing; training itself runs in the
notebook, whose SMALL execution tests/notebooks runs)."""

import dataclasses
import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.credit import c3
from agentrl_jax.credit import decision_gate
from agentrl_jax.credit import deltattg
from agentrl_jax.learner import configs
from agentrl_jax.learner import step
from agentrl_jax.rollout import loop
from agentrl_jax.studies import credit_comparison as cc
from agentrl_jax.viewer import report

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"


def _batch():
  # Two episodes, three turns, one token per action:
  #   row 0 actions [5, 5, 7] -> one repeat among two followers; all valid.
  #   row 1 actions [7, 7] (two turns) -> one repeat among one follower; turn 1 invalid.
  # repeated = 2/3, invalid = 1/5, success = 1/2.
  traj = types.empty_trajectories(batch_size=2, max_len=4, max_turns=3)
  traj = traj.replace(
      tokens=np.array([[5, 5, 7, 0], [7, 7, 0, 0]], np.int32),
      turn_mask=np.array([[1, 1, 1], [1, 1, 0]], bool),
      action_valid=np.array([[1, 1, 1], [1, 0, 0]], bool),
      turn_start=np.array([[0, 1, 2], [0, 1, 0]], np.int32),
      turn_end=np.array([[1, 2, 3], [1, 2, 0]], np.int32),
      success=np.array([True, False]))
  return traj


def test_probe_records_action_rates_under_jit_and_changes_nothing():
  traj = _batch()
  probe = cc.ActionRateProbe()
  out = jax.jit(probe)(jax.tree.map(jax.numpy.asarray, traj))
  jax.effects_barrier()
  assert len(probe.records) == 1
  np.testing.assert_allclose(
      [probe.records[0][k] for k in ("success", "repeated_action_rate", "invalid_action_rate")],
      [0.5, 2 / 3, 1 / 5])
  assert probe.records[0] == report.action_rates(traj)
  for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(traj)):
    np.testing.assert_array_equal(got, want)


def test_methods_cover_the_issue_and_validate():
  names = [m.name for m in cc.METHODS]
  assert names == ["grpo", "dr_grpo", "rloo", "gigpo", "gagpo", "mt_grpo", "ppo_gae", "ppo_turn_gae",
                   "ppo_turn_gae_l95", "grpo_curiosity", "grpo_oracle_turn", "grpo_c3",
                   "grpo_deltattg"]
  with pytest.raises(ValueError, match="use_critic"):
    cc.Method(name="ppo", estimator="gae")
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    cc.Method(name="x", estimator="nope")
  with pytest.raises(ValueError, match="group_size"):
    cc.ComparisonSpec(group_size=1)


def test_train_kwargs():
  spec = cc.ComparisonSpec(num_iterations=3, tasks_per_iteration=2, group_size=4, d_model=32)
  ppo = next(m for m in cc.METHODS if m.name == "ppo_gae")
  kwargs = cc.train_kwargs(ppo, "dd_chain", 7, spec)
  config = kwargs["config"]
  assert (config.estimator, config.use_critic, config.seed, config.num_iterations) == (
      "gae", True, 7, 3)
  assert config.env_kwargs == {"horizon": 8, "num_decisions": 2, "noise_std": 0.0}
  assert kwargs["rollout"].max_turns == 8 and kwargs["model"].d_model == 32
  assert kwargs["warm_start"].iterations == 0
  with pytest.raises(ValueError, match="unknown env"):
    cc.train_kwargs(ppo, "chess", 0, spec)


def test_estimator_kwargs_are_bound_and_checked():
  spec = cc.ComparisonSpec(num_iterations=3, tasks_per_iteration=2, group_size=4, d_model=32)
  method = next(m for m in cc.METHODS if m.name == "ppo_turn_gae_l95")
  estimator = cc.train_kwargs(method, "dd_chain", 0, spec)["config"].estimator
  resolved = estimators.resolve(estimator)
  assert (resolved.name, resolved.needs_critic, estimator.keywords) == (
      "turn_gae", True, {"lambda_": 0.95})
  with pytest.raises(ValueError, match=r"estimator_kwargs \['lam'\] are not arguments"):
    cc.Method(name="x", estimator="gae", use_critic=True, estimator_kwargs={"lam": 0.9})


def _result(method, seed, success, eval_success):
  n = len(success)
  return cc.RunResult(method=method, env="dd_chain", seed=seed, success=np.array(success),
                      invalid_action_rate=np.zeros(n), repeated_action_rate=np.full(n, 0.5),
                      eval_success=eval_success)


def test_summarize_and_table():
  runs = [_result("grpo", 0, [0.0, 0.2, 0.4, 0.6], 0.5),
          _result("grpo", 1, [0.0, 0.4, 0.6, 1.0], 0.7),
          _result("rloo", 0, [0.1, 0.1, 0.1, 0.1], 0.0)]
  grpo, rloo = cc.summarize(runs)
  assert (grpo.method, grpo.num_seeds, rloo.num_seeds) == ("grpo", 2, 1)
  np.testing.assert_allclose(grpo.success[0], [0.0, 0.3, 0.5, 0.8])
  # Last quarter of 4 iterations = the last one: [0.6, 1.0] -> mean 0.8, s = √0.08,
  # half-width 12.706·√0.08/√2 = 12.706·0.2 = 2.5412.
  np.testing.assert_allclose(grpo.late_train_success, [0.8, 0.8 - 2.5412, 0.8 + 2.5412],
                             rtol=1e-9)
  np.testing.assert_allclose(grpo.final_eval_success[0], 0.6)
  assert np.isnan(rloo.final_eval_success[1])
  table = cc.results_table([grpo, rloo])
  assert "| dd_chain | grpo | 2 | 0.600 ± 1.271 |" in table
  # rloo: final 0, mean training success 0.1, never at 0.9 (4 iterations -> censored at 5),
  # last quarter 0.1, repeated 0.5, invalid 0.
  assert "| dd_chain | rloo | 1 | 0.000 | 0.100 | 5.000 | 0.100 | 0.500 | 0.000 |" in table
  with pytest.raises(ValueError, match="different lengths"):
    cc.summarize(runs + [_result("rloo", 1, [0.1], 0.0)])


def _loss(name):
  spec = cc.ComparisonSpec(num_iterations=3, tasks_per_iteration=2, group_size=4, d_model=32)
  kwargs = cc.train_kwargs(next(m for m in cc.METHODS if m.name == name), "frozenlake", 0, spec)
  return kwargs["loss"], kwargs["rollout"]


def test_methods_carry_their_corrections():
  by_name = {m.name: m for m in cc.METHODS}
  assert cc.corrections_of(by_name["grpo_c3"]) == [c3.c3]
  assert cc.corrections_of(by_name["grpo_oracle_turn"]) == [decision_gate.oracle_decision_gate]
  assert all(cc.corrections_of(m) == [] for m in cc.METHODS
             if not (m.c3 or m.oracle_gate or m.deltattg))


def test_deltattg_fits_its_meter_in_the_run_directory(tmp_path):
  method = next(m for m in cc.METHODS if m.deltattg)
  assert cc.applies(method, "frozenlake_6x6")
  assert not any(cc.applies(method, s) for s in cc.SETTINGS if s.startswith("dd_chain"))
  path = cc.prepare_meter(tmp_path, "frozenlake", 0, episodes_per_policy=4, steps=2)
  assert path == str(tmp_path / cc.METER_FILE)
  before = (tmp_path / cc.METER_FILE).stat().st_mtime_ns
  cc.prepare_meter(tmp_path, "frozenlake", 0)  # a resumed run keeps the meter it trained with
  assert (tmp_path / cc.METER_FILE).stat().st_mtime_ns == before
  with pytest.raises(ValueError, match="workdir"):
    cc.corrections_of(method)
  [correction] = cc.corrections_of(method, tmp_path)
  assert isinstance(correction, deltattg.DeltaTTG)


def test_methods_carry_their_loss_settings():
  # Dr.GRPO: the per-trajectory token sum over a constant, the rollout's length budget.
  loss, rollout = _loss("dr_grpo")
  assert (loss.agg_mode, loss.max_len_norm, loss.ratio_level) == (
      "seq-mean-token-sum-norm", rollout.max_len, "token")
  # GAGPO: one action-level ratio per turn.
  loss, _ = _loss("gagpo")
  assert (loss.agg_mode, loss.ratio_level) == ("token-mean", "turn")
  # Every method keeps the shared settings it does not override.
  for method in cc.METHODS:
    loss, _ = _loss(method.name)
    assert loss.entropy_coef == 0.01
    if not method.loss_overrides:
      assert (loss.agg_mode, loss.ratio_level, loss.max_len_norm) == ("token-mean", "token", None)
  with pytest.raises(ValueError, match=r"loss_overrides \['agg'\] are not LossConfig fields"):
    cc.Method(name="x", estimator="grpo", loss_overrides={"agg": "token-mean"})
  with pytest.raises(ValueError, match="max_len_norm"):
    cc.Method(name="x", estimator="dr_grpo", loss_overrides={"agg_mode": "seq-mean-token-sum-norm"})
  with pytest.raises(TypeError):
    next(m for m in cc.METHODS if m.name == "gagpo").loss_overrides["ratio_level"] = "token"


@pytest.mark.parametrize("name", ["dr_grpo", "gagpo"])
def test_gin_file_runs_the_studys_method(name):
  # experiments/configs/<name>_frozenlake.gin binds the estimator and the loss settings the
  # study's method trains with (L_max is each setup's own rollout budget).
  gin.clear_config()
  try:
    config_errors.parse_config([str(CONFIGS / f"{name}_frozenlake.gin")], [])
    train = gin.get_configurable(configs.TrainConfig)()
    loss = gin.get_configurable(step.LossConfig)()
    max_len = gin.get_configurable(loop.RolloutConfig)().max_len
  finally:
    gin.clear_config()
  method = next(m for m in cc.METHODS if m.name == name)
  assert estimators.resolve(train.estimator).name == method.estimator
  want, rollout = _loss(name)
  for field in ("agg_mode", "ratio_level", "entropy_coef"):
    assert getattr(loss, field) == getattr(want, field), field
  if want.max_len_norm is not None:
    assert (want.max_len_norm, loss.max_len_norm) == (rollout.max_len, max_len)


def _final(method, env, seed, success):
  return cc.RunResult(method=method, env=env, seed=seed, success=np.zeros(2),
                      invalid_action_rate=np.zeros(2), repeated_action_rate=np.zeros(2),
                      eval_success=success)


def test_against_baseline_is_a_one_sided_mann_whitney_per_setting():
  results = [_final("grpo", "dd_chain", s, v) for s, v in enumerate([0.1, 0.2, 0.3, 0.2, 0.1])]
  results += [_final("gigpo", "dd_chain", s, v) for s, v in enumerate([0.6, 0.7, 0.5, 0.9, 0.8])]
  results += [_final("rloo", "frozenlake", 0, 0.5)]  # no GRPO runs there: not compared
  (got,) = cc.against_baseline(results)
  want = cc.fits.mann_whitney_u(np.array([0.6, 0.7, 0.5, 0.9, 0.8]),
                                np.array([0.1, 0.2, 0.3, 0.2, 0.1]), alternative="greater")
  assert (got.method, got.env, got.num_seeds) == ("gigpo", "dd_chain", 5)
  assert got.p_value == pytest.approx(want.p_value) and got.p_value < 0.01
  assert got.difference == pytest.approx(0.7 - 0.18)


def test_curiosity_and_c3_run_only_where_states_repeat():
  for flag in ("curiosity", "c3"):
    method = next(m for m in cc.METHODS if getattr(m, flag))
    assert cc.applies(method, "frozenlake") and cc.applies(method, "frozenlake_6x6")
    assert not any(cc.applies(method, s) for s in cc.SETTINGS if s.startswith("dd_chain"))
  assert all(cc.applies(m, "dd_chain") for m in cc.METHODS
             if not (m.curiosity or m.c3 or m.deltattg))
  oracle = next(m for m in cc.METHODS if m.oracle_gate)
  assert not cc.applies(oracle, "frozenlake") and not cc.applies(oracle, "frozenlake_6x6")


@pytest.mark.parametrize("name", sorted(cc.SETTINGS))
def test_every_setting_fits_a_whole_episode(name):
  """The longest episode (every turn played) fits the setting's token budget and the model."""
  from agentrl_jax.envs import registry
  from agentrl_jax.models import tokenizer as tokenizer_lib
  setting = cc.SETTINGS[name]
  kwargs = cc.train_kwargs(cc.METHODS[0], name, 0, cc.ComparisonSpec())
  assert kwargs["rollout"].max_turns == setting.max_turns <= kwargs["model"].max_turns
  tok = tokenizer_lib.load_tokenizer(None)
  env = registry.make(setting.env, **setting.env_kwargs)
  text, used = env.reset(0), 0
  for turn in range(setting.max_turns):
    obs = tok.encode(text)
    assert len(obs) + 2 <= max(setting.obs_buckets), (turn, len(obs))
    used += len(obs) + 3  # framing around the observation, one action token
    result = env.step(env.action_words[turn % len(env.action_words) if name.startswith("dd") else 1])
    text = result.observation
    if result.done:
      break
  assert used <= setting.max_len, used


def test_a_finished_run_is_read_back_instead_of_trained_again(tmp_path):
  saved = _final("rloo", "dd_chain", 3, 0.625)
  (tmp_path / cc.RESULT_FILE).write_text(json.dumps(
      {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in saved._asdict().items()}))
  got = cc.run_method(str(tmp_path), method=cc.METHODS[2], env="dd_chain", seed=3,
                      spec=cc.ComparisonSpec())
  assert got.eval_success == 0.625 and got.method == "rloo"
  np.testing.assert_array_equal(got.success, saved.success)


def test_first_gradient_parts_take_the_routine_part_per_seed():
  def run(method, seed, first_norm):
    return cc.RunResult(method=method, env="dd_chain_t32_m4_b8", seed=seed, success=np.zeros(2),
                        invalid_action_rate=np.zeros(2), repeated_action_rate=np.zeros(2),
                        eval_success=1.0, grad_norm=np.array([first_norm, 9.0]))
  results = [run("grpo", 0, 5.0), run("grpo_oracle_turn", 0, 3.0),   # routine part 4
             run("grpo", 1, 1.0), run("grpo_oracle_turn", 1, 2.0),   # gated larger: 0
             run("grpo", 2, 7.0),                                    # no gated run: left out
             _final("grpo", "dd_chain", 0, 1.0), _final("grpo_oracle_turn", "dd_chain", 0, 1.0)]
  (got,) = cc.first_gradient_parts(results)  # dd_chain's runs recorded no norms
  assert got == {"env": "dd_chain_t32_m4_b8", "num_seeds": 2, "every_turn": 3.0, "gated": 2.5,
                 "routine": 2.0}
  # A record written before the field existed reads back without it.
  record = cc.result_record(_final("grpo", "dd_chain", 0, 1.0))
  assert record["grad_norm"] is None
  del record["grad_norm"]
  assert cc.result_from_record(record).grad_norm is None
  assert cc.result_from_record(cc.result_record(results[0])).grad_norm.tolist() == [5.0, 9.0]


def _curve(method, seed, success, eval_success=1.0):
  success = np.asarray(success, float)
  return cc.RunResult(method=method, env="dd_chain_t32_m2", seed=seed, success=success,
                      invalid_action_rate=np.zeros_like(success),
                      repeated_action_rate=np.zeros_like(success), eval_success=eval_success)


def test_iterations_to_threshold_is_the_first_crossing_or_censored():
  # 0.95 >= 0.9 first at index 2 -> iteration 3; never reached in 4 -> 4 + 1.
  assert cc.iterations_to_threshold(np.array([0.1, 0.89, 0.95, 0.5])) == 3
  assert cc.iterations_to_threshold(np.array([0.1, 0.2, 0.3, 0.4])) == 5
  assert cc.iterations_to_threshold(np.array([0.9])) == 1
  # Over a window: the first iteration whose next `window` iterations average >= threshold.
  lucky = np.array([1.0, 0.5, 0.5, 0.8, 1.0, 1.0, 0.9])
  assert cc.iterations_to_threshold(lucky) == 1
  assert cc.iterations_to_threshold(lucky, window=2) == 4
  assert cc.iterations_to_threshold(lucky, window=4) == 4
  assert cc.iterations_to_threshold(lucky[:5], window=2) == 4  # (0.8 + 1) / 2 counts
  assert cc.iterations_to_threshold(lucky[:4], window=2) == 5  # censored: len + 1
  with pytest.raises(ValueError, match="window"):
    cc.iterations_to_threshold(lucky, window=0)
  assert cc.threshold_window("dd_chain_t32_m4") == 1
  assert (cc.threshold_window("dd_chain_t32_m4_b8"), cc.threshold_window("dd_chain_t32_m4_b4")) == (8, 16)
  with pytest.raises(ValueError, match="non-empty curve"):
    cc.iterations_to_threshold(np.zeros((2, 2)))


def test_against_baseline_on_learning_speed():
  # GRPO crosses 0.9 at iteration 4 on every seed, "fast" at iteration 2: fewer iterations is
  # better, so the one-sided test is "less"; both end solved, so final success ties.
  slow = [0.1, 0.5, 0.8, 0.95, 1.0]
  fast = [0.3, 0.92, 1.0, 1.0, 1.0]
  results = [_curve("grpo", s, slow) for s in range(5)]
  results += [_curve("fast", s, fast) for s in range(5)]
  (steps,) = cc.against_baseline(results, statistic="iterations_to_threshold")
  assert (steps.statistic, steps.difference) == ("iterations_to_threshold", -2.0)
  want = cc.fits.mann_whitney_u(np.full(5, 2.0), np.full(5, 4.0), alternative="less")
  assert steps.p_value == pytest.approx(want.p_value) and steps.p_value < 0.01
  # Paired by seed: all five differences negative, the smallest one-sided p, 1/32.
  assert steps.paired_p_value == 1 / 32
  # No seed in common with GRPO: no paired test.
  (lone,) = cc.against_baseline(results[:5] + [_curve("lone", 9, fast)],
                                statistic="iterations_to_threshold")
  assert lone.method == "lone" and np.isnan(lone.paired_p_value)
  (area,) = cc.against_baseline(results, statistic="mean_train_success")
  assert area.difference == pytest.approx(np.mean(fast) - np.mean(slow)) and area.p_value < 0.01
  (final,) = cc.against_baseline(results, statistic="final_eval_success")
  assert final.difference == 0.0 and final.p_value > 0.5
  with pytest.raises(ValueError, match="unknown statistic"):
    cc.against_baseline(results, statistic="best_success")


def test_summary_carries_the_speed_statistics_and_records_round_trip():
  runs = [_curve("grpo", s, [0.5, 0.95 if s else 0.5, 1.0]) for s in range(3)]
  (summary,) = cc.summarize(runs)
  # Crossing at iteration 2, 2 and 3 (seed 0 later): mean 7/3; mean success (0.5+0.95+1)/3 etc.
  assert summary.iterations_to_threshold[0] == pytest.approx(7 / 3)
  assert summary.mean_train_success[0] == pytest.approx(np.mean([2.45 / 3, 2.45 / 3, 2.0 / 3]))
  back = cc.result_from_record(json.loads(json.dumps(cc.result_record(runs[1]))))
  assert (back.method, back.env, back.seed, back.eval_success) == ("grpo", runs[1].env, 1, 1.0)
  for field in ("success", "invalid_action_rate", "repeated_action_rate"):
    np.testing.assert_array_equal(getattr(back, field), getattr(runs[1], field))


def test_results_file_merges_runs_from_several_writers(tmp_path):
  path = str(tmp_path / "results" / "bench.json")
  first = [_final("grpo", "dd_chain", 0, 0.5), _final("rloo", "dd_chain", 0, 0.25)]
  cc.merge_results_file(path, first, {"dd_chain": {"num_iterations": 2}}, small=False)
  # A second writer adds its own method and re-records one run; a third only adds fields.
  second = [_final("gigpo", "dd_chain", 0, 1.0), _final("grpo", "dd_chain", 0, 0.75)]
  cc.merge_results_file(path, second, {"frozenlake": {"num_iterations": 3}})
  got = cc.merge_results_file(path, [], {}, runtime_s=12.0)
  finals = {(r["method"], r["seed"]): r["eval_success"] for r in got["runs"]}
  assert finals == {("grpo", 0): 0.75, ("rloo", 0): 0.25, ("gigpo", 0): 1.0}
  assert got["specs"] == {"dd_chain": {"num_iterations": 2}, "frozenlake": {"num_iterations": 3}}
  assert (got["small"], got["runtime_s"]) == (False, 12.0)
  assert json.loads(pathlib.Path(path).read_text()) == got
  back = cc.result_from_record(next(r for r in got["runs"] if r["method"] == "rloo"))
  assert back.eval_success == 0.25 and back.success.shape == (2,)


def test_benchmark_specs_and_reading_back_only_runs_of_the_same_spec(tmp_path):
  assert cc.benchmark_spec("dd_chain_t32_m2").num_iterations == 20
  assert cc.benchmark_spec("frozenlake_6x6").num_iterations == 50
  sgd = cc.benchmark_spec("dd_chain_t32_m4_sgd")
  assert (sgd.optimizer, sgd.num_iterations) == ("sgd", 20)
  assert cc.benchmark_spec("dd_chain_t32_m4").optimizer == "adamw"
  small = cc.benchmark_spec("dd_chain_t32_m4_b8")
  assert (small.tasks_per_iteration * small.group_size, small.optimizer) == (8, "adamw")
  smaller = cc.benchmark_spec("dd_chain_t32_m4_b4")
  assert (smaller.tasks_per_iteration, smaller.group_size, smaller.num_iterations) == (1, 4, 100)
  assert cc.benchmark_seeds("dd_chain_t32_m4") == (0, 1, 2, 3, 4)
  assert cc.benchmark_seeds("dd_chain_t32_m4_b4") == tuple(range(20))
  # The 6x6 replication reruns GRPO and MT-GRPO on the same setting and sizes, on fresh seeds.
  fresh = "frozenlake_6x6_fresh"
  assert cc.SETTINGS[fresh] == cc.SETTINGS["frozenlake_6x6"]
  assert cc.benchmark_spec(fresh) == cc.benchmark_spec("frozenlake_6x6")
  assert not set(cc.benchmark_seeds(fresh)) & set(cc.benchmark_seeds("frozenlake_6x6"))
  assert len(cc.benchmark_seeds(fresh)) == 5
  assert [m.name for m in cc.METHODS if cc.applies(m, fresh)] == ["grpo", "mt_grpo"]
  with pytest.raises(ValueError, match="unknown env setting"):
    cc.benchmark_seeds("dd_chain_t64")
  for setting in cc.GATE_SETTINGS:
    extra = ["gigpo", "mt_grpo", "ppo_turn_gae_l95"] if setting in cc.LEARNED_SETTINGS else []
    assert ([m.name for m in cc.METHODS if cc.applies(m, setting)]
            == ["grpo", *extra, "grpo_oracle_turn"])
  with pytest.raises(ValueError, match="unknown env setting"):
    cc.benchmark_spec("dd_chain_t64")
  path = str(tmp_path / "bench.json")
  assert cc.read_results_file(path, {}) == {}
  chain, lake = cc.benchmark_spec("dd_chain"), cc.benchmark_spec("frozenlake")
  runs = [_final("grpo", "dd_chain", 0, 1.0), _final("grpo", "frozenlake", 0, 0.5)]
  cc.merge_results_file(path, runs, {"dd_chain": cc.spec_record(chain),
                                     "frozenlake": cc.spec_record(lake)})
  # A setting whose spec changed since is not read back; one not asked for neither.
  changed = dataclasses.replace(lake, learning_rate=1e-4)
  got = cc.read_results_file(path, {"dd_chain": chain, "frozenlake": changed})
  assert list(got) == [("dd_chain", "grpo", 0)] and got["dd_chain", "grpo", 0].eval_success == 1.0
  # A spec written before a field existed reads as that field's default, and only as it.
  old = {k: v for k, v in cc.spec_record(chain).items() if k != "optimizer"}
  cc.merge_results_file(path, [], {"dd_chain": old})
  assert list(cc.read_results_file(path, {"dd_chain": chain})) == [("dd_chain", "grpo", 0)]
  sgd = dataclasses.replace(chain, optimizer="sgd")
  assert cc.read_results_file(path, {"dd_chain": sgd}) == {}
  # fresh=True replaces what the file held.
  cc.merge_results_file(path, [_final("rloo", "dd_chain", 1, 0.0)], {}, fresh=True)
  assert cc.read_results_file(path, {"dd_chain": chain}) == {}


def test_a_study_run_one_setting_at_a_time_keeps_the_other_settings_analysis(tmp_path):
  path = str(tmp_path / "results.json")
  chain = [_final("grpo", "dd_chain", 0, 0.5)]
  cc.merge_results_file(path, chain, {"dd_chain": {"num_iterations": 2}}, seeds={"dd_chain": [0]},
                        plan={"dd_chain": ["grpo"]}, runtime_s=5.0,
                        against_grpo=[{"env": "dd_chain", "method": "rloo", "p_value": 0.2}])
  lake = [_final("grpo", "frozenlake", 1, 0.25)]
  got = cc.merge_results_file(path, lake, {"frozenlake": {"num_iterations": 3}},
                              seeds={"frozenlake": [1]}, plan={"frozenlake": ["grpo"]},
                              runtime_s=7.0,
                              against_grpo=[{"env": "frozenlake", "method": "rloo", "p_value": 0.4}])
  assert got["seeds"] == {"dd_chain": [0], "frozenlake": [1]}
  assert got["plan"] == {"dd_chain": ["grpo"], "frozenlake": ["grpo"]}
  assert [(c["env"], c["p_value"]) for c in got["against_grpo"]] == [("dd_chain", 0.2),
                                                                       ("frozenlake", 0.4)]
  assert got["runtime_s"] == 7.0
  # Re-analysing a setting replaces its records, not the other setting's.
  got = cc.merge_results_file(path, [], {"frozenlake": {"num_iterations": 3}},
                              against_grpo=[{"env": "frozenlake", "method": "rloo", "p_value": 0.1}])
  assert [(c["env"], c["p_value"]) for c in got["against_grpo"]] == [("dd_chain", 0.2),
                                                                       ("frozenlake", 0.1)]


def test_step_gaps_per_chain():
  # rho = 2/32: GRPO crosses 0.9 at iterations 4, 5, 5; the gated runs at 2, 2, 3 -> medians 5 and
  # 2, gap 2.5. A chain without gated runs is left out.
  def curve(first):  # training success crossing 0.9 at iteration `first`
    return np.where(np.arange(1, 9) >= first, 0.95, 0.5)
  results = [_curve("grpo", s, curve(k)) for s, k in enumerate((4, 5, 5))]
  results += [_curve("grpo_oracle_turn", s, curve(k)) for s, k in enumerate((2, 2, 3))]
  results += [_curve("grpo", 0, curve(3))._replace(env="dd_chain_t32_m8")]
  (gap,) = cc.step_gaps(results)
  assert (gap["env"], gap["rho"], gap["num_seeds"]) == ("dd_chain_t32_m2", 2 / 32, 3)
  assert (gap["median_grpo"], gap["median_grpo_oracle_turn"], gap["gap"]) == (5.0, 2.0, 2.5)
  want = cc.fits.mann_whitney_u(np.array([2, 2, 3]), np.array([4, 5, 5]), alternative="less")
  assert gap["p_value"] == pytest.approx(want.p_value)


def test_complete_plan_keeps_the_pairs_with_every_seed_in_study_order():
  runs = {("frozenlake", name, seed): _final(name, "frozenlake", seed, 0.5)
          for name in ("gigpo", "grpo") for seed in (0, 1, 2)}
  runs[("dd_chain", "rloo", 0)] = _final("rloo", "dd_chain", 0, 0.5)  # seeds 1 and 2 missing
  got = cc.complete_plan(runs, {"frozenlake": (0, 1, 2), "dd_chain": (0, 1, 2)})
  assert got == {"frozenlake": ["grpo", "gigpo"]}  # METHODS order, not the runs' order
  assert cc.complete_plan(runs, {"frozenlake": (0,), "dd_chain": (0,)}) == {
      "dd_chain": ["rloo"], "frozenlake": ["grpo", "gigpo"]}
  assert cc.complete_plan(runs, {"dd_chain": (0,)}) == {"dd_chain": ["rloo"]}
