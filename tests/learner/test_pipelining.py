"""Truncated importance sampling, the one-batch-ahead rollout pipeline, and ratio levels."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax import config_errors
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def test_truncated_importance_weights_hand_case():
  # old − sample = [0, ln 1.5, ln 4, −ln 2] → ratios [1, 1.5, 4, 0.5]; cap 2 → [1, 1.5, 2, 0.5].
  old = jnp.log(jnp.asarray([[0.5, 0.6, 0.8, 0.1]]))
  sample = jnp.log(jnp.asarray([[0.5, 0.4, 0.2, 0.2]]))
  valid = jnp.asarray([[True, True, True, True]])
  w = step_lib.truncated_importance_weights(old, sample, valid, cap=2.0)
  np.testing.assert_allclose(w, [[1.0, 1.5, 2.0, 0.5]], rtol=1e-6)
  # No gradient flows through the weight, and padding weighs 1.
  grad = jax.grad(lambda o: step_lib.truncated_importance_weights(o, sample, valid, 2.0).sum())(old)
  np.testing.assert_array_equal(grad, 0.0)
  pad = step_lib.truncated_importance_weights(old, sample, valid.at[0, 2].set(False), 2.0)
  assert float(pad[0, 2]) == 1.0


def test_the_configs_refuse_a_lag_without_its_correction():
  with pytest.raises(ValueError, match="max_staleness must be 0"):
    configs.TrainConfig(max_staleness=2)
  with pytest.raises(ValueError, match="tis_cap must be >= 1"):
    step_lib.LossConfig(tis_cap=0.5)


def _tiny_run(workdir, staleness, tis_cap):
  return learner.train(
      str(workdir),
      config=configs.TrainConfig(env_name="frozenlake", env_kwargs={"size": 4, "max_turns": 6},
                                 num_iterations=3, tasks_per_iteration=2, group_size=2,
                                 checkpoint_every=10, max_staleness=staleness),
      model=transformer.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                          mlp_dim=64, position="turn_slot", alibi=True,
                                          max_turns=8, max_slots=64),
      rollout=loop_lib.RolloutConfig(max_turns=6, max_len=192, obs_buckets=(48,),
                                     sampling=sampler_lib.SamplingConfig()),
      # The entropy bonus moves the policy even when every reward is 0 (untrained, tiny).
      loss=step_lib.LossConfig(tis_cap=tis_cap, entropy_coef=0.1),
      optim=configs.OptimConfig(learning_rate=3e-2),
      warm_start=configs.WarmStartConfig(iterations=0),
      evaluation=configs.EvalConfig(every=100, num_tasks=2, pass_k=0))


def _records(workdir):
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [r for r in map(json.loads, lines) if "loss/policy" in r]


@pytest.mark.integration
def test_one_batch_ahead_samples_with_the_policy_before_the_update(tmp_path):
  with pytest.raises(config_errors.ConfigError, match="set LossConfig.tis_cap"):
    _tiny_run(tmp_path / "refused", staleness=1, tis_cap=None)
  _tiny_run(tmp_path / "sync", staleness=0, tis_cap=2.0)
  _tiny_run(tmp_path / "ahead", staleness=1, tis_cap=2.0)
  sync, ahead = _records(tmp_path / "sync"), _records(tmp_path / "ahead")
  assert [r["rollout/policy_lag"] for r in sync] == [0, 0, 0]
  assert [r["rollout/policy_lag"] for r in ahead] == [0, 1, 1]
  # Batch 1 is played by the initial policy in both runs, so it is the same batch.
  assert ahead[0]["train/outcome"] == sync[0]["train/outcome"]
  assert ahead[0]["train/tied_groups"] == sync[0]["train/tied_groups"]
  assert all(0 <= r["train/tied_groups"] <= 1 for r in sync)
  assert ahead[0]["loss/policy"] == pytest.approx(sync[0]["loss/policy"], rel=1e-5)
  # Synchronous batches come from the policy that trains on them: every weight is 1 up to
  # numerics. One update stale, they are not, and the correction reweights them.
  assert all(abs(r["loss/tis_weight"] - 1) < 1e-4 for r in sync)
  assert abs(ahead[1]["loss/tis_weight"] - 1) > 1e-3


def test_turn_and_sequence_ratio_levels_agree_on_one_turn_rows():
  # With one turn per row, the turn's mean log-ratio is the row's: the two levels must train
  # identically over two epochs (where the ratio is no longer 1), and differ from per-token ratios.
  cfg = transformer.tiny(64, d_model=16, num_heads=2, mlp_dim=32)
  graphdef, params = transformer.create(cfg, 0)
  rng = np.random.default_rng(0)
  traj = types.empty_trajectories(4, 12, 1)
  traj.tokens[:] = rng.integers(8, 64, (4, 12))
  traj.turn_of_token[:, :10] = 0
  traj.action_mask[:, 5:10] = True
  traj.turn_start[:, 0], traj.turn_end[:, 0] = 5, 10
  traj.turn_mask[:, 0] = traj.done[:, 0] = True
  traj.outcome[:] = traj.reward[:, 0] = [1.0, 0.0, 1.0, 0.0]
  traj.group_id[:] = [0, 0, 1, 1]
  traj.sample_logprob[:, 5:10] = -4.0
  losses = {}
  for level in ("token", "turn", "sequence"):
    opt = optax.sgd(1.0)
    update = step_lib.make_update_fn(
        policy_graphdef=graphdef, critic_graphdef=None, policy_optimizer=opt, critic_optimizer=None,
        advantage_fn=functools.partial(estimators.get_estimator("grpo"), num_groups=4),
        loss=step_lib.LossConfig(ppo_epochs=2, ratio_level=level), allowed=None, max_actions=8)
    state = types.ActorCriticState(step=jnp.zeros((), jnp.int32),
                                   rng=jax.random.key_data(jax.random.key(0)),
                                   policy_params=jax.tree.map(jnp.copy, params),
                                   policy_opt_state=opt.init(params))
    state, _ = update(state, jax.tree.map(jnp.asarray, traj))
    losses[level] = jax.tree.leaves(state.policy_params)[0]
  np.testing.assert_allclose(losses["turn"], losses["sequence"], atol=1e-6)
  assert not np.allclose(losses["turn"], losses["token"], atol=1e-6)
