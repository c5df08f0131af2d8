"""T1's critic warm start in the learner: the critic copies the (cloned) policy's trunk with a zero
value head, and the first `critic_warmup_steps` updates train the critic alone."""

import jax
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def build(*, warmup_steps=0, warm_iterations=0, critic_init="policy", **extra):
  # DD-Chain pays for each correct decision, so even an untrained policy's returns are not all 0
  # and the critic has something to fit.
  return learner.build(
      config=configs.TrainConfig(env_name="dd_chain", env_kwargs={"horizon": 4, "num_decisions": 2},
                                 num_iterations=4, tasks_per_iteration=2, group_size=2,
                                 estimator="gae", use_critic=True, critic_init=critic_init),
      model=transformer.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                          mlp_dim=64, max_turns=8),
      rollout=loop_lib.RolloutConfig(max_turns=4, max_len=128, obs_buckets=(32,),
                                     sampling=sampler_lib.SamplingConfig()),
      # The entropy bonus moves the policy even when every reward is 0 (untrained, tiny).
      loss=step_lib.LossConfig(entropy_coef=0.1, critic_warmup_steps=warmup_steps),
      optim=configs.OptimConfig(learning_rate=3e-2),
      warm_start=configs.WarmStartConfig(iterations=warm_iterations, episodes_per_iteration=8),
      evaluation=configs.EvalConfig(every=100, num_tasks=2, pass_k=0), **extra)


def flat(params):
  return {"/".join(map(str, p)): np.asarray(v[...]) for p, v in jax.tree_util.tree_leaves_with_path(
      params, is_leaf=lambda x: hasattr(x, "get_metadata"))}


def assert_trunk_copied(state):
  policy, critic = flat(state.policy_params), flat(state.critic_params)
  shared = set(policy) & set(critic)
  assert any("blocks" in k for k in shared) and any("embed" in k for k in shared), shared
  for name in shared:
    np.testing.assert_array_equal(critic[name], policy[name], err_msg=name)
  head = [critic[k] for k in set(critic) - shared]
  assert head and all(np.all(h == 0) for h in head)  # a zero value head: values start at 0


def test_critic_starts_as_the_policys_trunk_with_a_zero_head():
  run = build()
  try:
    assert_trunk_copied(run.state)
  finally:
    run.method.close()


def test_random_critic_init_is_not_a_copy():
  run = build(critic_init="random")
  try:
    policy, critic = flat(run.state.policy_params), flat(run.state.critic_params)
    differ = [k for k in set(policy) & set(critic) if not np.array_equal(policy[k], critic[k])]
    assert differ
  finally:
    run.method.close()


def test_the_critic_is_copied_again_after_the_behaviour_cloning_warm_start(tmp_path):
  run = build(warm_iterations=2)
  try:
    initial = flat(run.state.policy_params)  # the warm start donates the state's buffers
    writer = metrics_lib.MetricsWriter(str(tmp_path), process_index=0)
    cloned = run.warm_start(run.state, writer)
    writer.close()
    moved = [k for k, v in flat(cloned.policy_params).items() if not np.array_equal(v, initial[k])]
    assert moved, "the warm start did not train the policy"
    assert_trunk_copied(cloned)
  finally:
    run.method.close()


def test_warmup_updates_train_the_critic_alone():
  run = build(warmup_steps=2)
  try:
    state = run.state
    for iteration in range(3):
      before_policy, before_critic = flat(state.policy_params), flat(state.critic_params)
      state, metrics, _ = run.method.iteration(state, iteration)
      policy_moved = any(not np.array_equal(v, before_policy[k])
                         for k, v in flat(state.policy_params).items())
      critic_moved = any(not np.array_equal(v, before_critic[k])
                         for k, v in flat(state.critic_params).items())
      assert critic_moved, iteration
      assert policy_moved == (iteration >= 2), iteration
      assert metrics["loss/policy_frozen"] == (1.0 if iteration < 2 else 0.0)
  finally:
    run.method.close()


def test_policy_copy_refuses_its_own_critic_model():
  with pytest.raises(config_errors.ConfigError, match="critic_init = 'policy'"):
    build(critic_model=transformer.TransformerConfig(vocab_size=1, num_layers=2, d_model=32,
                                                     num_heads=4, mlp_dim=64))
