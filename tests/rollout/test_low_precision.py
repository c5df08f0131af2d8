"""The bfloat16 sampling copy (`RolloutConfig.sampling_dtype`): what it runs, and how close its
log-probs stay to the float32 policy the learner trains."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import low_precision
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout.strategies import common


def _rollout(**kw):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=4)
  return loop_lib.RolloutConfig(max_turns=6, max_len=160, obs_buckets=(48,), sampling=sampling,
                                **kw)


def _collect(tok, model, rollout, n=6):
  cfg, graphdef, params = model
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  envs = [registry.make("frozenlake") for _ in range(n)]
  traj, _ = runner.collect(envs, list(range(n)), list(range(n)), params=params,
                           rng=jax.random.key(0))
  return runner, traj


def _learner_log_probs(model, traj):
  """The float32 policy's log-probs of the recorded action tokens (what the learner computes)."""
  _, graphdef, params = model
  view = distribution.action_view(jnp.asarray(traj.action_mask), 24)
  logp, _ = distribution.action_log_probs(
      graphdef, params, jnp.asarray(traj.tokens),
      tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)), view, None, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  out[np.arange(out.shape[0])[:, None], np.asarray(view.index)] = np.where(view.valid, logp, 0)
  return out


def test_bfloat16_sampler_runs_a_bfloat16_twin_and_stays_near_the_policy(tok, model):
  runner, traj = _collect(tok, model, _rollout(sampling_dtype="bfloat16"))
  traj.validate()
  assert runner._sampling_model.dtype == "bfloat16"
  mask = traj.action_mask
  drift = np.abs(_learner_log_probs(model, traj)[mask] - traj.sample_logprob[mask])
  # Sampled by the bfloat16 copy: not the float32 log-probs (exact to ~1e-6 otherwise), but
  # within bfloat16's 8-bit mantissa of them.
  assert drift.max() > 1e-4
  assert drift.mean() < 0.02


def test_default_sampler_is_the_policy_itself(tok, model):
  runner, traj = _collect(tok, model, _rollout())
  assert runner._sampling_graphdef is model[1]
  mask = traj.action_mask
  np.testing.assert_allclose(_learner_log_probs(model, traj)[mask], traj.sample_logprob[mask],
                             atol=1e-4)


def test_bfloat16_copy_casts_floats_and_keeps_integers():
  tree = {"w": jnp.ones((2, 3), jnp.float32), "i": jnp.arange(3)}
  got = low_precision.bfloat16_copy(tree)
  assert got["w"].dtype == jnp.bfloat16 and got["i"].dtype == tree["i"].dtype


def test_bad_or_unsupported_sampling_dtype_is_one_line_error(tok, model):
  with pytest.raises(ValueError, match="sampling_dtype must be one of"):
    _rollout(sampling_dtype="float16")
  with pytest.raises(ValueError, match="sampling_dtype must be None"):
    common.check_supported(_rollout(sampling_dtype="bfloat16"))
  cfg, _, _ = model
  other, _ = tfm.create(dataclasses.replace(cfg, num_layers=1), seed=0)
  with pytest.raises(ValueError, match="plain transformer.Transformer"):
    low_precision.sampling_model(other, cfg, "bfloat16")
