"""Two JAX processes on loopback (CPU collectives) run one sharded update and agree."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from agentrl_jax.parallel import multihost
import test_sharded_update as setup_lib

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_host_share_splits_contiguously():
  assert [multihost.host_share(12, i, 3) for i in range(3)] == [slice(0, 4), slice(4, 8), slice(8, 12)]
  with pytest.raises(ValueError, match="10 items do not split evenly over 3 processes"):
    multihost.host_share(10, 0, 3)


def test_config_needs_the_whole_address():
  with pytest.raises(ValueError, match="needs num_processes and process_id"):
    multihost.MultihostConfig(enabled=True, coordinator_address="localhost:1234")
  with pytest.raises(ValueError, match="process_id must be in"):
    multihost.MultihostConfig(num_processes=2, process_id=2)


@pytest.mark.slow
def test_two_processes_run_a_sharded_update_and_agree(tmp_path):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  outs = [str(tmp_path / f"p{i}.npz") for i in range(2)]
  procs = [subprocess.Popen([sys.executable, WORKER, str(port), str(i), outs[i]], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  for p in procs:
    try:
      log, _ = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, log[-3000:]
  a, b = (np.load(o) for o in outs)
  assert sorted(a.files) == sorted(b.files)
  for k in a.files:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # Only process 0 wrote its marker file.
  assert os.path.exists(outs[0] + ".writer") and not os.path.exists(outs[1] + ".writer")
  # And both equal the single-process, single-device update.
  want_params, want_metrics = setup_lib._single_device_result()
  for i, w in enumerate(jax.tree.leaves(want_params)):
    np.testing.assert_allclose(a[str(i)], w, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(a["loss"], want_metrics["loss/policy"], atol=1e-5)
