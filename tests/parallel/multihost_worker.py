"""One process of the two-process test: joins the cluster on loopback, runs a sharded update.

Usage: python multihost_worker.py <port> <process_id> <out.npz>
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
# Raised collective limits: on a loaded machine a rendezvous may exceed the default 40 s.
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=2 "
                           "--xla_cpu_collective_call_terminate_timeout_seconds=900 "
                           "--xla_cpu_collective_timeout_seconds=900 "
                           + os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", ""))

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.parallel import mesh as mesh_lib  # noqa: E402
from agentrl_jax.parallel import multihost  # noqa: E402
from agentrl_jax.parallel import rules as rules_lib  # noqa: E402
import test_sharded_update as setup_lib  # noqa: E402


def main(port: int, process_id: int, out: str) -> None:
  multihost.initialize(multihost.MultihostConfig(
      enabled=True, coordinator_address=f"localhost:{port}", num_processes=2,
      process_id=process_id))
  assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.device_count())
  mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(data=1, fsdp=-1))
  init, update = setup_lib._setup()
  state = rules_lib.create_sharded(init, mesh)
  traj = setup_lib._trajectories()
  mine = jax.tree.map(lambda x: x[multihost.host_share(x.shape[0])], traj)
  new_state, metrics = update(state, multihost.global_batch(mine, mesh))
  params = multihost.gather_to_host(new_state.policy_params)
  flat = {str(i): np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))}
  flat["loss"] = np.asarray(multihost.gather_to_host(metrics["loss/policy"]))
  np.savez(out, **flat)
  multihost.on_writer(lambda: open(out + ".writer", "w").close())


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
