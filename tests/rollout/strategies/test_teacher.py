"""SERL's teacher pass: privileged re-scoring of the sampled ids, wired into the learner."""

import json
import math
import pathlib
import sys

import gin
import jax
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax.rollout.strategies import teacher as teacher_lib
from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "experiments"))

import run  # noqa: E402


@pytest.fixture(scope="module")
def setup():
  tok = tokenizer_lib.load_tokenizer()
  cfg = tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=64)
  graphdef, params = tfm.create(cfg, seed=0)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=3, stop_token_ids=(tok.end_id,))
  rollout = loop_lib.RolloutConfig(max_turns=10, max_len=256, obs_buckets=(48, 96), sampling=sampling)
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  teacher = teacher_lib.PrivilegedTeacher(sync_every=2).bind(
      graphdef=graphdef, allowed=None, temperature=1.0, max_actions=30)
  return tok, graphdef, params, runner, teacher


def _play(teacher, runner, params, key):
  make_env = lambda: registry.make("frozenlake")
  return teacher.collect(runner, make_env, [0, 1, 2], [0, 0, 1], params=params,
                         rng=jax.random.key(key), row_ids=[0, 1, 2])


def _hand_built_teacher_logprob(tok, graphdef, params, traj, row, feedback):
  """Row `row`'s teacher log-probs, rebuilt from text: each turn's observation chunk gets
  "\\nfeedback: <next observation>" before its <|act|>, then the same sampled action ids."""
  ids, turn_ids, action_at = [], [], []
  cursor = 0
  for k in range(int(traj.turn_mask[row].sum())):
    start, end = int(traj.turn_start[row, k]), int(traj.turn_end[row, k])
    obs = list(traj.tokens[row, cursor:start - 1])  # without its closing <|act|>
    obs += tok.encode("\nfeedback: " + " ".join(feedback[k].split())[:200]) + [tok.act_id]
    ids += obs
    turn_ids += [k] * len(obs)
    action_at += list(range(len(ids), len(ids) + end - start))
    ids += list(traj.tokens[row, start:end])
    turn_ids += [k] * (end - start)
    cursor = end
  tokens = np.asarray([ids], np.int32)
  logits, _ = tfm.apply(graphdef, params, tokens, tfm.positions_from_turns(np.asarray([turn_ids])))
  logp = np.asarray(jax.nn.log_softmax(logits[0].astype(np.float32), axis=-1))
  return np.asarray([logp[t - 1, ids[t]] for t in action_at])


def test_teacher_logprobs_are_the_snapshot_reading_the_feedback(setup):
  tok, graphdef, params, runner, teacher = setup
  traj, _ = _play(teacher, runner, params, key=0)
  t_logp = traj.extras[extra_keys.TEACHER_LOGPROB_KEY]
  assert t_logp.shape == traj.tokens.shape
  # Outside action tokens the teacher leaves the student's values (zeros there).
  np.testing.assert_array_equal(t_logp[~traj.action_mask], traj.sample_logprob[~traj.action_mask])
  # Row 0 rebuilt by hand from the env's own feedback texts.
  env = registry.make("frozenlake")
  env.reset(0)
  feedback = []
  for k in range(int(traj.turn_mask[0].sum())):
    ids = traj.tokens[0, traj.turn_start[0, k]:traj.turn_end[0, k]]
    feedback.append(env.step(runner.action_text(list(ids))).observation)
  want = _hand_built_teacher_logprob(tok, graphdef, params, traj, 0, feedback)
  np.testing.assert_allclose(t_logp[0][traj.action_mask[0]], want, atol=1e-4)
  # The feedback changes the context, so the teacher does not merely echo the student.
  assert np.abs(t_logp - traj.sample_logprob)[traj.action_mask].max() > 1e-3


def test_update_step_counts_batches_and_the_teacher_resyncs(setup):
  tok, graphdef, params, runner, _ = setup
  teacher = teacher_lib.PrivilegedTeacher(sync_every=2).bind(
      graphdef=graphdef, allowed=None, temperature=1.0, max_actions=30)
  other = tfm.create(tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=64), seed=1)[1]
  steps, snapshots = [], []
  for i, p in enumerate([params, other, other]):
    traj, _ = _play(teacher, runner, p, key=i)
    steps.append(traj.extras[extra_keys.UPDATE_STEP_KEY])
    snapshots.append(jax.tree.leaves(teacher._teacher)[0])
  assert [s.tolist() for s in steps] == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
  # Synced at batches 0 and 2 only: batch 1 still scores with the batch-0 snapshot.
  first, second = jax.tree.leaves(params)[0], jax.tree.leaves(other)[0]
  np.testing.assert_array_equal(snapshots[1], first)
  np.testing.assert_array_equal(snapshots[2], second)
  teacher.load_state_dict(teacher.state_dict())
  assert teacher._teacher is None and teacher.state_dict() == {"batches": 3}


def test_collect_before_bind_names_the_problem(setup):
  _, _, params, runner, _ = setup
  with pytest.raises(ValueError, match="before bind"):
    teacher_lib.PrivilegedTeacher().collect(runner, lambda: registry.make("frozenlake"), [0], [0],
                                             params=params, rng=jax.random.key(0), row_ids=[0])


@pytest.mark.integration
def test_serl_config_runs_end_to_end(tmp_path, monkeypatch):
  monkeypatch.chdir(REPO)
  gin.clear_config(clear_constants=True)
  workdir = tmp_path / "run"
  bindings = ["configs.TrainConfig.num_iterations = 2", "configs.TrainConfig.tasks_per_iteration = 2",
              "configs.TrainConfig.group_size = 4", "configs.WarmStartConfig.iterations = 0",
              "configs.EvalConfig.num_tasks = 4", "configs.EvalConfig.pass_k = 0",
              "serl.environment_reweighted_credit.decay_steps = 4"]
  try:
    status = run.main(["--gin_file=experiments/configs/serl_frozenlake.gin",
                       *[f"--gin_bindings={b}" for b in bindings], f"--workdir={workdir}"])
  finally:
    gin.clear_config(clear_constants=True)
  assert status == 0
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  last = [m for m in lines if "loss/policy" in m][-1]
  assert all(math.isfinite(v) for v in last.values() if isinstance(v, float))
