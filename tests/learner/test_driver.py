"""The driver's own behaviour with a toy method: cadences, resume, preemption, stateful parts.

The toy method's state is one array that the iteration moves by a known amount, so every
expectation below is arithmetic; the per-method test (`test_driver_methods.py`) shows the real
methods get the same behaviour.
"""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import types
from agentrl_jax.learner import driver
from agentrl_jax.learner import metrics as metrics_lib

import preempt


class Toy:
  """State w; iteration k adds k + 1, so after n iterations w = n(n + 1)/2."""

  name = "toy"

  def __init__(self):
    self.closed = False
    self.restores = 0

  def iteration(self, state, iteration):
    w = state.policy_params["w"] + (iteration + 1)
    return driver.IterationResult(state.replace(policy_params={"w": w}),
                                  {"train/success": float(w)})

  def policy_params(self, state):
    return state.policy_params

  def progress(self, metrics):
    return {"w": metrics["train/success"]}

  def restored(self, state):
    del state
    self.restores += 1

  def close(self):
    self.closed = True


class Counter:
  """A stateful part: counts the iterations it has seen (as a hook)."""

  def __init__(self):
    self.seen = 0

  def __call__(self, event):
    del event
    self.seen += 1

  def state_dict(self):
    return {"seen": self.seen}

  def load_state_dict(self, state):
    self.seen = state["seen"]


def _state():
  return types.ActorCriticState(step=jnp.zeros((), jnp.int32), rng=jnp.zeros((2,), jnp.uint32),
                                policy_params={"w": jnp.zeros((), jnp.float32)},
                                policy_opt_state={"m": jnp.zeros((), jnp.float32)})


def _evaluate(params, tag):
  # The tag is folded into the result so each evaluation's key is visible in the record.
  return {"eval/greedy_success": float(params["w"]) + 1000.0 * tag}


def _run(workdir, *, n=5, hooks=(), stateful=(), warm_start=None, prepare=None, method=None):
  method = method or Toy()
  outcome = driver.run(
      str(workdir), method, _state(),
      schedule=driver.Schedule(num_iterations=n, log_every=2, checkpoint_every=3, eval_every=2),
      evaluate=_evaluate, writer=metrics_lib.MetricsWriter(str(workdir)), warm_start=warm_start,
      prepare=prepare, stateful=stateful, hooks=hooks,
      hook_context=dict(workdir=str(workdir), tokenizer=None, env_name="toy", writer=None,
                        pipeline=None))
  return outcome, method


def _rows(workdir):
  with open(os.path.join(workdir, metrics_lib.METRICS_FILE)) as f:
    return [json.loads(line) for line in f if line.strip()]


def _checkpoints(workdir):
  return sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())


def test_cadences_of_logging_evaluation_and_checkpoints(tmp_path):
  outcome, method = _run(tmp_path)
  rows = _rows(tmp_path)
  # Logged every 2 iterations and at the last; evaluated at 2, 4 and the last (tags 2 + done).
  train = {r["step"]: r for r in rows if "train/success" in r}
  assert sorted(train) == [2, 4, 5]
  assert train[2]["eval/greedy_success"] == 3 + 1000 * 4
  assert train[5]["eval/greedy_success"] == 15 + 1000 * 7
  assert "eval/greedy_success" not in {k for r in rows if r["step"] == 3 for k in r}
  assert rows[0]["step"] == 0 and rows[0]["eval/greedy_success_before"] == 0.0
  assert _checkpoints(tmp_path) == [3, 5]
  assert outcome.iterations == 5 and float(outcome.state.policy_params["w"]) == 15
  assert outcome.success_before == 0.0 and outcome.success_after == 15 + 1000 * 7
  assert method.closed and not outcome.preempted
  assert os.path.exists(tmp_path / metrics_lib.OPERATIVE_CONFIG_FILE)


