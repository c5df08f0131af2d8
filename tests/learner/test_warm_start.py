"""The behaviour-cloning warm start hands RL a cloned policy, and with a KL term its own reference."""

import json

import jax
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import metrics as metrics_lib
from agentrl_jax.learner import step as step_lib
from agentrl_jax.learner import warm_start_progress
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def _build(warm_start_iterations=2, sampling_temperature=1.0, clone_temperature=None, seed=0,
           init_seed=None, env_kwargs=None, demo_env_kwargs=None, reuse_dir=None, noise=0.3):
  return learner.build(
      config=configs.TrainConfig(env_name="dd_chain",
                                 env_kwargs=env_kwargs or {"horizon": 4, "num_decisions": 2},
                                 num_iterations=2, tasks_per_iteration=2, group_size=2,
                                 seed=seed, init_seed=init_seed),
      model=transformer.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                          mlp_dim=64, max_turns=8),
      rollout=loop_lib.RolloutConfig(max_turns=4, max_len=128, obs_buckets=(32,),
                                     sampling=sampler_lib.SamplingConfig(
                                         temperature=sampling_temperature)),
      # The entropy bonus moves the policy even when every reward of the tiny batch is 0.
      loss=step_lib.LossConfig(kl_coef=0.1, micro_batches=2, entropy_coef=0.1),
      optim=configs.OptimConfig(learning_rate=3e-2),
      warm_start=configs.WarmStartConfig(iterations=warm_start_iterations, episodes_per_iteration=8,
                                         micro_batches=2, learning_rate=3e-2,
                                         temperature=clone_temperature,
                                         env_kwargs=demo_env_kwargs or {},
                                         reuse_dir=reuse_dir, expert_noise=noise),
      evaluation=configs.EvalConfig(every=100, num_tasks=2, pass_k=0))


def _leaves(params):
  return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_kl_reference_is_the_cloned_policy_and_rl_updates_run_after_it(tmp_path):
  run = _build()
  try:
    initial = _leaves(run.state.policy_params)  # the warm start donates the state's buffers
    writer = metrics_lib.MetricsWriter(str(tmp_path), process_index=0)
    state = run.warm_start(run.state, writer)
    writer.close()
    cloned = _leaves(state.policy_params)
    assert any(not np.array_equal(a, b) for a, b in zip(cloned, initial))
    for ref, policy in zip(_leaves(state.ref_params), cloned):
      np.testing.assert_array_equal(ref, policy)
    # The update donates the state: a reference sharing the policy's buffers would be refused.
    state, metrics, _ = run.method.iteration(state, 0)
    assert np.isfinite(metrics["loss/kl"])
    for ref, before in zip(_leaves(state.ref_params), cloned):
      np.testing.assert_array_equal(ref, before)  # the reference stays the cloned policy
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(state.policy_params), cloned))
  finally:
    run.method.close()


def test_kl_reference_without_a_warm_start_is_the_initial_policy_in_its_own_buffers():
  run = _build(warm_start_iterations=0)
  try:
    initial = _leaves(run.state.policy_params)
    # The update donates the state: a reference sharing the policy's buffers would be refused.
    state, metrics, _ = run.method.iteration(run.state, 0)
    assert np.isfinite(metrics["loss/kl"])
    for ref, before in zip(_leaves(state.ref_params), initial):
      np.testing.assert_array_equal(ref, before)
    assert any(not np.array_equal(a, b) for a, b in zip(_leaves(state.policy_params), initial))
  finally:
    run.method.close()


def _clone(tmp_path, with_key=False, **kwargs):
  run = _build(**kwargs)
  try:
    key = np.asarray(run.state.rng)
    writer = metrics_lib.MetricsWriter(str(tmp_path), process_index=0)
    state = run.warm_start(run.state, writer)
    writer.close()
    return (_leaves(state.policy_params), key) if with_key else _leaves(state.policy_params)
  finally:
    run.method.close()


def test_clone_temperature_decides_the_distribution_cloned_not_the_sampler(tmp_path):
  # The demonstrations come from the expert, so only the cloned distribution can differ.
  untempered = _clone(tmp_path / "a", sampling_temperature=1.0)
  pinned = _clone(tmp_path / "b", sampling_temperature=0.5, clone_temperature=1.0)
  tempered = _clone(tmp_path / "c", sampling_temperature=0.5)
  for a, b in zip(untempered, pinned):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert any(not np.allclose(a, c, rtol=1e-3, atol=1e-5) for a, c in zip(untempered, tempered))


def test_clone_temperature_must_be_positive():
  with pytest.raises(ValueError, match="WarmStartConfig.temperature must be > 0"):
    configs.WarmStartConfig(temperature=0.0)


