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
# # The learning suite: held-out success per env, before and after training
#
# **Hardware and runtime assumed.** CPU only, 2 cores, about 2 GB of memory per run. Full size:
# each (env, seed) is one launch of the env's gin file at its own size (see
# `agentrl_jax.studies.learning_suite.FULL`), 3 seeds, each within 20 minutes on 2 cores; the
# runs resume per (env, seed), so the suite can be finished in parts (`STUDY_RUNS_DIR` keeps
# them; a rerun reads finished runs back and resumes stopped ones from their checkpoints; the
# runs share one compilation cache there, `jax_cache/`, so a later run loads the programs an
# earlier one compiled).
# `STUDY_ENVS=frozenlake,sokoban` runs only those envs; `STUDY_SET=methods` runs every method
# config at its own size beside plain GRPO at the same budgets instead, `STUDY_SET=rl_share`
# FrozenLake from a clone of a tenth of the steps, where RL has room to add; the table and figure cover every row with finished runs in the
# directory. `STUDY_ANALYSE_ONLY=1` launches nothing and reports the runs finished so far (a row
# may then have fewer than 3 seeds: the table says how many). `STUDY_SEEDS=3,4` trains those
# seeds instead of 0-2 (a row then has as many seeds as have finished). `SMALL=1`: one seed of a
# few FrozenLake iterations, about 70 seconds, checking the pipeline rather than the learning (one seed has no interval).
# `STUDY_PARALLEL=3` runs three (env, seed) runs at a time, each its own process: they share the
# cores, so use it where the machine has cores to spare or a run waits on its env.
#
# **How to run.** From the repository root:
#
# * full size: `STUDY_RUNS_DIR=runs/learning_suite python notebooks/learning_suite.py`
# * CI size: `SMALL=1 python notebooks/learning_suite.py`
# * as a notebook: `jupytext --to ipynb --execute notebooks/learning_suite.py`.
#
# It writes `figures/learning_suite.png` and `results/learning_suite.json` next to this file
# (`STUDY_OUTPUT_DIR=...` writes them elsewhere).
#
# **What it shows.** For every env: the untrained policy's held-out greedy success, the success
# after the behaviour-cloning warm start (where the config has one) and after RL — the last
# evaluation, never the best — as the mean over seeds with its 95% Student-t interval, and the
# learning curve (held-out success against iteration) with its seed band.

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
import matplotlib.pyplot as plt
import numpy as np

from agentrl_jax.studies import learning_suite as ls

SMALL = os.environ.get("SMALL", "0") == "1"
HERE = pathlib.Path(__file__).resolve().parent if "__file__" in globals() else pathlib.Path.cwd()
OUTPUT_DIR = pathlib.Path(os.environ.get("STUDY_OUTPUT_DIR", HERE))
RUNS_DIR = pathlib.Path(os.environ.get("STUDY_RUNS_DIR") or tempfile.mkdtemp(prefix="suite_"))
# STUDY_SET=methods: every method config beside plain GRPO at the same budgets (ls.METHODS);
# STUDY_SET=rl_share: setups from a short clone, where RL has room to add (ls.RL_SHARE).
STUDY_SET = os.environ.get("STUDY_SET", "full")
if STUDY_SET not in ls.SETS:
  raise SystemExit(f"STUDY_SET={STUDY_SET!r} is not one of {sorted(ls.SETS)}")
SPECS = ls.SMALL if SMALL else ls.SETS[STUDY_SET]
SEEDS = (0,) if SMALL else (0, 1, 2)
# STUDY_SEEDS=3,4 trains those seeds instead (more seeds on a row, or a row's seeds split across
# processes); the table covers every finished seed of a row.
TRAIN_SEEDS = SEEDS
if os.environ.get("STUDY_SEEDS"):
  named = os.environ["STUDY_SEEDS"].split(",")
  if not all(s.strip().isdigit() for s in named):
    raise SystemExit(f"STUDY_SEEDS={os.environ['STUDY_SEEDS']!r} must be seeds >= 0 separated "
                     "by commas, e.g. 3,4")
  TRAIN_SEEDS = tuple(sorted({int(s) for s in named}))
# STUDY_PARALLEL=3 runs three (env, seed) runs at a time, each its own process.
PARALLEL = os.environ.get("STUDY_PARALLEL", "1")
if not PARALLEL.isdigit() or int(PARALLEL) < 1:
  raise SystemExit(f"STUDY_PARALLEL={PARALLEL!r} must be a positive number of runs at a time")
