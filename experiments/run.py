r"""The entry point: flags -> gin config -> `learner.run(workdir=...)`.

  python experiments/run.py --gin_file=experiments/configs/quickstart.gin \
      --gin_bindings='learner.train.num_iterations = 20' --workdir=/tmp/quickstart

Everything but the workdir is bound in gin (`learner.train.<arg> = ...`). The training loop is
`learner.run.entry`: online RL (`@learner.train`) unless a config binds another
(`learner.run.entry = @drift.train`). A missing file, a
misspelled binding, a value of the wrong type, a config that binds nothing or an unusable workdir
fails before any compute with a one-line error naming it (exit status 2). A run stopped by
SIGTERM, Ctrl-C or a preemption notice writes a checkpoint and exits with status 75
(`preemption.EXIT_STOPPED`); the same command resumes it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pathlib
import re
import sys
from collections.abc import Sequence

import gin

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  # Running from a checkout without `pip install -e .`: the package sits beside experiments/.
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax import config_errors  # noqa: E402
from agentrl_jax.learner import metrics  # noqa: E402
from agentrl_jax.parallel import host_memory  # noqa: E402

LEARNER_MODULE = "agentrl_jax.learner.learner"
# Command-line bindings may name `learner.train` even when no file imports it.
DEFAULT_IMPORTS = ("from agentrl_jax.learner import learner",)
# Parsed before the files, which may bind another loop; it also registers `learner.run` with gin.
DEFAULT_BINDINGS = ("learner.run.entry = @learner.train",)
RUNS_DIR = "runs"
QUICKSTART_CONFIG = "experiments/configs/quickstart.gin"
TRAIN_CONFIG = "agentrl_jax.learner.configs.TrainConfig"

# The learner calls this after step 0; re-exported here as part of the entry point's API.
write_operative_config = metrics.write_operative_config


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description="Train an LLM agent with agentrl_jax; everything else is bound in gin.")
  parser.add_argument("--gin_file", action="append", default=[],
                      help="gin config file; repeatable, parsed in order")
  parser.add_argument("--gin_bindings", action="append", default=[],
                      help="gin binding such as 'learner.train.num_iterations = 3'; repeatable, "
                           "applied after the files")
  parser.add_argument("--gin_search_path", action="append", default=[],
                      help="directory searched for gin files and their includes; repeatable")
  parser.add_argument("--workdir", default=None,
                      help="where checkpoints, metrics and configs go (default: runs/<stem of "
                           "the first --gin_file>)")
  parser.add_argument("--allow_config_change", action="store_true",
                      help="resume a workdir's checkpoint under a config that differs from the "
                           "one recorded there; the change is logged to config_changes.jsonl")
  return parser.parse_args(argv)


def default_workdir(gin_files: Sequence[str]) -> str:
  if not gin_files:
    raise config_errors.ConfigError("--workdir is required when no --gin_file is given")
  return os.path.join(RUNS_DIR, pathlib.Path(gin_files[0]).stem)


def configure(args: argparse.Namespace) -> str:
  """Parses the gin config and writes it to the workdir; returns the workdir."""
  gin.clear_config()  # a second run in the same process must not inherit the first one's bindings
  defaults = config_errors.parse_config(
      args.gin_file, args.gin_bindings, search_paths=args.gin_search_path,
      default_imports=DEFAULT_IMPORTS, default_bindings=DEFAULT_BINDINGS)
  config_errors.require_bindings(f"--gin_file={QUICKSTART_CONFIG}", defaults)
  check_env_requirements()
  workdir = args.workdir or default_workdir(args.gin_file)
  metrics.check_workdir(workdir)
  metrics.check_resumed_config(workdir, allow_change=args.allow_config_change)
  metrics.write_config(workdir)
  return workdir


def check_env_requirements() -> None:
  """Fails at launch when the configured env's package or program is missing (one line).

  Raises:
    config_errors.ConfigError: a `registry.MissingDependencyError` naming the install hint.
  """
  try:
    name = gin.query_parameter(f"{TRAIN_CONFIG}.env_name")
  except ValueError:  # not bound: TrainConfig's default env needs nothing
    return
  # Imported only here: the env modules are light, but run.py's flag parsing needs none of them.
  envs = importlib.import_module("agentrl_jax.envs")
  if isinstance(name, str) and name in envs.registry.names():
    envs.registry.check_requirements(name)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_flags(argv)
  try:
    workdir = configure(args)
  except config_errors.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  _initialize_distributed()
  try:
    # A config class's bad value, or a conflict the loop finds before computing, is a
    # ConfigError; gin re-raises it under the same type with the configurable's name appended.
    outcome = configured_run()(workdir=workdir)
  except config_errors.ConfigError as e:
    print(f"error: {_first_line(str(e))}", file=sys.stderr)
    return 2
  return exit_code(outcome)


def exit_code(outcome) -> int:
  """0 for a run that reached its last iteration; `preemption.EXIT_STOPPED` for one stopped
  before it (by SIGTERM, Ctrl-C or a preemption notice) with a checkpoint the same command
  resumes from."""
  if not getattr(outcome, "preempted", False):
    return 0
  return importlib.import_module("agentrl_jax.learner.preemption").EXIT_STOPPED


def _initialize_distributed() -> None:
  """Joins a multi-process job before any device is touched: explicit JAX_COORDINATOR_ADDRESS /
  JAX_NUM_PROCESSES / JAX_PROCESS_ID (tpu/gpu_launch.sh), else any multi-host cluster JAX detects
  (Cloud TPU VM or GKE slices, SLURM, Open MPI); see `multihost.initialize_from_environment`.
  """
  importlib.import_module("agentrl_jax.parallel.multihost").initialize_from_environment(os.environ)


def configured_run():
  """`learner.run` with the parsed config's bindings (its `entry` is the training loop).

  The learner is imported only here: it pulls in jax and the whole library, which flag parsing
  and config errors do not need.
  """
  return gin.get_configurable(importlib.import_module(LEARNER_MODULE).run)


def _first_line(message: str) -> str:
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  where = next((line for line in lines if line.startswith("In call to configurable")), "")
  where = re.sub(r" \(<.*>\)$", "", where)
  return lines[0] + (f" ({where})" if where and where != lines[0] else "") if lines else message


if __name__ == "__main__":
  # Before JAX starts its CPU backend: reuse freed host memory instead of page-faulting XLA's
  # per-step buffers in again (agentrl_jax/parallel/host_memory.py). Only for the command line:
  # a process that imports run.main (tests, notebooks) keeps its own allocator settings.
  host_memory.keep_freed_memory()
  sys.exit(main())
