"""The clone store: keys that follow the configuration, whole files, checked loads, one clone."""

import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.learner import clone_store


def _params(width=3):
  return {"layer": {"w": jnp.arange(width * 2, dtype=jnp.float32).reshape(width, 2),
                    "b": jnp.ones((2,), jnp.float32)}}


def test_the_key_ignores_dict_order_and_follows_every_value():
  a = clone_store.key_of({"x": {"p": 1, "q": (2, 3)}, "y": "s"})
  assert a == clone_store.key_of({"y": "s", "x": {"q": [2, 3], "p": 1}})
  assert a != clone_store.key_of({"x": {"p": 1, "q": (2, 4)}, "y": "s"})
  assert clone_store.digest(_params()) != clone_store.digest(_params(4))
  changed = _params()
  changed["layer"]["b"] = changed["layer"]["b"].at[1].set(1.5)
  assert clone_store.digest(changed) != clone_store.digest(_params())


def test_a_saved_clone_loads_back_equal_and_a_mismatched_one_is_refused(tmp_path):
  path = str(tmp_path / "k.npz")
  clone_store.save(path, _params())
  loaded = clone_store.load(path, _params())
  np.testing.assert_array_equal(loaded["layer"]["w"], _params()["layer"]["w"])
  mismatch = r"k.npz: leaf \['layer'\]\['w'\] is float32\[3, 2\], the model's float32\[4, 2\]"
  with pytest.raises(ValueError, match=mismatch):
    clone_store.load(path, _params(4))
  with open(path, "r+b") as f:
    f.truncate(40)
  with pytest.raises(ValueError, match=r"k.npz: unreadable"):
    clone_store.load(path, _params())


def test_runs_launched_together_clone_once(tmp_path):
  calls = []

  def clone():
    calls.append(1)
    time.sleep(0.3)  # long enough for the other thread to reach the lock
    return _params()

  results = []
  threads = [threading.Thread(target=lambda: results.append(
      clone_store.reuse_or_clone(str(tmp_path), {"k": 1}, _params(), clone))) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(calls) == 1
  assert sorted(loaded for _, loaded in results) == [False, True]


def test_a_run_asked_to_stop_while_another_clones_stops_waiting(tmp_path):
  started, release = threading.Event(), threading.Event()

  def held_clone():
    started.set()
    release.wait(timeout=30)  # holds the lock until the stopped run has returned
    return _params()

  holder = threading.Thread(target=clone_store.reuse_or_clone,
                            args=(str(tmp_path), {"k": 1}, _params(), held_clone))
  holder.start()
  started.wait()
  # Had it waited for the lock, it would have found the other run's clone and loaded it.
  assert clone_store.reuse_or_clone(str(tmp_path), {"k": 1}, _params(), _params,
                                    stop=lambda: True) == (None, False)
  release.set()
  holder.join()
