"""Shared fixtures of the strategy tests: one tiny policy and two runners, compiled once."""

import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

WORDS = ("left", "down", "right", "up")


def make_runner(tok, model, sampling):
  cfg, graphdef, _ = model
  rollout = loop_lib.RolloutConfig(max_turns=10, max_len=160, obs_buckets=(48,),
                                   length_buckets=(96, 160), sampling=sampling)
  return loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)


@pytest.fixture(scope="session")
def word_runner(tok, model):
  """One-token actions restricted to the four FrozenLake moves."""
  ids = tuple(tok.single_token_id(w) for w in WORDS)
  return make_runner(tok, model, sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=ids))


@pytest.fixture(scope="session")
def free_runner(tok, model):
  """Free multi-token actions ended by a stop token (babble: many invalid actions)."""
  return make_runner(tok, model, sampler_lib.SamplingConfig(max_action_tokens=3,
                                                            stop_token_ids=(tok.end_id,)))


def replayed_log_probs(model, runner, traj):
  """The learner's full-sequence log-probs of the recorded tokens, scattered back to [B, L]."""
  _, graphdef, params = model
  sampling = runner.config.sampling
  allowed = distribution.vocabulary_mask(runner.model_config.vocab_size, sampling.allowed_token_ids)
  max_actions = runner.config.max_turns * sampling.max_action_tokens
  view = distribution.action_view(jnp.asarray(traj.action_mask), max_actions)
  logp, _ = distribution.action_log_probs(graphdef, params, jnp.asarray(traj.tokens),
                                      tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)),
                                      view, allowed, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  rows = np.arange(out.shape[0])[:, None]
  out[rows, np.asarray(view.index)] = np.where(view.valid, logp, 0.0)
  return out


def assert_tito(model, runner, traj):
  """Recorded sample log-probs equal a full forward pass over the recorded tokens."""
  replay = replayed_log_probs(model, runner, traj)
  mask = np.asarray(traj.action_mask)
  assert mask.any()
  np.testing.assert_allclose(replay[mask], np.asarray(traj.sample_logprob)[mask], atol=1e-4)


def assert_same_layout(traj, runner, batch_size):
  """Static shapes as `RolloutRunner.collect` produces them."""
  traj.validate()
  assert traj.tokens.shape[0] == batch_size
  assert traj.tokens.shape[1] in (96, 160)
  assert traj.turn_mask.shape == (batch_size, runner.config.max_turns)


@pytest.fixture(scope="session")
def check_tito(model):
  return lambda runner, traj: assert_tito(model, runner, traj)


@pytest.fixture(scope="session")
def check_layout():
  return assert_same_layout


@pytest.fixture(scope="session")
def runner_for(tok, model):
  """A runner of the tiny policy with the given sampling config (one more compile each)."""
  return lambda sampling: make_runner(tok, model, sampling)