def test_sigterm_stops_with_a_checkpoint_and_the_resume_is_exact(tmp_path):
  reference, _ = _run(tmp_path / "reference", hooks=[Counter()], stateful=[])
  counter = Counter()
  stopped, _ = _run(tmp_path / "run", hooks=[counter, preempt.StopAfter(1)], stateful=[counter])
  assert stopped.preempted and stopped.iterations == 1
  assert _checkpoints(tmp_path / "run") == [1]  # not a checkpoint_every step: the stop wrote it
  again = Counter()
  resumed, method = _run(tmp_path / "run", hooks=[again], stateful=[again])
  assert resumed.resumed_from == 1 and method.restores == 1
  assert again.seen == 5  # 1 restored from the checkpoint + 4 run now
  assert float(resumed.state.policy_params["w"]) == float(reference.state.policy_params["w"])
  last = lambda rows: {k: v for k, v in rows[-1].items() if not k.startswith("time/")}
  assert last(_rows(tmp_path / "run")) == last(_rows(tmp_path / "reference"))
  # The evaluation before training ran once, in the first launch.
  assert sum("eval/greedy_success_before" in r for r in _rows(tmp_path / "run")) == 1


def test_warm_start_runs_once_and_prepare_runs_every_launch(tmp_path):
  calls = {"warm": 0, "prepare": 0}

  def warm(state, session):
    calls["warm"] += 1
    return state.replace(policy_params={"w": state.policy_params["w"] + 100.0})

  def prepare(state):
    calls["prepare"] += 1
    return {"prepared/w": float(state.policy_params["w"])}

  _run(tmp_path, n=2, warm_start=warm, prepare=prepare)
  assert _checkpoints(tmp_path) == [0, 2]  # the warm start is checkpointed at step 0
  outcome, _ = _run(tmp_path, n=4, warm_start=warm, prepare=prepare)
  assert calls == {"warm": 1, "prepare": 2}
  assert float(outcome.state.policy_params["w"]) == 100 + 1 + 2 + 3 + 4
  rows = _rows(tmp_path)
  assert [r["eval/greedy_success_warm_start"] for r in rows if "eval/greedy_success_warm_start" in r] == [
      100.0 + 1000.0 * driver.WARM_START_TAG]
  # The second launch's prepare saw the restored state (after 2 iterations).
  assert [r["prepared/w"] for r in rows if "prepared/w" in r] == [100.0, 103.0]


def test_a_warm_start_stopped_part_way_is_run_again_by_the_next_launch(tmp_path):
  sessions = []

  def warm(state, session):
    sessions.append(session)
    if len(sessions) == 1:  # asked to stop: the session keeps the progress and the record
      session.save("key", state.policy_params, next_step=1)
      return None
    return state.replace(policy_params={"w": state.policy_params["w"] + 100.0})

  stopped, method = _run(tmp_path, n=2, warm_start=warm)
  assert stopped.preempted and stopped.iterations == 0 and method.closed
  assert not (tmp_path / "checkpoints").exists() or _checkpoints(tmp_path) == []
  assert sessions[0].directory == str(tmp_path) and not sessions[0].stop()
  assert (tmp_path / "warm_start_progress.npz").exists()
  outcome, _ = _run(tmp_path, n=2, warm_start=warm)
  assert len(sessions) == 2 and not outcome.preempted
  assert float(outcome.state.policy_params["w"]) == 100 + 1 + 2
  assert _checkpoints(tmp_path) == [0, 2]
  # The evaluation before training ran once: the progress held the record and its metrics stayed.
  assert outcome.success_before == 0.0
  assert sum("eval/greedy_success_before" in r for r in _rows(tmp_path)) == 1
  # Once the clone is in the step-0 checkpoint its progress file goes.
  assert not (tmp_path / "warm_start_progress.npz").exists()


def test_a_failing_iteration_still_closes_the_method(tmp_path):
  class Failing(Toy):
    def iteration(self, state, iteration):
      raise RuntimeError("boom")

  method = Failing()
  with pytest.raises(RuntimeError, match="boom"):
    _run(tmp_path, method=method)
  assert method.closed


def test_outcome_summary_lines(capsys):
  outcome = driver.Outcome(method="toy", state=None, iterations=3, resumed_from=None,
                           success_before=0.25, success_after_warm_start=None, success_after=0.5,
                           final_metrics={"eval/pass@4": 0.75})
  driver.print_summary(outcome, num_tasks=8, pass_k=4)
  out = capsys.readouterr().out
  assert "Done: 3 iterations of toy" in out and "before training: 0.250" in out
  assert "after RL: 0.500  (8 held-out tasks)" in out and "pass@4: 0.750" in out
  assert np.isfinite(outcome.success_after)