PARALLEL = int(PARALLEL)
CHOSEN = os.environ.get("STUDY_ENVS")
if CHOSEN:
  SPECS = tuple(s for s in SPECS if s.env in CHOSEN.split(","))
print(f"SMALL={SMALL}  envs={[s.env for s in SPECS]}  seeds={TRAIN_SEEDS}  runs in {RUNS_DIR}")

# %% [markdown]
# ## Run (or resume, or read back) every (env, seed)

# %%
start = time.time()
RESULTS_PATH = OUTPUT_DIR / "results" / "learning_suite.json"
if not SMALL and RESULTS_PATH.exists():
  # Runs recorded earlier (other sessions or machines) are read back, not run again.
  previous = json.loads(RESULTS_PATH.read_text())
  if not previous.get("small"):
    print(f"{ls.restore_runs(previous['runs'], RUNS_DIR)} runs restored from {RESULTS_PATH}")
# STUDY_ANALYSE_ONLY=1: nothing is launched; the table, figure and results file are made from
# the runs finished so far (e.g. after a session ended a suite run part-way).
ANALYSE_ONLY = os.environ.get("STUDY_ANALYSE_ONLY") == "1"
if not ANALYSE_ONLY:
  ls.run_suite(SPECS, TRAIN_SEEDS, RUNS_DIR, parallel=PARALLEL)
# Every finished run in the directory, also those of envs not chosen this time.
results = [json.loads(p.read_text()) for p in sorted(RUNS_DIR.glob(f"*/seed_*/{ls.RESULT_FILE}"))]
summary = ls.summarize(results)
elapsed = time.time() - start
print(f"{len(results)} runs, {elapsed:.0f} s this pass\n")
print(ls.table(summary))

# %%
envs = list(summary)
fig, axes = plt.subplots(1, max(len(envs), 1), figsize=(3.6 * max(len(envs), 1), 3.2),
                         squeeze=False)
for ax, env in zip(axes[0], envs):
  s = summary[env]
  for r in (r for r in results if r["env"] == env):
    it, success = np.asarray(r["curve"]).T
    ax.plot(it, success, color="C0", alpha=0.3, lw=0.8)
  if s["curve"] is not None:
    band = s["curve"]
    ax.plot(band["iteration"], band["mean"], color="C0", lw=2,
            label=f"mean of {len(s['seeds'])} seeds")
    if len(s["seeds"]) > 1:
      ax.fill_between(band["iteration"], band["low"], band["high"], color="C0", alpha=0.2,
                      label="95% interval")
  ax.axhline(s["untrained"]["mean"], color="k", ls=":", lw=1, label="untrained")
  ax.set(title=env, xlabel="RL iteration (0: after the warm start)", ylim=(-0.02, 1.02))
axes[0][0].set_ylabel("held-out greedy success")
axes[0][0].legend(fontsize=7)
fig.tight_layout()
(OUTPUT_DIR / "figures").mkdir(parents=True, exist_ok=True)
figure_path = OUTPUT_DIR / "figures" / "learning_suite.png"
fig.savefig(figure_path, dpi=110)
print("wrote", figure_path)

# %%
(OUTPUT_DIR / "results").mkdir(parents=True, exist_ok=True)
results_path = RESULTS_PATH
results_path.write_text(json.dumps({"small": SMALL, "seeds": list(SEEDS), "summary": summary,
                                    "runs": results, "table": ls.table(summary)}, indent=1))
print("wrote", results_path)

# %% [markdown]
# ## Checks
#
# Every chosen (env, seed) finished, its figures are success rates, and its curve ends at the
# result the table reports (the last evaluation). At full size the goals — after RL above the
# untrained policy, and above the warm start, with intervals that do not overlap — are recorded
# per env in the results (`rl_above_untrained`, `rl_above_start`), not asserted.

# %%
for spec in SPECS:
  runs = [r for r in results if r["env"] == spec.env]
  if not ANALYSE_ONLY:
    assert set(TRAIN_SEEDS) <= {r["seed"] for r in runs}, (spec.env, [r["seed"] for r in runs])
  for r in runs:
    assert all(0.0 <= s <= 1.0 for _, s in r["curve"]), r["curve"]
    assert r["curve"][-1][1] == r["after"], r
print("all checks passed")
