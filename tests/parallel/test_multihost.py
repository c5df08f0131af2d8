"""Multi-process start-up (which branch `initialize_from_environment` takes) and two JAX processes
on loopback (CPU collectives) running one sharded update that agrees."""

import glob
import os
import pathlib
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


class _Recorder:
  """Stands in for `jax.distributed.initialize`: records each call's arguments."""

  def __init__(self):
    self.calls = []

  def __call__(self, *args, **kwargs):
    self.calls.append((args, kwargs))


def _no_metadata(key):
  del key
  return None


def _start(environ, tpu_metadata=_no_metadata):
  recorder = _Recorder()
  how = multihost.initialize_from_environment(environ, initialize=recorder,
                                              tpu_metadata=tpu_metadata)
  return how, recorder.calls


def test_explicit_coordinator_passes_address_count_and_id():
  how, calls = _start({"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234", "JAX_NUM_PROCESSES": "4",
                       "JAX_PROCESS_ID": "3"})
  assert how == "explicit"
  assert calls == [(("10.0.0.2:1234", 4, 3), {})]


def test_explicit_coordinator_wins_over_a_detected_cluster():
  how, calls = _start({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2",
                       "JAX_PROCESS_ID": "0", "TPU_WORKER_HOSTNAMES": "a,b,c,d"})
  assert how == "explicit" and calls == [(("h:1", 2, 0), {})]


def test_explicit_coordinator_without_count_or_id_fails_naming_them():
  recorder = _Recorder()
  with pytest.raises(ValueError, match="needs JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
    multihost.initialize_from_environment({"JAX_COORDINATOR_ADDRESS": "h:1"},
                                          initialize=recorder, tpu_metadata=_no_metadata)
  with pytest.raises(ValueError, match="needs JAX_PROCESS_ID in"):
    multihost.initialize_from_environment({"JAX_COORDINATOR_ADDRESS": "h:1",
                                           "JAX_NUM_PROCESSES": "2"},
                                          initialize=recorder, tpu_metadata=_no_metadata)
  assert recorder.calls == []


def test_cloud_tpu_vm_slice_with_several_workers_lets_jax_detect_the_rest():
  asked = []

  def metadata(key):
    asked.append(key)
    return "10.0.0.1:8470,10.0.0.2:8470" if key == "worker-network-endpoints" else None

  how, calls = _start({}, tpu_metadata=metadata)
  assert how == "cloud_tpu_vm" and calls == [((), {})]
  assert asked == ["worker-network-endpoints"]


def test_single_host_cloud_tpu_vm_starts_nothing():
  how, calls = _start({}, tpu_metadata=lambda key: "10.0.0.1:8470")
  assert how is None and calls == []


def test_multislice_single_host_slices_are_still_several_processes():
  how, calls = _start({"MEGASCALE_NUM_SLICES": "2"}, tpu_metadata=lambda key: "10.0.0.1:8470")
  assert how == "cloud_tpu_vm" and calls == [((), {})]


@pytest.mark.parametrize("variable", ["TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES"])
def test_gke_tpu_slice(variable):
  assert _start({variable: "w-0,w-1"}) == ("gke_tpu", [((), {})])
  assert _start({variable: "w-0"}) == (None, [])


def test_slurm_step_with_several_tasks():
  slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2",
           "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}
  assert _start(slurm) == ("slurm", [((), {})])
  assert _start(dict(slurm, SLURM_NTASKS="1")) == (None, [])
  # An allocation without a step (salloc, no srun) is not a cluster JAX detects.
  assert _start({k: v for k, v in slurm.items() if k != "SLURM_STEP_NODELIST"}) == (None, [])


def test_open_mpi_job():
  ompi = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
          "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}
  assert _start(ompi) == ("ompi", [((), {})])
  assert _start(dict(ompi, OMPI_COMM_WORLD_SIZE="1")) == (None, [])
  # The size alone (no mpirun URI) is not what JAX's detector keys on.
  assert _start({"OMPI_COMM_WORLD_SIZE": "4"}) == (None, [])


def test_plain_workstation_starts_nothing():
  assert _start({"HOME": "/home/me", "PATH": "/usr/bin"}) == (None, [])


@pytest.mark.skipif(multihost._GOOGLE_PCI_VENDOR in "".join(
    pathlib.Path(p).read_text() for p in glob.glob("/sys/bus/pci/devices/*/vendor")),
                    reason="this host has a TPU chip: the default lookup asks the metadata server")
def test_default_metadata_lookup_is_skipped_off_tpu_hosts():
  """Without a fake lookup, this (TPU-less) host never asks a metadata server."""
  recorder = _Recorder()
  assert multihost.initialize_from_environment({}, initialize=recorder) is None
  assert multihost.initialize_from_environment({"TPU_SKIP_MDS_QUERY": "1"},
                                               initialize=recorder) is None
  assert recorder.calls == []
