"""Tests of AHEAD's recording env, hint path and teacher inputs."""

import jax.numpy as jnp
import numpy as np

from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.offline import ahead
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout.strategies import teacher as teacher_lib


class _CountingHints:
  def __init__(self):
    self.calls = []

  def __call__(self, ctx):
    self.calls.append(ctx)
    return "avoid H"


def _env(hints):
  return teacher_lib.RecordingEnv(registry.make("frozenlake", size=4, hole_prob=0.0, max_turns=6), hints)


def test_hint_path_is_taken_only_on_error_steps():
  hints = _CountingHints()
  env = _env(hints)
  env.reset(0)                         # no holes: start top-left, goal bottom-right
  env.step("right")                    # moves: routine step
  env.step("jump")                     # invalid word: error
  env.step("up")                       # top row: hits the wall, board unchanged: error
  env.step("down")                     # moves: routine step
  errors = [r.error for r in env.records]
  assert errors == [False, True, True, False]
  assert len(hints.calls) == 2
  assert [r.hint for r in env.records] == ["", "avoid H", "avoid H", ""]
  assert not hints.calls[0].action_valid and hints.calls[1].action_valid


def test_teacher_inputs_carry_feedback_always_and_hints_only_on_error_turns():
  tok = tokenizer_lib.load_tokenizer()
  cfg = transformer.tiny(tok.vocab_size)
  graphdef, _ = transformer.create(cfg, 0)
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, loop_lib.RolloutConfig(
      max_turns=6, max_len=384, obs_buckets=(48, 64)))
  hints = _CountingHints()
  envs = [_env(hints) for _ in range(3)]
  script = iter(["right", "jump", "up", "down", "down", "right"] * 3)

  def actor(env, rng):
    del env, rng
    return next(script)

  traj, _ = runner.collect(envs, [0, 1, 2], [0, 1, 2], actor=actor,
                           actor_rng=np.random.default_rng(0))
  out = teacher_lib.teacher_inputs(traj, [e.records for e in envs], tok.encode, tok.act_id, 200)
  for i, env in enumerate(envs):
    # The teacher scores exactly the student's action tokens, in the same order.
    np.testing.assert_array_equal(out.tokens[i][out.action_mask[i]],
                                  traj.tokens[i][traj.action_mask[i]])
    for k, record in enumerate(env.records):
      if not traj.turn_mask[i, k]:
        break
      text = tok.decode(out.tokens[i][(out.turn_of_token[i] == k) & ~out.action_mask[i]])
      assert "feedback:" in text
      assert ("hint:" in text) == record.error
      assert out.error_turn[i, k] == record.error
  assert out.error_turn.any() and not out.error_turn.all()


def test_distillation_correction_is_identity_when_teacher_matches_sampler():
  tok = np.zeros((2, 5), np.int32)
  mask = np.array([[0, 1, 0, 1, 0], [0, 0, 1, 1, 0]], bool)
  logp = np.where(mask, -0.7, 0.0).astype(np.float32)
  from agentrl_jax import types
  t = types.empty_trajectories(2, 5, 2).replace(action_mask=mask, sample_logprob=logp, tokens=tok)
  t = t.replace(extras={ahead.TEACHER_LOGPROB: jnp.asarray(logp),
                        ahead.ERROR_STEP: jnp.asarray(mask)})
  adv = jnp.asarray(np.where(mask, 0.5, 0.0), jnp.float32)
  np.testing.assert_allclose(ahead.distillation_correction(t, adv), adv)
  raised = t.replace(extras={ahead.TEACHER_LOGPROB: jnp.asarray(logp + 0.4),
                             ahead.ERROR_STEP: jnp.asarray(mask)})
  # Error-step tokens: 0.5 + 0.1 * 1.0 * 0.4 = 0.54.
  np.testing.assert_allclose(ahead.distillation_correction(raised, adv),
                             np.where(mask, 0.54, 0.0), atol=1e-6)


def test_teacher_without_privileged_text_scores_like_the_student():
  """With no inserted text the teacher's conversation is the student's: same log-probs."""
  from agentrl_jax.learner import configs
  from agentrl_jax.models import distribution
  from agentrl_jax.offline import common
  config = configs.TrainConfig(env_kwargs={"size": 4, "hole_prob": 0.0, "max_turns": 6},
                               tasks_per_iteration=1, group_size=2)
  setup, params = common.resolve(config, None, loop_lib.RolloutConfig(
      max_turns=6, max_len=256, obs_buckets=(48, 64)), None)
  envs = [_env(_CountingHints()) for _ in range(2)]
  traj, _ = setup.runner.collect(envs, [0, 1], [0, 1], actor=lambda env, rng: "right",
                                 actor_rng=np.random.default_rng(0))
  out = teacher_lib.teacher_inputs(traj, [e.records for e in envs], lambda text: [], setup.tokenizer.act_id,
                             200, pad_to=traj.max_len)
  np.testing.assert_array_equal(out.tokens, traj.tokens)
  student_marker = np.full(traj.tokens.shape, -9.0, np.float32)
  got = ahead.make_teacher_fn(setup)(params, jnp.asarray(traj.action_mask), student_marker,
                                     out.tokens, out.turn_of_token, out.action_mask)
  view = distribution.action_view(jnp.asarray(traj.action_mask), setup.max_actions)
  ref, _ = distribution.action_log_probs(setup.graphdef, params, jnp.asarray(traj.tokens),
                                     transformer.positions_from_turns(jnp.asarray(traj.turn_of_token)),
                                     view, setup.allowed, setup.temperature)
  got = np.asarray(got)
  np.testing.assert_allclose(got[traj.action_mask], np.asarray(ref)[np.asarray(view.valid)], atol=1e-5)
  np.testing.assert_array_equal(got[~traj.action_mask], -9.0)  # untouched elsewhere
