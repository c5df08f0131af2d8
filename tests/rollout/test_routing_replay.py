"""MoE routing record and replay (docs/methods.md#t1): the learner routes as the sampler did."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.envs import registry
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import distribution
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

MAX_ACTIONS = 8 * 3


@pytest.fixture(scope="module")
def played():
  tok = tokenizer_lib.load_tokenizer()
  cfg = tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=32, num_experts=4,
                 experts_per_token=2)
  graphdef, params = tfm.create(cfg, seed=0)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=3, stop_token_ids=(tok.end_id,))
  rollout = loop_lib.RolloutConfig(max_turns=8, max_len=256, obs_buckets=(48, 96),
                                   length_buckets=(128, 256), sampling=sampling)
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  envs = [registry.make("frozenlake") for _ in range(4)]
  traj, _ = runner.collect(envs, [0, 1, 2, 3], [0, 0, 1, 1], params=params, rng=jax.random.key(0))
  return cfg, graphdef, params, traj


def _learner_log_probs(graphdef, params, traj, routing):
  view = distribution.action_view(jnp.asarray(traj.action_mask), MAX_ACTIONS)
  logp, _ = distribution.action_log_probs(graphdef, params, jnp.asarray(traj.tokens),
                                      distribution.trajectory_positions(traj), view, None, 1.0,
                                      None if routing is None else jnp.asarray(routing))
  return np.asarray(logp)[np.asarray(view.valid)], np.asarray(view.gather(traj.sample_logprob))[
      np.asarray(view.valid)]


def test_the_sampler_records_every_token_routing(played):
  cfg, _, _, traj = played
  routing = traj.extras[extra_keys.ROUTING_KEY]
  assert routing.shape == traj.tokens.shape + (cfg.num_layers, cfg.experts_per_token)
  used = traj.turn_of_token >= 0
  assert routing[used].min() >= 0 and routing[used].max() < cfg.num_experts
  # Top-k picks k distinct experts for every real token.
  assert np.all(routing[used][..., 0] != routing[used][..., 1])


def test_replayed_routing_gives_the_sampled_log_probs(played):
  _, graphdef, params, traj = played
  got, sampled = _learner_log_probs(graphdef, params, traj, traj.extras[extra_keys.ROUTING_KEY])
  np.testing.assert_allclose(got, sampled, atol=1e-5)


def test_the_learner_really_reads_the_replayed_experts(played):
  cfg, graphdef, params, traj = played
  shifted = (traj.extras[extra_keys.ROUTING_KEY] + 1) % cfg.num_experts
  got, sampled = _learner_log_probs(graphdef, params, traj, shifted)
  assert np.abs(got - sampled).max() > 1e-3


def test_the_update_replays_unless_told_not_to(played):
  _, graphdef, params, traj = played
  drift = {}
  for replay in (True, False):
    update = step_lib.make_update_fn(
        policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=optax.sgd(0.0),
        critic_optimizer=None,
        advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=4),
        loss=step_lib.LossConfig(replay_routing=replay), allowed=None, max_actions=MAX_ACTIONS)
    state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                   rng=jax.random.key_data(jax.random.key(0)),
                                   policy_params=jax.tree.map(jnp.copy, params),
                                   policy_opt_state=optax.sgd(0.0).init(params))
    _, metrics = update(state, jax.tree.map(jnp.asarray, traj))
    drift[replay] = float(metrics["rollout/logprob_drift"])
  assert drift[True] < 1e-5
  # Without replay the learner routes freely; the drift metric reports whatever that costs.
  assert np.isfinite(drift[False])


def test_a_dense_policy_records_no_routing():
  tok = tokenizer_lib.load_tokenizer()
  cfg = tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=32)
  graphdef, params = tfm.create(cfg, seed=0)
  rollout = loop_lib.RolloutConfig(max_turns=8, max_len=256, obs_buckets=(48, 96),
                                   sampling=sampler_lib.SamplingConfig(max_action_tokens=3))
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  traj, _ = runner.collect([registry.make("frozenlake")], [0], [0], params=params,
                           rng=jax.random.key(0))
  assert extra_keys.ROUTING_KEY not in traj.extras
