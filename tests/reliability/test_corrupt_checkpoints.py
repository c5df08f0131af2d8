"""Corrupt checkpoints at launch: each is moved aside with one line on stderr, the launch goes on
from the newest intact one (or from scratch when none is left), with no traceback and none of the
libraries' own reports of the failed read (orbax/absl log lines, asyncio's "Event loop is
closed" or "Task exception was never retrieved").

The restore runs in a fresh process, as a relaunch does, so reports that only surface when the
failed read's leftovers are garbage-collected or at interpreter exit are seen too.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from agentrl_jax.learner import checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]

_RELAUNCH = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from agentrl_jax.learner import checkpoint
    target = {"w": jnp.zeros((64, 64)), "b": jnp.zeros(3)}
    with checkpoint.Checkpointer(sys.argv[1]) as ckpt:
      restored = ckpt.resume(target=target)
      print("restored", ckpt.restored_step, "from scratch" if restored is None else
            int(restored.extra["iteration"]))
""")


def _state(offset):
  return {"w": jnp.arange(4096.0).reshape(64, 64) + offset, "b": jnp.ones(3) + offset}


def _damage(step_dir: pathlib.Path, how: str) -> None:
  data_files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  if how == "manifest":
    shutil.rmtree(step_dir / "manifest")
  elif how == "metadata":
    (step_dir / "state" / "_METADATA").write_text("{garbage")
  elif how == "extra":
    (step_dir / "extra" / "metadata").write_text("{garbage")
  for f in data_files:
    data = f.read_bytes()
    if how == "delete":
      f.unlink()
    elif how == "truncate":
      f.write_bytes(data[: len(data) // 2])
    elif how == "flip":
      mid = len(data) // 2
      f.write_bytes(data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1:])


def _relaunch(workdir):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(
      [str(REPO), os.environ.get("PYTHONPATH", "")])}
  env["XLA_FLAGS"] = os.environ.get("AGENTRL_JAX_TEST_COMPILE_FLAGS", "")  # one device
  return subprocess.run([sys.executable, "-c", _RELAUNCH, str(workdir)], capture_output=True,
                        text=True, env=env, timeout=300, check=False)


@pytest.fixture
def saved(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    for step in (1, 2):
      ckpt.save(step, jax.tree.map(jax.device_get, _state(step)), {"iteration": step})
  return tmp_path


DAMAGE = ["delete", "truncate", "flip", "manifest", "metadata", "extra"]


@pytest.mark.parametrize("how", DAMAGE)
def test_corrupt_newest_is_one_line_and_the_launch_goes_on_from_the_older(saved, how):
  _damage(saved / "checkpoints" / "2", how)
  result = _relaunch(saved)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "restored 1 1"
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("warning: checkpoint step 2 at ") and "moved to" in lines[0], lines
  assert os.listdir(saved / checkpoint.QUARANTINE_DIR) and not (saved / "checkpoints" / "2").exists()


@pytest.mark.parametrize("how", ["delete", "truncate"])
def test_every_checkpoint_corrupt_starts_from_scratch(saved, how):
  _damage(saved / "checkpoints" / "2", how)
  _damage(saved / "checkpoints" / "1", how)
  result = _relaunch(saved)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "restored None from scratch"
  lines = result.stderr.strip().splitlines()
  assert [line.split(" at ")[0] for line in lines] == [
      "warning: checkpoint step 2", "warning: checkpoint step 1",
      f"warning: no intact checkpoint left in {saved / 'checkpoints'}; starting from scratch"
  ], result.stderr
  assert len(os.listdir(saved / checkpoint.QUARANTINE_DIR)) == 2


def test_no_checkpoint_is_a_silent_fresh_start(tmp_path):
  result = _relaunch(tmp_path)
  assert result.returncode == 0 and result.stderr == "", result.stderr
  assert result.stdout.strip() == "restored None from scratch"