def test_init_seed_fixes_the_clone_while_the_run_seed_keys_sampling(tmp_path):
  # The demonstrations' action noise (expert_noise 0.3) and the initial weights both follow it.
  fixed_0, key_0 = _clone(tmp_path / "a", with_key=True, seed=0, init_seed=7)
  fixed_1, key_1 = _clone(tmp_path / "b", with_key=True, seed=1, init_seed=7)
  own_7 = _clone(tmp_path / "c", seed=7)
  own_1 = _clone(tmp_path / "d", seed=1)
  for a, b, c in zip(fixed_0, fixed_1, own_7):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert any(not np.array_equal(a, d) for a, d in zip(fixed_1, own_1))
  assert not np.array_equal(key_0, key_1)  # RL's sampling still follows the run's seed


def test_init_seed_must_be_a_non_negative_int():
  with pytest.raises(ValueError, match="TrainConfig.init_seed"):
    configs.TrainConfig(init_seed=-1)


def test_the_demonstrations_play_the_warm_start_env_kwargs(tmp_path):
  # Overriding an argument for the warm start only clones what a run built with it clones.
  override = _clone(tmp_path / "a", demo_env_kwargs={"num_decisions": 4})
  built_in = _clone(tmp_path / "b", env_kwargs={"horizon": 4, "num_decisions": 4})
  plain = _clone(tmp_path / "c")
  for a, b in zip(override, built_in):
    np.testing.assert_array_equal(a, b)
  assert any(not np.array_equal(a, c) for a, c in zip(override, plain))


def test_noise_on_an_env_without_random_actions_is_refused_before_any_compute():
  # search_qa lists no valid actions to draw from: it would clone noise-free episodes.
  with pytest.raises(config_errors.ConfigError, match=r"expert_noise=0.2 .* env 'search_qa' has none"):
    learner.build(config=configs.TrainConfig(env_name="search_qa", restrict_to_action_words=False),
                  warm_start=configs.WarmStartConfig(iterations=1, expert_noise=0.2))


def _clone_and_metrics(workdir, **kwargs):
  params = _clone(workdir, **kwargs)
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  return params, {k for row in rows for k in row}


def test_a_run_with_the_same_clone_loads_it_and_another_clones_its_own(tmp_path):
  store = str(tmp_path / "clones")
  first, first_keys = _clone_and_metrics(tmp_path / "a", seed=0, init_seed=3, reuse_dir=store)
  again, again_keys = _clone_and_metrics(tmp_path / "b", seed=1, init_seed=3, reuse_dir=store)
  assert {"warm_start/nll", "time/warm_start_step_s"} <= first_keys
  assert "warm_start/reused" not in first_keys
  assert "warm_start/reused" in again_keys and "warm_start/nll" not in again_keys
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  # Other demonstrations (less noise) are another clone: cloned, not loaded, and saved beside.
  other, other_keys = _clone_and_metrics(tmp_path / "c", seed=0, init_seed=3, reuse_dir=store,
                                         noise=0.0)
  assert "warm_start/nll" in other_keys and "warm_start/reused" not in other_keys
  assert any(not np.array_equal(a, c) for a, c in zip(first, other))
  assert len(list((tmp_path / "clones").glob("*.npz"))) == 2
  # Saving changes nothing: the same run without a store clones the same weights.
  for a, b in zip(first, _clone(tmp_path / "d", seed=0, init_seed=3)):
    np.testing.assert_array_equal(a, b)


def test_a_clone_store_on_an_object_store_is_refused_before_any_compute():
  with pytest.raises(config_errors.ConfigError,
                     match=r"reuse_dir='gs://b/clones': must be a local"):
    _build(reuse_dir="gs://b/clones")


def _warm(workdir, session, **kwargs):
  run = _build(**kwargs)
  try:
    writer = metrics_lib.MetricsWriter(str(workdir), process_index=0)
    state = run.warm_start(run.state, writer, session=session)
    writer.close()
    return None if state is None else _leaves(state.policy_params)
  finally:
    run.method.close()


def test_a_warm_start_stopped_part_way_resumes_to_the_uninterrupted_clone(tmp_path):
  whole = _clone(tmp_path / "whole", warm_start_iterations=4)
  asked = iter([False, False])  # then True: stop before step 2, after saving at steps 1 and 2
  session = warm_start_progress.Session(str(tmp_path / "run"), stop=lambda: next(asked, True),
                                        save_every_s=0.0)
  assert _warm(tmp_path / "run", session, warm_start_iterations=4) is None
  assert (tmp_path / "run" / warm_start_progress.FILE).exists()
  resumed = _warm(tmp_path / "run", warm_start_progress.Session(str(tmp_path / "run")),
                  warm_start_iterations=4)
  for a, b in zip(whole, resumed):
    np.testing.assert_array_equal(a, b)
  # Another warm start's progress (other demonstrations) is not resumed: it clones from step 0.
  other = _warm(tmp_path / "run", warm_start_progress.Session(str(tmp_path / "run")),
                warm_start_iterations=4, noise=0.0)
  for a, b in zip(_clone(tmp_path / "other", warm_start_iterations=4, noise=0.0), other):
    np.testing.assert_array_equal(a, b)
