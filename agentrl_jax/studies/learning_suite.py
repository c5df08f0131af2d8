"""The learning suite: held-out success of every env's config before, after its warm start and
after RL, over seeds, from runs of `experiments/run.py` that resume per (env, seed).

Each (env, seed) is one launch of the env's gin file in its own workdir
(`<runs_dir>/<env>/seed_<k>`), run as a subprocess so a run's gin state and memory end with it.
A launch that was stopped resumes from its newest checkpoint when the suite is run again with the
same directory; a finished one is read back from its `metrics.jsonl`. Success is the greedy
held-out success the run's own evaluation writes (`eval/greedy_success...`): before any training
(the untrained policy), after the behaviour-cloning warm start (where the config has one) and at
every evaluation of RL, the last of which is the result.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from agentrl_jax.learner import preemption
from agentrl_jax.studies import binomial
from agentrl_jax.studies import fits

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN_PY = REPO / "experiments" / "run.py"
CONFIGS = REPO / "experiments" / "configs"
RESULT_FILE = "suite_result.json"

# Hooks (the viewer report) cost time and change nothing the suite reads.
NO_HOOKS = ("learner.train.hooks = []",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvRun:
  """One config in the suite.

  Attributes:
    env: the row's name (a panel, a table row and a directory): the registered env for the env
      rows, the gin file's stem for the method rows.
    gin_file: the config under `experiments/configs/`.
    bindings: gin bindings applied after the file (the suite's size of it).
    prepare: a script under the repository and its flags, run once per (env, seed) before the
      launch: what the config reads and no earlier command wrote (DeltaTTG's frozen meter).
      In `bindings` and `prepare`, `{workdir}` is the run's directory and `{seed}` its seed.
  """

  env: str
  gin_file: str
  bindings: tuple[str, ...] = ()
  prepare: tuple[str, ...] = ()

  def argv(self, seed: int, workdir: str) -> list[str]:
    bindings = (*NO_HOOKS, *self.bindings, f"configs.TrainConfig.seed = {seed}")
    return [f"--gin_file={CONFIGS / self.gin_file}", f"--workdir={workdir}",
            *(f"--gin_bindings={_fill(b, seed, workdir)}" for b in bindings)]

  def prepare_argv(self, seed: int, workdir: str) -> list[str]:
    return [_fill(a, seed, workdir) for a in self.prepare]


def _fill(text: str, seed: int, workdir: str) -> str:
  # Not str.format: gin bindings hold dict literals whose braces are not fields.
  return text.replace("{workdir}", str(workdir)).replace("{seed}", str(seed))


# Full size: each run fits well inside 20 minutes on 2 CPU cores.
FULL: tuple[EnvRun, ...] = (
    EnvRun(env="frozenlake", gin_file="quickstart.gin"),
    EnvRun(env="dd_chain", gin_file="dd_chain_grpo.gin"),
    EnvRun(env="sokoban", gin_file="sokoban_grpo.gin"),
    EnvRun(env="terminal", gin_file="terminal_grpo.gin"),
    EnvRun(env="negotiation", gin_file="negotiation_grpo.gin"),
    EnvRun(env="search_qa", gin_file="search_qa_grpo.gin"),
    EnvRun(env="webshop_lite", gin_file="webshop_lite_grpo.gin"),
    EnvRun(env="tool_use", gin_file="tool_use_grpo.gin"),
    EnvRun(env="sql", gin_file="sql_grpo.gin"),
    EnvRun(env="textworld_express", gin_file="textworld_express_coin_grpo.gin"),
    EnvRun(env="textworld", gin_file="textworld_grpo.gin"),
)

# Every method config at its own size, beside plain GRPO (the quickstart setup) at each budget the
# method configs use on FrozenLake; the other envs' method configs compare with their env row.
METHOD_CONFIGS = (
    "curiosity_frozenlake", "c3_frozenlake", "deltattg_frozenlake", "pearl_frozenlake",
    "serl_frozenlake", "ahead_frozenlake", "drift_frozenlake", "iterative_grpo_frozenlake",
    "slea_frozenlake", "tsr_frozenlake", "t2po_frozenlake", "arpo_frozenlake", "rtpo_frozenlake",
    "dr_grpo_frozenlake", "gagpo_frozenlake", "gca_search_qa", "t1_terminal", "progress_sql",
    "socialrl_dialogue", "textworld_express_coin_charge")
# GRPO at the FrozenLake method configs' other budgets: Iterative GRPO's 10 rounds, RTPO's 50
# iterations, DRIFT's 300 steps (100 iterations is the frozenlake env row itself).
GRPO_BUDGETS = (10, 50, 300)
# DeltaTTG reads a frozen progress meter: the suite trains one per run, in the run's directory.
_DELTATTG = dict(prepare=("experiments/train_deltattg_meter.py", "--out={workdir}/meter.npz",
                          "--seed={seed}"),
                 bindings=("deltattg.DeltaTTG.meter_path = '{workdir}/meter.npz'",))
_PREPARED = {"deltattg_frozenlake": _DELTATTG}
METHODS: tuple[EnvRun, ...] = (
    *(EnvRun(env=name, gin_file=f"{name}.gin", **_PREPARED.get(name, {}))
      for name in METHOD_CONFIGS),
    *(EnvRun(env=f"grpo_frozenlake_{n}", gin_file="quickstart.gin",
             bindings=(f"configs.TrainConfig.num_iterations = {n}",)) for n in GRPO_BUDGETS),
)

# RL's own share: an env's setup from a shorter clone, so that RL has room to add (with the full
# clone the warm start does nearly all of the learning and RL's gain sits inside the seeds'
# spread). STUDY_SET=rl_share. A tenth of the cloning steps learns only the board-blind move
# sequence (0.345 on every seed); from 30 of 100 RL gains on every seed (docs/studies.md).
# Free-text envs sampled at temperature 1 from a weak clone write mostly rejected commands
# (terminal from a 50-step clone: no sampled success, 72% -> 90% of commands rejected over 8
# iterations, the entropy bonus the only gradient). SHARP_SAMPLING clones the model's own softmax
# and samples RL at 0.5 without the bonus.
SHARP_SAMPLING = ("configs.WarmStartConfig.temperature = 1.0",
                  "sampler.SamplingConfig.temperature = 0.5", "step.LossConfig.entropy_coef = 0.0")
FOUR_MINIBATCHES = ("step.LossConfig.num_minibatches = 4",)
# textworld_express from a 100-step clone, 40 GRPO iterations sampled sharper.
TWX_CLONE100 = ("configs.WarmStartConfig.iterations = 100",
                "configs.TrainConfig.num_iterations = 40", "configs.EvalConfig.every = 10",
                *SHARP_SAMPLING)
# search_qa's clone (16 corpora) trained by RL on 1000 others.
SEARCH_QA_FRESH = (
    "configs.TrainConfig.env_kwargs = {'max_turns': 6, 'top_k': 1, 'num_corpora': 1000}",
    "configs.WarmStartConfig.env_kwargs = {'num_corpora': 16}")
# Every seed from seed 0's clone, computed by the row's first run and loaded by the others from
# the row's directory (`WarmStartConfig.reuse_dir`).
ONE_CLONE = ("configs.TrainConfig.init_seed = 0",
             "configs.WarmStartConfig.reuse_dir = '{workdir}/../clone'")
# sokoban_one_clone's clone store, read by the rows that start from its clone.
SOKOBAN_ONE_CLONE_STORE = (
    "configs.WarmStartConfig.reuse_dir = '{workdir}/../../sokoban_one_clone/clone'")
RL_SHARE: tuple[EnvRun, ...] = (
    EnvRun(env="frozenlake_short_clone", gin_file="quickstart.gin",
           bindings=("configs.WarmStartConfig.iterations = 10",)),
    EnvRun(env="frozenlake_clone30", gin_file="quickstart.gin",
           bindings=("configs.WarmStartConfig.iterations = 30",)),
    # Free-text envs: a weaker clone and more GRPO iterations, sampled sharper.
    EnvRun(env="terminal_clone50", gin_file="terminal_grpo.gin", bindings=(
        "configs.WarmStartConfig.iterations = 50", "configs.TrainConfig.num_iterations = 60",
        *SHARP_SAMPLING)),
    EnvRun(env="textworld_express_clone100", gin_file="textworld_express_coin_grpo.gin",
           bindings=TWX_CLONE100),
    EnvRun(env="sql_clone150", gin_file="sql_grpo.gin", bindings=(
        "configs.WarmStartConfig.iterations = 150", "configs.TrainConfig.num_iterations = 30",
        *SHARP_SAMPLING)),
    EnvRun(env="terminal_clone50_t07", gin_file="terminal_grpo.gin", bindings=(
        "configs.WarmStartConfig.iterations = 50", "configs.TrainConfig.num_iterations = 60",
        "configs.WarmStartConfig.temperature = 1.0", "sampler.SamplingConfig.temperature = 0.7",
        "step.LossConfig.entropy_coef = 0.0")),
    # The env rows' own clones and budgets, only RL's sampling sharper (paired with the env row).
    EnvRun(env="negotiation_sharp", gin_file="negotiation_grpo.gin", bindings=SHARP_SAMPLING),
    EnvRun(env="search_qa_sharp", gin_file="search_qa_grpo.gin", bindings=SHARP_SAMPLING),
    # Every seed from seed 0's clone (TrainConfig.init_seed): the after-RL spread is RL's own.
    EnvRun(env="negotiation_one_clone", gin_file="negotiation_grpo.gin",
           bindings=("configs.TrainConfig.init_seed = 0", *SHARP_SAMPLING)),
    # Four updates an iteration instead of one, as verl's mini-batches do: with a single
    # on-policy step the ratio is 1 (clip fraction 0) and 40 iterations move the policy 40 steps.
    EnvRun(env="textworld_express_clone100_mb4", gin_file="textworld_express_coin_grpo.gin",
           bindings=(*TWX_CLONE100, *FOUR_MINIBATCHES)),
    EnvRun(env="tool_use_clone400", gin_file="tool_use_grpo.gin", bindings=(
        "configs.WarmStartConfig.iterations = 400", *SHARP_SAMPLING)),
    # textworld_express_clone100 again, cloned from the fewest-moves expert (the engine's own
    # path, which that row cloned, changed with the order of earlier games); 10 seeds.
    EnvRun(env="textworld_express_fewest_clone100", gin_file="textworld_express_coin_grpo.gin",
           bindings=TWX_CLONE100),
    # The same clones and RL, each rejected command charged 0.05 (groups whose episodes all fail
    # or all succeed no longer tie); 10 seeds.
    EnvRun(env="textworld_express_fewest_charge", gin_file="textworld_express_coin_charge.gin",
           bindings=TWX_CLONE100),
    # search_qa's clone knows its 16 training corpora (sampled success 0.93 there, 0.65 on unseen
    # ones), so RL on them has nothing to rank. The same clone, RL on 1000 corpora it never saw
    # (EvalConfig's corpus_seed 1000 over these kwargs: evaluation on corpora 1000-1999, so the
    # clone scores differ from search_qa_sharp's); 5 seeds.
    EnvRun(env="search_qa_fresh_corpora", gin_file="search_qa_grpo.gin",
           bindings=(*SEARCH_QA_FRESH, *SHARP_SAMPLING)),
    # textworld_express_fewest_clone100's clones from noisy demonstrations: 30% of the commands a
    # random valid one, the expert finding the coin again from wherever that leads. Greedy, that
    # row's clone repeats a rejected command about half the time: it never saw a detour; 3 seeds.
    EnvRun(env="textworld_express_noisy_clone100", gin_file="textworld_express_coin_grpo.gin",
           bindings=(*TWX_CLONE100, "configs.WarmStartConfig.expert_noise = 0.3")),
    # search_qa_fresh_corpora has 60-90% of its 16 groups tied and a clone spread (0.60-0.70)
    # wider than RL's gain: one clone (seed 0's), twice the groups for twice the iterations, and
    # 1000 held-out questions so the clone's own interval is about +-0.03; 6 seeds.
    EnvRun(env="search_qa_fresh_one_clone", gin_file="search_qa_grpo.gin", bindings=(
        *SEARCH_QA_FRESH, "configs.TrainConfig.init_seed = 0",
        "configs.TrainConfig.tasks_per_iteration = 32",
        "configs.TrainConfig.num_iterations = 60", "configs.EvalConfig.num_tasks = 1000",
        "configs.EvalConfig.every = 20", *SHARP_SAMPLING)),
    # The noisy row's clone spread (0.265-0.410 over 3 seeds) is as wide as RL's gain: one clone
    # (seed 0's), cloned once for the row, and all 1000 dev-fold games held out, so the clone's
    # own interval is about +-0.03; the same 40 iterations; 6 seeds.
    EnvRun(env="textworld_express_noisy_one_clone", gin_file="textworld_express_coin_grpo.gin",
           bindings=(*TWX_CLONE100, "configs.WarmStartConfig.expert_noise = 0.3", *ONE_CLONE,
                     "configs.EvalConfig.num_tasks = 1000", "configs.EvalConfig.every = 20")),
    # sokoban's env row: clones spread 0.28-0.37 and RL sampled at temperature 1 moved them by
    # -0.035 to +0.065. Seed 0's clone, cloned once for the row, RL sampled at 0.5, 1000 held-out
    # puzzles; 6 seeds.
    EnvRun(env="sokoban_one_clone", gin_file="sokoban_grpo.gin",
           bindings=(*ONE_CLONE, *SHARP_SAMPLING, "configs.EvalConfig.num_tasks = 1000",
                     "configs.EvalConfig.every = 15")),
    # sokoban_one_clone's RL rose at both evaluations of every seed (clone 0.335, 1000 puzzles;
    # +0.03 after 30 iterations): the same clone, loaded from that row's store, and three times
    # the iterations; 6 seeds.
    EnvRun(env="sokoban_one_clone_90", gin_file="sokoban_grpo.gin",
           bindings=("configs.TrainConfig.init_seed = 0", SOKOBAN_ONE_CLONE_STORE, *SHARP_SAMPLING,
                     "configs.TrainConfig.num_iterations = 90",
                     "configs.EvalConfig.num_tasks = 1000", "configs.EvalConfig.every = 30")),
    # webshop_lite's env row: the clones decide the seed (0.145-0.410) and RL at temperature 1
    # moved them by -0.005 to +0.060. Seed 0's clone (the env row's, 0.410), cloned once for the
    # row, RL sampled at 0.5 for twice the iterations, 1000 held-out tasks; 6 seeds.
    EnvRun(env="webshop_lite_one_clone", gin_file="webshop_lite_grpo.gin",
           bindings=(*ONE_CLONE, *SHARP_SAMPLING, "configs.TrainConfig.num_iterations = 40",
                     "configs.EvalConfig.num_tasks = 1000", "configs.EvalConfig.every = 20")),
    # tool_use between its 400-step clone (0.000: valid calls, wrong final databases, no sampled
    # success to rank) and its 1200-step one (0.978: nothing left for RL). Seed 0's 800-step
    # clone, cloned once for the row, RL sampled at 0.5, 1000 held-out scenarios.
    EnvRun(env="tool_use_one_clone800", gin_file="tool_use_grpo.gin",
           bindings=("configs.WarmStartConfig.iterations = 800", *ONE_CLONE, *SHARP_SAMPLING,
                     "configs.EvalConfig.num_tasks = 1000", "configs.EvalConfig.every = 10")),
    # tool_use_one_clone800 held its clone over 20 iterations (0.481 -> 0.488, seed 0): the same
    # clone, loaded from that row's store, for three times the iterations, as sokoban needed.
    EnvRun(env="tool_use_one_clone800_60", gin_file="tool_use_grpo.gin",
           bindings=("configs.WarmStartConfig.iterations = 800",
                     "configs.TrainConfig.init_seed = 0",
                     "configs.WarmStartConfig.reuse_dir = "
                     "'{workdir}/../../tool_use_one_clone800/clone'", *SHARP_SAMPLING,
                     "configs.TrainConfig.num_iterations = 60",
                     "configs.EvalConfig.num_tasks = 1000", "configs.EvalConfig.every = 20")),
)
SETS = MappingProxyType({"full": FULL, "methods": METHODS, "rl_share": RL_SHARE})

# CI size: a few iterations of FrozenLake, checking the pipeline, not the learning.
SMALL: tuple[EnvRun, ...] = (
    EnvRun(env="frozenlake", gin_file="quickstart.gin", bindings=(
        "configs.TrainConfig.num_iterations = 2", "configs.TrainConfig.tasks_per_iteration = 2",
        "configs.TrainConfig.group_size = 2", "configs.WarmStartConfig.iterations = 2",
        "configs.WarmStartConfig.episodes_per_iteration = 8", "configs.EvalConfig.num_tasks = 8",
        "configs.EvalConfig.every = 1", "configs.EvalConfig.pass_k = 0")),
)


# Tiny size: one iteration of two groups of two, two held-out tasks; a method config's gin switch
# shown to run end to end in the default test suite, not its learning.
TINY_BINDINGS = (
    "configs.TrainConfig.num_iterations = 1", "configs.TrainConfig.tasks_per_iteration = 2",
    "configs.TrainConfig.group_size = 2", "configs.TrainConfig.checkpoint_every = 1",
    "configs.WarmStartConfig.iterations = 0", "configs.EvalConfig.num_tasks = 2",
    "configs.EvalConfig.every = 1", "configs.EvalConfig.pass_k = 0")
# The meter script at tiny size (argparse keeps a flag's last value).
TINY_PREPARE_FLAGS = ("--episodes_per_policy=8", "--steps=5", "--batch_size=8")


def tiny(spec: EnvRun) -> EnvRun:
  """`spec` at tiny size."""
  return dataclasses.replace(spec, bindings=(*spec.bindings, *TINY_BINDINGS),
                             prepare=(*spec.prepare, *TINY_PREPARE_FLAGS) if spec.prepare else ())


def workdir_of(runs_dir: str | os.PathLike[str], env: str, seed: int) -> pathlib.Path:
  return pathlib.Path(runs_dir) / env / f"seed_{seed}"


def read_run(workdir: str | os.PathLike[str]) -> dict[str, Any]:
  """The success figures of one run from its `metrics.jsonl` (records in iteration order).

  Returns:
    `{"before", "warm_start" (None without one), "after", "curve": [[iteration, success], ...],
    "iterations", "num_tasks"}`; the curve starts at iteration 0 with the warm start's figure
    (or the untrained one) and ends with the last evaluation.

  Raises:
    ValueError: the run wrote no final evaluation (it has not finished).
  """
  workdir = pathlib.Path(workdir)
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  before = warm = None
  curve: list[list[float]] = []
  for row in rows:
    if "eval/greedy_success_before" in row:
      before = row["eval/greedy_success_before"]
    if "eval/greedy_success_warm_start" in row:
      warm = row["eval/greedy_success_warm_start"]
    if "eval/greedy_success" in row:
      curve.append([int(row["step"]), float(row["eval/greedy_success"])])
  if before is None or not curve:
    raise ValueError(f"{workdir}: no evaluation before training or after it in metrics.jsonl")
  # A run stopped by SIGTERM exits cleanly with a checkpoint: its last evaluation is not final.
  planned = _operative_int(workdir, "configs.TrainConfig.num_iterations")
  if planned is not None and curve[-1][0] != planned:
    raise ValueError(f"{workdir}: last evaluation at iteration {curve[-1][0]} of {planned} (the "
                     "run was stopped; launching it again resumes it)")
  start = warm if warm is not None else before
  return {"before": before, "warm_start": warm, "after": curve[-1][1],
          "curve": [[0, start], *curve], "iterations": curve[-1][0],
          "num_tasks": _operative_int(workdir, "configs.EvalConfig.num_tasks")}


def _operative_int(workdir: pathlib.Path, parameter: str) -> int | None:
  """An integer `parameter` as the run's operative config recorded it (None without one)."""
  path = workdir / "operative_config.gin"
  if not path.exists():
    return None
  for line in path.read_text().splitlines():
    if line.startswith(f"{parameter} = "):
      return int(line.rsplit("=", 1)[1])
  return None


def run_one(spec: EnvRun, seed: int, runs_dir: str | os.PathLike[str], *,
            log=print) -> dict[str, Any]:
  """Runs (or resumes, or reads back) one (env, seed); returns `read_run`'s figures plus timing."""
  workdir = workdir_of(runs_dir, spec.env, seed)
  done = workdir / RESULT_FILE
  if done.exists():
    return json.loads(done.read_text())
  workdir.mkdir(parents=True, exist_ok=True)
  start = time.perf_counter()
  prepared = workdir / "prepared"
  if spec.prepare and not prepared.exists():
    _launch(spec, seed, workdir, spec.prepare_argv(seed, str(workdir)), runs_dir)
    prepared.touch()
  _launch(spec, seed, workdir, [str(RUN_PY), *spec.argv(seed, str(workdir))], runs_dir)
  result = {**read_run(workdir), "env": spec.env, "seed": seed, "gin_file": spec.gin_file,
            "bindings": list(spec.bindings), "wall_s": time.perf_counter() - start,
            "code_version": code_version()}
  done.write_text(json.dumps(result, indent=1))
  log(f"{spec.env} seed {seed}: before {result['before']:.3f}, warm start "
      f"{result['warm_start']}, after {result['after']:.3f} ({result['wall_s']:.0f} s)")
  return result


# The packages whose builds decide a run's floating-point path: a many-step clone made under
# another build of these need not come out the same (see `paired_difference`).
NUMERIC_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")


def code_version() -> dict[str, Any]:
  """What a run was made with: the repository commit (None outside git), whether the tree had
  uncommitted changes, and the versions of `NUMERIC_PACKAGES`."""
  def git(*args):
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
  head = git("rev-parse", "HEAD")
  dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
  packages = {}
  for name in NUMERIC_PACKAGES:
    try:
      packages[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      packages[name] = None
  return {"commit": head.stdout.strip() if head.returncode == 0 else None,
          "dirty": bool(dirty) if head.returncode == 0 else None, "packages": packages}


def launch_environment(runs_dir: str | os.PathLike[str],
                       environ: Mapping[str, str]) -> dict[str, str]:
  """The environment of a run's process: `environ` plus one on-disk compilation cache for every
  run of the suite (`<runs_dir>/jax_cache`, unless `environ` names one), every program cached.

  The suite's runs rebuild the same sampling, evaluation and update programs for each seed and
  method; with the cache a later run loads them instead of compiling (a short quickstart run on 2
  loaded cores: 101 s with an empty cache, 71 s with a filled one). XLA keys each entry on the
  program and its compile options, so a hit is the program a compile would give.
  """
  env = dict(environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(runs_dir) / "jax_cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
  return env


def _launch(spec: EnvRun, seed: int, workdir: pathlib.Path, argv: Sequence[str],
            runs_dir: str | os.PathLike[str]) -> None:
  """Runs `python argv...` from the repository root, its output appended to the run's log."""
  log_file = workdir / "suite_log.txt"
  with open(log_file, "a", encoding="utf-8") as out:
    process = subprocess.run([sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT,
                             cwd=REPO, check=False, env=launch_environment(runs_dir, os.environ))
  if process.returncode == preemption.EXIT_STOPPED:
    raise RuntimeError(f"{spec.env} seed {seed}: stopped before its last iteration (exit "
                       f"{process.returncode}); the next pass resumes it from its checkpoint")
  if process.returncode != 0:
    raise RuntimeError(f"{spec.env} seed {seed}: {pathlib.Path(argv[0]).name} exited with "
                       f"{process.returncode}; see {log_file}")


def interval(values: Sequence[float | None]) -> dict[str, Any] | None:
  """Mean and 95% Student-t interval over seeds, clipped to [0, 1] (a success rate); None where
  the figure does not exist. One seed has no interval: its bounds are None (JSON has no NaN)."""
  if any(v is None for v in values) or not values:
    return None
  mean, low, high = fits.mean_confidence_band(np.asarray(values, np.float64)[:, None])
  if len(values) == 1:
    return {"mean": float(mean[0]), "low": None, "high": None, "n": 1}
  return {"mean": float(mean[0]), "low": float(np.clip(low[0], 0, 1)),
          "high": float(np.clip(high[0], 0, 1)), "n": len(values)}


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Per env: the untrained, warm-start and after-RL intervals, and the curve band over seeds."""
  by_env: dict[str, list[dict[str, Any]]] = {}
  for r in results:
    by_env.setdefault(r["env"], []).append(r)
  summary = {}
  for env, runs in by_env.items():
    runs = sorted(runs, key=lambda r: r["seed"])
    iterations = [it for it, _ in runs[0]["curve"]]
    same_grid = all([it for it, _ in r["curve"]] == iterations for r in runs)
    band = None
    if same_grid:
      mean, low, high = fits.mean_confidence_band(
          np.asarray([[s for _, s in r["curve"]] for r in runs], np.float64))
      one = len(runs) == 1  # no interval from one seed (and JSON has no NaN)
      band = {"iteration": iterations, "mean": mean.tolist(),
              "low": None if one else low.tolist(), "high": None if one else high.tolist()}
    before = interval([r["before"] for r in runs])
    one_clone = is_one_clone(runs)
    warm = clone_interval(runs[0]) if one_clone else interval([r["warm_start"] for r in runs])
    after = interval([r["after"] for r in runs])
    start = warm or before
    summary[env] = {
        "seeds": [r["seed"] for r in runs], "gin_file": runs[0]["gin_file"],
        "one_clone": one_clone,
        "untrained": before, "warm_start": warm, "after_rl": after, "curve": band,
        # The goals: above the untrained policy, and RL above its starting point, each with
        # intervals that do not overlap.
        "rl_above_untrained": bool(len(runs) > 1 and after["low"] > before["high"]),
        "rl_above_start": bool(len(runs) > 1 and after["low"] > start["high"]),
        "rl_gain": rl_gain(runs),
        "wall_s": [r["wall_s"] for r in runs]}
  for env in summary:
    baseline = grpo_row_of(env, summary)
    summary[env]["against_grpo"] = baseline and paired_difference(results, env, baseline)
  return summary


def is_one_clone(runs: Sequence[dict[str, Any]]) -> bool:
  """Whether every seed of the row started from one clone (`TrainConfig.init_seed` bound)."""
  return any(b.replace(" ", "").startswith("configs.TrainConfig.init_seed=")
             for b in runs[0]["bindings"])


def clone_interval(run: Mapping[str, Any]) -> dict[str, Any]:
  """The one clone's held-out success with its exact binomial 95% interval over the tasks.

  Every seed of a one-clone row starts from the same policy, so the seeds show no spread of the
  start; what is uncertain about it is the finite task sample, which this interval measures.

  Raises:
    ValueError: the run's held-out task count was not recorded.
  """
  n = run.get("num_tasks")
  if not n:
    raise ValueError(f"{run['env']} seed {run['seed']}: one-clone row without num_tasks")
  k = round(run["warm_start"] * n)
  low, high = binomial.clopper_pearson(k, n)
  return {"mean": k / n, "low": low, "high": high, "n": 1, "over": f"{n} held-out tasks"}


# The plain-GRPO row a method row of another env is paired with (at the same final iteration).
_ENV_OF_METHOD = MappingProxyType({"gca_search_qa": "search_qa", "t1_terminal": "terminal",
                                   "progress_sql": "sql", "socialrl_dialogue": "negotiation",
                                   "textworld_express_coin_charge": "textworld_express"})
# RL-share rows that keep their env row's clone and budget and change only how RL samples: each
# seed's clone is the env row's, so the pairing isolates the sampling.
_ENV_OF_VARIANT = MappingProxyType({
    "negotiation_sharp": "negotiation", "search_qa_sharp": "search_qa",
    "textworld_express_fewest_charge": "textworld_express_fewest_clone100",
    "search_qa_fresh_corpora": "search_qa_sharp",
    "textworld_express_noisy_clone100": "textworld_express_fewest_clone100"})
_ENV_ROW_OF = MappingProxyType({**_ENV_OF_METHOD, **_ENV_OF_VARIANT})
GRPO_GIN = "quickstart.gin"  # the FrozenLake GRPO rows' config


def grpo_row_of(env: str, summary: Mapping[str, Any]) -> str | None:
  """The plain-GRPO row `env`'s method (or sampling-variant) row compares with: the same env,
  warm start and budget.

  FrozenLake method rows pair with the quickstart row whose curve ends at the same iteration
  (`frozenlake` at 100, `grpo_frozenlake_<n>` at n); the other envs' with their env row when its
  budget is the same. None where that row has not been run (or `env` is not a method row).
  """
  if env not in (*METHOD_CONFIGS, *_ENV_OF_VARIANT) or summary.get(env, {}).get("curve") is None:
    return None
  last = summary[env]["curve"]["iteration"][-1]
  if env.endswith("_frozenlake"):
    candidates = [name for name, s in summary.items() if s["gin_file"] == GRPO_GIN]
  else:
    candidates = [_ENV_ROW_OF[env]] if _ENV_ROW_OF.get(env) in summary else []
  for name in candidates:
    curve = summary[name]["curve"]
    if curve is not None and curve["iteration"][-1] == last:
      return name
  return None


def _paired_band(diffs: Sequence[float]) -> dict[str, Any]:
  """Mean and 95% Student-t interval of per-seed differences, not clipped."""
  mean, low, high = fits.mean_confidence_band(np.asarray(diffs, np.float64)[:, None])
  return {"mean": float(mean[0]), "low": float(low[0]), "high": float(high[0]), "n": len(diffs)}


def rl_gain(runs: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
  """After-RL success minus the run's own starting point (the warm start, else untrained), paired
  by seed: each seed's RL starts from that seed's clone, so the seed-to-seed spread of the clones
  (often wider than what RL adds) cancels. None under two seeds."""
  if len(runs) < 2 or any(r["after"] is None for r in runs):
    return None
  start = [r["before"] if r["warm_start"] is None else r["warm_start"] for r in runs]
  if any(v is None for v in start):
    return None
  return _paired_band([r["after"] - s for r, s in zip(runs, start)])


def paired_difference(results: Sequence[dict[str, Any]], env: str,
                      baseline: str) -> dict[str, Any] | None:
  """`env`'s after-RL success minus `baseline`'s, paired by seed: mean and 95% Student-t
  interval over the seeds both have, not clipped.

  The pairing assumes a seed's warm start is the same for both rows. Where it is not on some
  seed (a run made under other code, or a clone that did not reproduce), the after-RL gap would
  mix the clones' gap into the method's: the difference is then taken between the two RL gains
  (after RL minus the run's own start, a difference in differences), `measure` says "rl_gain"
  and `warm_starts_differ` lists the seeds.
  """
  by_key = {(r["env"], r["seed"]): r for r in results}
  seeds = sorted(seed for e, seed in by_key if e == env and (baseline, seed) in by_key)
  if len(seeds) < 2:
    return None
  start = {key: (r["before"] if r["warm_start"] is None else r["warm_start"])
           for key, r in by_key.items()}
  differ = [s for s in seeds if abs(start[env, s] - start[baseline, s]) > WARM_START_TOLERANCE]
  if differ:
    diffs = [(by_key[env, s]["after"] - start[env, s])
             - (by_key[baseline, s]["after"] - start[baseline, s]) for s in seeds]
  else:
    diffs = [by_key[env, s]["after"] - by_key[baseline, s]["after"] for s in seeds]
  return {"baseline": baseline, "measure": "rl_gain" if differ else "after_rl",
          "warm_starts_differ": differ, **_paired_band(diffs)}


# Success rates are k / num_tasks read back from float32 logs: equal clones agree to ~1e-7.
WARM_START_TOLERANCE = 1e-6


def restore_runs(records: Sequence[dict[str, Any]], runs_dir: str | os.PathLike[str]) -> int:
  """Writes each finished run of an earlier results file where `run_one` reads it back.

  A run already finished in `runs_dir` is kept as it is. Returns how many were restored, so a
  suite finished in parts on different machines (or sessions) keeps every run it has recorded.
  """
  restored = 0
  for record in records:
    done = workdir_of(runs_dir, record["env"], int(record["seed"])) / RESULT_FILE
    if not done.exists():
      done.parent.mkdir(parents=True, exist_ok=True)
      done.write_text(json.dumps(record, indent=1))
      restored += 1
  return restored


def run_suite(specs: Sequence[EnvRun], seeds: Sequence[int], runs_dir: str | os.PathLike[str],
              *, log=print, parallel: int = 1) -> list[dict[str, Any]]:
  """Every (env, seed), env by env, `parallel` runs at a time; a failed or stopped run is logged
  and left for the next pass (which resumes it from its checkpoint).

  Each run is its own `run.py` process, so parallel runs share the machine's cores and memory:
  on a many-core host several seeds fit side by side; on a small one they slow each other.
  The results keep the (env, seed) order whatever order the runs finish in.
  """
  if not isinstance(parallel, int) or parallel < 1:
    raise ValueError(f"parallel must be a positive int (runs at a time), got {parallel!r}")
  jobs = [(spec, seed) for spec in specs for seed in seeds]

  def attempt(job):
    try:
      return run_one(*job, runs_dir, log=log)
    except (RuntimeError, ValueError) as e:
      log(f"failed: {e}")
      return None

  # Threads only wait on their run's process; the work happens in the processes.
  with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
    results = list(pool.map(attempt, jobs))
  return [r for r in results if r is not None]


def table(summary: dict[str, Any]) -> str:
  """The markdown table the README quotes: held-out greedy success, mean [95% interval]."""
  def cell(x):
    if x is None:
      return "—"
    if x["low"] is None:
      return f"{x['mean']:.3f} (one seed)"
    over = f" (one clone; over its {x['over']})" if "over" in x else ""
    return f"{x['mean']:.3f} [{x['low']:.3f}, {x['high']:.3f}]{over}"
  def paired(x, versus=""):
    return "—" if x is None else f"{x['mean']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]{versus}"
  lines = ["| env | seeds | untrained | after warm start | after RL | RL − its start, paired | "
           "after RL − GRPO, paired |", "|---|---|---|---|---|---|---|"]
  for env, s in summary.items():
    grpo = s.get("against_grpo")
    versus = f" vs {grpo['baseline']}" if grpo else ""
    if grpo and grpo.get("measure") == "rl_gain":
      versus += " (RL gains compared: warm starts differ)"
    lines.append(f"| {env} | {len(s['seeds'])} | {cell(s['untrained'])} | "
                 f"{cell(s['warm_start'])} | {cell(s['after_rl'])} | {paired(s.get('rl_gain'))} | "
                 f"{paired(grpo, versus)} |")
  return "\n".join(lines)
