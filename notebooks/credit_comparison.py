# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Credit assignment side by side: GRPO, Dr.GRPO, RLOO, GiGPO, GAGPO, MT-GRPO, PPO-GAE, GRPO + curiosity
#
# **Hardware and runtime assumed.** CPU only, 2 cores, a single JAX device, about 2 GB of memory.
# Full size (8 methods × 2 envs × 3 seeds = 48 runs of 50 iterations, 64 episodes each, a 2-layer
# width-64 transformer trained from scratch): not run yet. Measured on the shared 2-core machine at
# load ≈ 15: about 60 s of compilation per run, then about 10 s per iteration on FrozenLake and
# 3 s on DD-Chain, so about 5 hours in all (24 × 9 min + 24 × 3.5 min); expect less on 2 idle
# cores. `SMALL=1` (CI): 2 iterations of 2 × 2 episodes, a 1-layer width-32 model, one seed, one
# method of each kind on DD-Chain (GRPO, GiGPO, PPO-GAE, GRPO + curiosity) and GRPO ± curiosity
# on FrozenLake: 6 runs, about 45 s of CPU time, almost all of it compilation (measured on the
# shared 2-core machine: 49 s wall at load ≈ 6, 93 s at load ≈ 9). Runs of one env share their
# sampling and evaluation programs, which JAX's persistent compilation cache (in the runs
# directory) then compiles once.
#
# **How to run.** From the repository root:
#
# * full size: `python notebooks/credit_comparison.py`
# * the credit benchmark (DD-Chain T = 32 at m ∈ {1, 2, 4, 8}, 20 iterations, and 6x6 FrozenLake,
#   50 iterations; every method that applies, plus GRPO gated to the oracle decision turns on the
#   chains, and on 6x6 FrozenLake, where states repeat and episode lengths vary, GRPO + curiosity,
#   GRPO + C³ and GRPO + DeltaTTG (its meter fitted in each run's directory first); 5 seeds; each method against GRPO by one-sided Mann–Whitney tests of final held-out
#   success, mean training success and iterations to 0.9 training success):
#   `STUDY_SET=benchmark STUDY_RUNS_DIR=runs/credit_benchmark python notebooks/credit_comparison.py`;
#   `STUDY_SETTINGS=dd_chain_t32_m2,...` picks settings. The results JSON is rewritten after every
#   run and read back on the next start, so the benchmark can be finished in parts. A chain run
#   takes about 55-70 s on 2 cores (35 per setting), a 6x6 FrozenLake run much longer.
#   `STUDY_METHODS=a,b` trains only those methods and `STUDY_SEEDS=3,4` only those seeds (a
#   second process beside a running one, on runs the first will not reach first). The table,
#   tests and figure always cover every (setting, method) whose every seed is in the results
#   file, whatever the launch trained; `STUDY_ANALYSE_ONLY=1` trains nothing and only analyses.
# * CI size: `SMALL=1 python notebooks/credit_comparison.py`
# * as a notebook: `jupytext --to ipynb --execute notebooks/credit_comparison.py`.
#
# It writes `figures/credit_comparison.png`, `results/credit_comparison.json` and
# `results/credit_comparison.md` (the table) next to this file (`STUDY_OUTPUT_DIR=...` writes them
# elsewhere). Run directories (metrics, final checkpoints) go to a temporary directory unless
# `STUDY_RUNS_DIR=...` names one.
#
# **What it shows.** Each method is one `learner.train` call with Python configs
# (`agentrl_jax.studies.credit_comparison`); only the credit stage differs. FrozenLake (4×4 maps
# drawn per episode) and DD-Chain (T = 8 turns, 2 of them decisions) are both multi-turn and
# sparse-reward. Curves are training success per iteration (sampled policy) with 95% t-bands over
# seeds; the table adds held-out greedy success at the end and, over the last quarter of training,
# the repeated-action rate (a turn whose action tokens equal the previous turn's) and the
# invalid-action rate. On DD-Chain every observation is new, so the curiosity penalty never fires
# and GRPO + curiosity equals GRPO there up to sampling.

