"""Opt-in credit diagnostics of the learner: the micro-batch gradient SNR and the batch's
decision density, logged with the iteration's metrics."""

import jax
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.advantages import density
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


@pytest.mark.parametrize("micro_batches", [2, 5])
def test_micro_batch_snr_is_gradient_snr_of_the_scaled_samples(micro_batches):
  rng = np.random.default_rng(micro_batches)
  # Micro-batch gradients g_j of a small two-leaf tree, with a common signal and noise.
  grads = [{"a": rng.normal(1.0, 1.0, (4, 3)), "b": rng.normal(-0.5, 0.5, (5,))}
           for _ in range(micro_batches)]
  summed = jax.tree.map(lambda *g: sum(g), *grads)
  square = sum(float(np.sum(g["a"] ** 2) + np.sum(g["b"] ** 2)) for g in grads)
  got = step_lib.micro_batch_snr(summed, np.float32(square), micro_batches)
  samples = {k: np.stack([micro_batches * g[k] for g in grads]) for k in ("a", "b")}
  want = density.gradient_snr(samples).snr
  np.testing.assert_allclose(float(got), float(want), rtol=1e-4)


def test_gradient_snr_needs_micro_batches():
  with pytest.raises(config_errors.ConfigError, match="micro_batches >= 2"):
    step_lib.LossConfig(gradient_snr=True)


def test_an_iteration_logs_both_diagnostics():
  run = learner.build(
      config=configs.TrainConfig(env_name="dd_chain", env_kwargs={"horizon": 4, "num_decisions": 2},
                                 num_iterations=2, tasks_per_iteration=2, group_size=4,
                                 decision_density_threshold=0.25),
      model=transformer.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                          mlp_dim=64, max_turns=8),
      rollout=loop_lib.RolloutConfig(max_turns=4, max_len=128, obs_buckets=(32,),
                                     sampling=sampler_lib.SamplingConfig()),
      loss=step_lib.LossConfig(micro_batches=2, gradient_snr=True),
      warm_start=configs.WarmStartConfig(iterations=0),
      evaluation=configs.EvalConfig(every=100, num_tasks=2, pass_k=0))
  try:
    _, metrics, traj = run.method.iteration(run.state, 0)
  finally:
    run.method.close()
  assert metrics["credit/gradient_snr"] > 0 and np.isfinite(metrics["credit/gradient_snr"])
  want = float(density.batch_decision_density(traj, 0.25).density)
  assert metrics["credit/decision_density"] == pytest.approx(want)
  assert 0.0 <= want <= 1.0
