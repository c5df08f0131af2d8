"""Test-wide setup: 8 fake CPU devices so every sharding path runs on one host."""

import atexit
import os
import shutil
import tempfile

# Must precede the first `import jax` anywhere in the test session.
# Tests compile hundreds of small programs and run each for milliseconds, so LLVM's optimisation
# passes cost far more than they save: level 0 cuts a tiny training run's CPU time by a third. It
# changes code generation, so float rounding may differ in the last bit, never what a program
# computes (the reference-parity tests run under it, at their tolerances). Subprocesses that set
# their own XLA_FLAGS add `AGENTRL_JAX_TEST_COMPILE_FLAGS` to them.
os.environ.setdefault("AGENTRL_JAX_TEST_COMPILE_FLAGS", "--xla_backend_optimization_level=0")
# A loaded 2-core machine can stall one of 8 fake devices past XLA's 40 s collective timeout.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=900 "
                      + os.environ["AGENTRL_JAX_TEST_COMPILE_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One on-disk compilation cache for the session, shared by pytest-xdist workers and by the
# `experiments/run.py` subprocesses (they inherit the environment): many tests build the same
# tiny programs afresh, and on 2 cores compiling them again is most of the suite's time. XLA keys
# each entry on the program and its compile options, so a hit is the program a compile would give.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="agentrl_jax_test_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


# The test files that each take a worker more than a minute (measured with --durations on 2
# cores), heaviest first, then every other file that launches runs (`integration`), then the
# rest. pytest-xdist hands files out in this order (pytest.ini: --no-loadscope-reorder), so the
# long ones start early: started last, one of them would leave the other worker idle for its
# whole length.
HEAVY_FIRST = (
    "tests/studies/test_method_configs_tiny.py", "tests/notebooks/test_notebooks.py",
    "tests/studies/test_transformer_snr.py", "tests/offline/test_offline_e2e.py",
    "tests/models/test_gguf.py", "tests/integration/test_multihost_run.py",
    "tests/rollout/test_growing_cache.py", "tests/integration/test_learns.py",
    "tests/learner/test_driver_methods.py", "tests/models/test_gguf_rollout.py",
)


def pytest_collection_modifyitems(config, items):
  del config
  launches = {item.nodeid.split("::")[0] for item in items
              if item.get_closest_marker("integration") is not None}

  def rank(item):
    path = item.nodeid.split("::")[0]
    if path in HEAVY_FIRST:
      return HEAVY_FIRST.index(path)
    return len(HEAVY_FIRST) + (0 if path in launches else 1)

  # Stable: files keep their order within a rank, and tests their order within a file.
  items.sort(key=rank)
