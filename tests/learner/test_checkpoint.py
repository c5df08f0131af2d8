"""Tests for agentrl_jax.learner.checkpoint: round trips, pruning, partial and corrupt steps."""

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.learner import checkpoint

# When a read of a damaged step fails, orbax can close its event loop before a pending
# tensorstore callback runs; the resulting "Event loop is closed" is orbax-internal noise.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _mesh():
  return jax.make_mesh((8,), ("data",))


def _state(offset: float = 0.0):
  """A nested pytree with a replicated, a sharded, an integer and a PRNG-key leaf."""
  sharded = jax.device_put(
      jnp.arange(32 * 3, dtype=jnp.float32).reshape(32, 3) + offset,
      jax.NamedSharding(_mesh(), jax.P("data", None)))
  return {
      "policy": {"w": jnp.full((4, 5), 1.5 + offset, jnp.bfloat16), "sharded": sharded},
      "step": jnp.asarray(int(offset), jnp.int32),
      "rng": jax.random.key(int(offset)),
  }


def _abstract(state):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _assert_trees_equal(a, b):
  a = jax.tree.map(lambda x: jax.random.key_data(x) if jnp.issubdtype(
      x.dtype, jax.dtypes.prng_key) else x, a)
  b = jax.tree.map(lambda x: jax.random.key_data(x) if jnp.issubdtype(
      x.dtype, jax.dtypes.prng_key) else x, b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _array_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  """The data files tensorstore wrote for the state item (not metadata)."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files, f"no array data files found under {step_dir}"
  return files


def test_round_trip_restores_values_shardings_and_extra(tmp_path):
  state = _state(offset=2.0)
  extra = {"iteration": 7, "seed_cursor": 123, "history": [{"loss": 0.5}]}
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(7, state, extra)
    restored, restored_extra = ckpt.restore(target=_abstract(state))

  _assert_trees_equal(restored, state)
  assert restored_extra == extra
  sharded = restored["policy"]["sharded"]
  assert sharded.sharding == state["policy"]["sharded"].sharding
  assert len(sharded.addressable_shards) == 8
  assert sharded.addressable_shards[0].data.shape == (4, 3)


def test_restore_accepts_concrete_arrays_as_template(tmp_path):
  state = _state(offset=1.0)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state)
    restored, extra = ckpt.restore(target=_state(offset=5.0))
  _assert_trees_equal(restored, state)
  assert extra == {}


def test_latest_step_and_max_to_keep_pruning(tmp_path):
  with checkpoint.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    assert ckpt.latest_step() is None
    for step in (10, 20, 30, 40):
      ckpt.save(step, _state(offset=step), {"iteration": step})
    assert ckpt.latest_step() == 40
    assert ckpt.all_steps() == [30, 40]
    state, extra = ckpt.restore(target=_abstract(_state()))
    assert extra == {"iteration": 40}
    _assert_trees_equal(state, _state(offset=40))
    _, extra = ckpt.restore(30, target=_abstract(_state()))
    assert extra == {"iteration": 30}
  # A new Checkpointer over the same workdir (a restarted job) sees the same steps.
  assert checkpoint.Checkpointer(tmp_path).latest_step() == 40


def test_save_rejects_a_step_not_newer_than_latest(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(5, _state())
    with pytest.raises(ValueError, match="not newer than the latest step 5"):
      ckpt.save(5, _state())


def test_save_rejects_non_json_extra(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(TypeError, match="extra\\['cursor'\\]"):
      ckpt.save(1, _state(), {"cursor": object()})
    assert ckpt.latest_step() is None


def test_unfinalised_temporary_step_is_never_listed_or_restored(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state(offset=1.0), {"iteration": 1})
    ckpt.save(2, _state(offset=2.0), {"iteration": 2})
    # A crash mid-save leaves orbax's temporary directory behind: copy a real step's content
    # under the temporary name orbax uses, as if the rename never happened.
    ckpt_dir = pathlib.Path(ckpt.directory)
    shutil.copytree(ckpt_dir / "2", ckpt_dir / "3.orbax-checkpoint-tmp-1732950000123456")

    assert ckpt.latest_step() == 2
    assert ckpt.all_steps() == [1, 2]
    _, extra = ckpt.restore(target=_abstract(_state()))
    assert extra == {"iteration": 2}
    assert ckpt.restored_step == 2


@pytest.mark.parametrize("damage", ["delete", "truncate", "flip"])
def test_corrupt_latest_step_warns_and_falls_back(tmp_path, capsys, damage):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state(offset=1.0), {"iteration": 1})
    ckpt.save(2, _state(offset=2.0), {"iteration": 2})
    step_dir = pathlib.Path(ckpt.step_path(2))
    for f in _array_files(step_dir):
      data = f.read_bytes()
      if damage == "delete":
        f.unlink()
      elif damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
      else:  # One flipped bit in the middle of every data file.
        mid = len(data) // 2
        f.write_bytes(data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1:])

    state, extra = ckpt.restore(target=_abstract(_state()))

    (message,) = capsys.readouterr().err.strip().splitlines()
    assert message.startswith("warning: ") and "step 2" in message and str(step_dir) in message
    assert extra == {"iteration": 1}
    assert ckpt.restored_step == 1
    _assert_trees_equal(state, _state(offset=1.0))
    # The corrupt step is moved aside, so training can save step 2 again.
    assert ckpt.all_steps() == [1]
    assert len(os.listdir(tmp_path / checkpoint.QUARANTINE_DIR)) == 1
    ckpt.save(2, _state(offset=3.0), {"iteration": 2})
    _, extra = ckpt.restore(target=_abstract(_state()))
    assert extra == {"iteration": 2}


def test_a_finalised_step_missing_its_manifest_is_skipped(tmp_path, capsys):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state(offset=1.0), {"iteration": 1})
    ckpt.save(2, _state(offset=2.0), {"iteration": 2})
    shutil.rmtree(pathlib.Path(ckpt.step_path(2)) / "manifest")
    _, extra = ckpt.restore(target=_abstract(_state()))
    assert extra == {"iteration": 1}
    assert "step 2" in capsys.readouterr().err


def test_silently_changed_data_is_caught_by_the_fingerprint(tmp_path, capsys):
  # Storage layers checksum most damage themselves (the test above); this covers what they miss,
  # data that reads back cleanly but differs from what was saved, by editing the recorded
  # fingerprint instead of the data.
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state(offset=1.0), {"iteration": 1})
    ckpt.save(2, _state(offset=2.0), {"iteration": 2})
    manifest_file = pathlib.Path(ckpt.step_path(2)) / "manifest" / "metadata"
    manifest = json.loads(manifest_file.read_text())
    manifest["leaves"]["['policy']['w']"]["fingerprint"] += 1
    manifest_file.write_text(json.dumps(manifest))
    _, extra = ckpt.restore(target=_abstract(_state()))
    assert extra == {"iteration": 1}
    assert re.search(r"step 2 .*leaf \['policy'\]\['w'\] does not match", capsys.readouterr().err)


def test_explicitly_requested_corrupt_step_raises(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state())
    for f in _array_files(pathlib.Path(ckpt.step_path(1))):
      f.unlink()
    with pytest.raises(checkpoint.CorruptCheckpointError, match="step 1"):
      ckpt.restore(1, target=_abstract(_state()))


def test_every_step_corrupt_raises(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state())
    for f in _array_files(pathlib.Path(ckpt.step_path(1))):
      f.unlink()
    with pytest.raises(checkpoint.CorruptCheckpointError, match="every checkpoint step"):
      ckpt.restore(target=_abstract(_state()))


def test_restore_without_checkpoint_raises_file_not_found(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(FileNotFoundError):
      ckpt.restore(target=_abstract(_state()))
    with pytest.raises(FileNotFoundError, match="step 3"):
      ckpt.restore(3, target=_abstract(_state()))


def test_shape_mismatch_names_the_leaf(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state())
    target = _abstract(_state())
    target["policy"]["w"] = jax.ShapeDtypeStruct((4, 6), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"\['policy'\]\['w'\].*\(4, 6\).*\(4, 5\)"):
      ckpt.restore(target=target)
    # A caller error is not corruption: the step stays.
    assert ckpt.all_steps() == [1]


def test_structure_mismatch_names_the_leaf(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state())
    target = _abstract(_state())
    target["critic"] = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(ValueError, match=r"\['critic'\]"):
      ckpt.restore(target=target)
    target = _abstract(_state())
    del target["policy"]["w"]
    with pytest.raises(ValueError, match=r"\['policy'\]\['w'\]"):
      ckpt.restore(target=target)


def test_fingerprint_detects_a_single_changed_element_and_a_swap():
  x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
  base = int(checkpoint._leaf_fingerprint(x))
  assert int(checkpoint._leaf_fingerprint(x.at[1, 2].add(1e-6))) != base
  assert int(checkpoint._leaf_fingerprint(x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0]))) != base
  # Sharding does not change the fingerprint.
  sharded = jax.device_put(jnp.tile(x, (8, 1)), jax.NamedSharding(_mesh(), jax.P("data")))
  assert int(checkpoint._leaf_fingerprint(sharded)) == int(
      checkpoint._leaf_fingerprint(np.asarray(sharded)))


def test_config_validates_max_to_keep():
  with pytest.raises(ValueError, match="0"):
    checkpoint.CheckpointConfig(max_to_keep=0)


_TWO_PROCESS_WORKER = textwrap.dedent("""
    import os, pathlib, sys
    process_id, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 4)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
    import numpy as np
    import orbax.checkpoint as ocp
    from agentrl_jax.learner import checkpoint

    mesh = jax.make_mesh((8,), ("data",))
    sharding = jax.NamedSharding(mesh, jax.P("data"))
    full = np.arange(32, dtype=np.float32).reshape(16, 2)
    state = {"x": jax.make_array_from_callback((16, 2), sharding, lambda i: full[i])}
    abstract = {"x": jax.ShapeDtypeStruct((16, 2), np.float32, sharding=sharding)}
    ckpt = checkpoint.Checkpointer(workdir)
    ckpt.save(1, state, {"it": 1})
    ckpt.save(2, jax.tree.map(lambda a: a + 1, state), {"it": 2})
    restored, extra = ckpt.restore(target=abstract)
    local = {tuple(s.index[0].indices(16)): np.asarray(s.data) for s in restored["x"].addressable_shards}
    assert extra == {"it": 2} and all((v == full[slice(*k)] + 1).all() for k, v in local.items())
    # Damage step 2 on process 0 only; both processes must fall back to step 1 together.
    if process_id == 0:
      for f in pathlib.Path(ckpt.step_path(2), "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
          f.unlink()
    ocp.multihost.sync_global_processes("test_damaged")
    restored, extra = ckpt.restore(target=abstract)
    assert extra == {"it": 1} and ckpt.restored_step == 1 and ckpt.all_steps() == [1]
    ckpt.close()
    print(f"process {process_id} ok", flush=True)
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_save_restore_and_fall_back_together(tmp_path):
  """Two CPU processes on loopback, 4 devices each, one 8-device mesh (multi-host in miniature)."""
  worker = tmp_path / "worker.py"
  worker.write_text(_TWO_PROCESS_WORKER)
  port = str(_free_port())
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(pathlib.Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
  # The worker sets its own device count; the session's compile flags stay.
  env["XLA_FLAGS"] = os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", "")
  workers = [
      subprocess.Popen([sys.executable, str(worker), str(i), port, str(tmp_path / "work")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = []
  for process in workers:
    try:
      outputs.append(process.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for p in workers:
        p.kill()
      raise
  for i, (process, output) in enumerate(zip(workers, outputs)):
    assert process.returncode == 0 and f"process {i} ok" in output, output[-3000:]
  # Host state is written once, by process 0; the damaged step was moved aside once.
  assert (tmp_path / "work" / "checkpoints" / "1" / "extra" / "metadata").exists()
  assert len(os.listdir(tmp_path / "work" / checkpoint.QUARANTINE_DIR)) == 1


def test_relative_workdir_saves_and_restores(tmp_path, monkeypatch):
  """The quickstart's default workdir is relative (runs/quickstart); orbax needs absolute paths."""
  monkeypatch.chdir(tmp_path)
  ckpt = checkpoint.Checkpointer("runs/relative")
  state = {"w": jnp.arange(4.0)}
  ckpt.save(1, state, {"iteration": 1})
  restored = checkpoint.Checkpointer("runs/relative").restore(target=state)
  np.testing.assert_array_equal(restored.state["w"], state["w"])
  assert restored.extra == {"iteration": 1}