# %%
import json
import os
import pathlib
import sys
import tempfile
import time

import matplotlib

if "ipykernel" not in sys.modules:
  matplotlib.use("Agg")  # Headless when run as a script (CI).
import jax
import matplotlib.pyplot as plt
import numpy as np

from agentrl_jax.studies import credit_comparison as cc

SMALL = os.environ.get("SMALL", "0") == "1"
HERE = pathlib.Path(__file__).resolve().parent if "__file__" in globals() else pathlib.Path.cwd()
OUTPUT_DIR = pathlib.Path(os.environ.get("STUDY_OUTPUT_DIR", HERE))
RUNS_DIR = pathlib.Path(os.environ.get("STUDY_RUNS_DIR") or tempfile.mkdtemp(prefix="credit_"))
# Every learner.train call builds fresh jitted functions; the on-disk cache lets runs with the same
# env and model reuse compiled sampling, evaluation and (same estimator) update programs.
jax.config.update("jax_compilation_cache_dir", str(RUNS_DIR / "jax_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

if SMALL:
  SPEC = cc.ComparisonSpec(num_iterations=2, tasks_per_iteration=2, group_size=2, num_layers=1,
                           d_model=32, eval_tasks=4)
  SEEDS = (0,)
  # One method per kind of baseline: trajectory group, step group, critic, shaped reward, gate.
  PLAN = {"dd_chain": ["grpo", "gigpo", "ppo_gae", "grpo_curiosity", "grpo_oracle_turn"],
          "frozenlake": ["grpo", "grpo_curiosity"]}
elif os.environ.get("STUDY_SET") == "benchmark":
  # The credit benchmark: low decision densities and longer horizons, 5 or 20 seeds, equal
  # environment steps within a setting (the same episodes per iteration and iterations for every
  # method; `cc.benchmark_spec`: 20 iterations on the chains, 50 on 6x6 FrozenLake).
  SPEC = cc.BENCHMARK_SPEC
  settings = os.environ.get("STUDY_SETTINGS", ",".join(cc.BENCHMARK_SETTINGS)).split(",")
  unknown = sorted(set(settings) - set(cc.BENCHMARK_SETTINGS))
  if unknown:
    raise ValueError(f"STUDY_SETTINGS names {unknown}; the benchmark's are {cc.BENCHMARK_SETTINGS}")
  # STUDY_METHODS=a,b runs only those methods (e.g. a second process beside a running one).
  only = os.environ.get("STUDY_METHODS")
  chosen = [m for m in cc.METHODS if not only or m.name in only.split(",")]
  if only and len(chosen) != len(only.split(",")):
    raise ValueError(f"STUDY_METHODS={only!r} names unknown methods; known: "
                     f"{[m.name for m in cc.METHODS]}")
  PLAN = {setting: [m.name for m in chosen if cc.applies(m, setting)] for setting in settings}
else:
  SPEC = cc.ComparisonSpec(num_iterations=50, tasks_per_iteration=8, group_size=8)
  SEEDS = (0, 1, 2)
  PLAN = {env: [m.name for m in cc.METHODS if cc.applies(m, env)]
          for env in ("dd_chain", "frozenlake")}
METHODS = {m.name: m for m in cc.METHODS}
# The benchmark writes its figure and results under its own name, beside the comparison's.
BENCHMARK = os.environ.get("STUDY_SET") == "benchmark" and not SMALL
NAME = "credit_benchmark" if BENCHMARK else "credit_comparison"

SPECS = {env: cc.benchmark_spec(env) if BENCHMARK else SPEC for env in cc.SETTINGS}
# The seeds of each setting: the benchmark runs 20 on its cheap small-batch chains, 5 elsewhere.
# Every setting's seeds (the analysis reads all the study's finished settings, not only PLAN's).
SEEDS_OF = {env: cc.benchmark_seeds(env) if BENCHMARK else SEEDS for env in cc.SETTINGS}
# STUDY_SEEDS=3,4 trains only those seeds (a second process on other seeds of the same methods).
only_seeds = os.environ.get("STUDY_SEEDS")
TRAIN_SEEDS = {env: SEEDS_OF[env] for env in PLAN}
if only_seeds:
  named = {int(s) for s in only_seeds.split(",") if s.strip().isdigit()}
  if len(named) != len(only_seeds.split(",")) or not all(
      named <= set(SEEDS_OF[env]) for env in PLAN):
    raise ValueError(f"STUDY_SEEDS={only_seeds!r} must name seeds of every chosen setting: "
                     f"{ {env: SEEDS_OF[env] for env in PLAN} }")
  TRAIN_SEEDS = {env: tuple(s for s in SEEDS_OF[env] if s in named) for env in PLAN}
RESULTS_PATH = OUTPUT_DIR / "results" / f"{NAME}.json"
print(f"SMALL={SMALL}  spec={SPEC}  seeds={TRAIN_SEEDS}  runs in {RUNS_DIR}  devices={jax.devices()}")

# %% [markdown]
# ## Train every (env, method, seed)
#
# The results JSON is rewritten after every run and its runs are read back on the next start (where
# the setting's spec is unchanged), so the study can be finished in parts, on other machines too.

# %%
done = {} if SMALL else cc.read_results_file(str(RESULTS_PATH), SPECS)
print(f"{len(done)} runs read back from {RESULTS_PATH}")
# STUDY_ANALYSE_ONLY=1: no training; the table, tests and figure are made from the results file.
if os.environ.get("STUDY_ANALYSE_ONLY") == "1":
  if not cc.complete_plan(done, SEEDS_OF):
    raise ValueError(f"STUDY_ANALYSE_ONLY: no (setting, method) in {RESULTS_PATH} has all its "
                     f"seeds")
  PLAN = {}
  print("analysing the finished runs only")
# Runs are merged into the results file under a lock (other processes may be running other
# methods or settings); the CI size replaces the file instead, its runs sharing keys with the
# full size's.
PLAN_SPECS = {env: cc.spec_record(SPECS[env]) for env in PLAN}

start = time.time()
results = []
# Seed by seed, every method of a seed in turn: a study stopped part-way leaves complete seeds
# (pairs for the paired tests), not one method's every seed.
for env, names in PLAN.items():
  for seed in TRAIN_SEEDS[env]:
    for name in names:
      run_start = time.time()
      if (env, name, seed) in done:
        results.append(done[env, name, seed])
        continue
      results.append(cc.run_method(str(RUNS_DIR / f"{env}_{name}_seed{seed}"),
                                   method=METHODS[name], env=env, seed=seed, spec=SPECS[env]))
      if not SMALL:
        cc.merge_results_file(str(RESULTS_PATH), results, PLAN_SPECS, small=SMALL,
                              seeds={env: list(SEEDS_OF[env]) for env in PLAN})
      print(f"{env:10s} {name:15s} seed {seed}: final train success "
            f"{results[-1].success[-1]:.3f}, held-out {results[-1].eval_success:.3f} "
            f"({time.time() - run_start:.0f} s)", flush=True)
elapsed = time.time() - start
print(f"all runs took {elapsed / 60:.1f} min")

# %% [markdown]
# The analysis covers every (setting, method) of the study that has all its seeds in the results
# file, not only the ones this launch trained, so that a launch of one method on one setting
# rewrites the table and the tests with every finished row. The CI size analyses its own runs.

# %%
if SMALL:
  ANALYSED = PLAN
else:
  done = cc.read_results_file(str(RESULTS_PATH), SPECS)
  ANALYSED = cc.complete_plan(done, SEEDS_OF)
  results = [done[env, name, seed]
             for env, names in ANALYSED.items() for name in names for seed in SEEDS_OF[env]]
print(f"analysing {sum(map(len, ANALYSED.values()))} (setting, method) pairs: {ANALYSED}")
ANALYSED_SPECS = {env: cc.spec_record(SPECS[env]) for env in ANALYSED}

# %% [markdown]
# ## Results table

# %%
summaries = cc.summarize(results)
table = cc.results_table(summaries)
print(table)
# Each method against GRPO on the same setting: the one-sided Mann–Whitney test of a higher final
# held-out success (with 3 seeds the smallest possible p is 0.05; the benchmark runs 5).
comparisons = [c for statistic in cc.STATISTICS
               for c in cc.against_baseline(results, statistic=statistic)]
for c in comparisons:
  print(f"{c.env:16s} {c.method:16s} {c.statistic:24s} vs grpo: {c.difference:+.3f}, "
        f"Mann–Whitney p = {c.p_value:.3f}, paired by seed p = {c.paired_p_value:.3f} "
        f"({c.num_seeds} seeds)")

# %% [markdown]
# ## Iterations to threshold: trajectory-level ÷ oracle turn-level credit
#
# Where a chain ran both GRPO and GRPO gated to the decision turns (the same advantage, the
# routine turns' terms removed), the ratio of their median iterations to 0.9 training success is
# the transformer's steps-to-threshold gap at that ρ, with the one-sided Mann–Whitney p of "the
# gated runs need fewer" (`fits.step_gap`; a run that never gets there counts as one iteration
# past the end). Training success is judged over 64 episodes: on the small-batch chains, the mean
# over the next 8 (or 16) iterations (`cc.threshold_window`). At ρ = 1 the gate keeps every turn,
# so the two are the same algorithm: the gap is 1 by construction and is not run.

# %%
step_gaps = cc.step_gaps(results)
for g in step_gaps:
  print(f"{g['env']}: rho = {g['rho']:.4f}, median iterations GRPO {g['median_grpo']:.1f} vs "
        f"oracle turn-level {g['median_grpo_oracle_turn']:.1f}: gap {g['gap']:.2f}, "
        f"p = {g['p_value']:.3f} ({g['num_seeds']} seeds)")

# %% [markdown]
# ## How much of the first gradient the routine turns make
#
# Both methods' first update is on the same batch, and the gate removes only the routine turns'
# terms, so √(‖g_all‖² − ‖g_gated‖²) per seed estimates the routine turns' part of the gradient
# (`cc.first_gradient_parts`; settings whose runs recorded their gradient norms).

# %%
gradient_parts = cc.first_gradient_parts(results)
for g in gradient_parts:
  print(f"{g['env']}: first-update gradient norm {g['every_turn']:.3f} with every turn, "
        f"{g['gated']:.3f} gated, routine part ≈ {g['routine']:.3f} ({g['num_seeds']} seeds)")

# %%
envs = list(ANALYSED)
fig, axes = plt.subplots(len(envs), 3, figsize=(15, 4 * len(envs)), squeeze=False)
colors = {m.name: f"C{i}" for i, m in enumerate(cc.METHODS)}
panels = (("success", "training success"), ("repeated_action_rate", "repeated-action rate"),
          ("invalid_action_rate", "invalid-action rate"))
for row, env in enumerate(envs):
  for col, (field, label) in enumerate(panels):
    ax = axes[row, col]
    for s in summaries:
      if s.env != env:
        continue
      mean, low, high = getattr(s, field)
      iterations = np.arange(1, mean.shape[0] + 1)
      ax.plot(iterations, mean, color=colors[s.method], label=s.method)
      ax.fill_between(iterations, low, high, color=colors[s.method], alpha=0.15)
    ax.set(xlabel="iteration", ylabel=label, title=f"{env}: {label}")
    if col == 0:
      ax.legend(fontsize=7, ncol=2)
fig.suptitle(f"{'/'.join(sorted({str(len(SEEDS_OF[env])) for env in ANALYSED}))} seed(s) a setting, bands = 95% t-interval over seeds"
             + (" (SMALL)" if SMALL else ""))
fig.tight_layout()
(OUTPUT_DIR / "figures").mkdir(parents=True, exist_ok=True)
figure_path = OUTPUT_DIR / "figures" / f"{NAME}.png"
fig.savefig(figure_path, dpi=100)
print("wrote", figure_path)

# %%
(OUTPUT_DIR / "results").mkdir(parents=True, exist_ok=True)
(OUTPUT_DIR / "results" / f"{NAME}.md").write_text(table + "\n")
cc.merge_results_file(str(RESULTS_PATH), results, ANALYSED_SPECS, fresh=SMALL, small=SMALL,
                      seeds={env: list(SEEDS_OF[env]) for env in ANALYSED}, plan=ANALYSED,
                      runtime_s=elapsed,
                      against_grpo=[c._asdict() for c in comparisons], step_gap=step_gaps,
                      first_gradient=gradient_parts)
results_path = RESULTS_PATH
print("wrote", results_path)

# %% [markdown]
# ## Checks
#
# Every analysed run finished with finite, in-range rates. Every method of an env starts from the
# same policy (initialised from the seed) and samples its first batch with the same key; the
# credit stage acts only after that batch, so iteration 1 is the same for all methods. On DD-Chain
# every observation is new, so the curiosity penalty never fires: GRPO + curiosity takes the same
# updates as GRPO and the two runs match (checked over the first two iterations; later, the two
# differently compiled update programs may round differently and the samples drift apart). At
# full size learning must also have happened: on every chain, every method's late training success
# is at least halfway from chance to 1.

# %%
assert len(results) == sum(len(names) * len(SEEDS_OF[env]) for env, names in ANALYSED.items())
for r in results:
  for values in (r.success, r.repeated_action_rate, r.invalid_action_rate):
    assert values.shape == (SPECS[r.env].num_iterations,), r
    assert np.all((values >= 0) & (values <= 1)), r
  assert 0 <= r.eval_success <= 1, r
  if SMALL or r.grad_norm is not None:  # runs recorded before the field existed have none
    assert r.grad_norm.shape == values.shape and np.all(r.grad_norm > 0), r
RATES = ("success", "repeated_action_rate", "invalid_action_rate")
runs = {(r.env, r.method, r.seed): r for r in results}
for env, names in ANALYSED.items():
  for seed in SEEDS_OF[env]:
    firsts = {tuple(float(getattr(runs[env, name, seed], f)[0]) for f in RATES) for name in names}
    assert len(firsts) == 1, (env, seed, firsts)
    if env == "dd_chain" and {"grpo", "grpo_curiosity"} <= set(names):
      for f in RATES:
        np.testing.assert_array_equal(getattr(runs[env, "grpo", seed], f)[:2],
                                      getattr(runs[env, "grpo_curiosity", seed], f)[:2], err_msg=f)
if not SMALL:
  # Learning happened: on every chain, GRPO's and the oracle gate's late training success is at
  # least halfway from chance (all m decisions right by luck: 2^-m) to 1, so the chain is
  # learnable at its budget. Another method below that line is a result, reported, not a failure
  # (turn-level GAE's critic at rho = 1/4 with 8 episodes an update stays below it).
  for s in summaries:
    if s.env.startswith("dd_chain"):
      chance = 0.5 ** cc.SETTINGS[s.env].env_kwargs["num_decisions"]
      learnt = s.late_train_success[0] > (1 + chance) / 2
      if s.method in cc.GATE_METHODS:
        assert learnt, (s.env, s.method, s.late_train_success)
      elif not learnt:
        print(f"{s.env} {s.method}: late training success {s.late_train_success[0]:.3f}, "
              f"under halfway from chance {chance:.3f} to 1")
print("all checks passed")
