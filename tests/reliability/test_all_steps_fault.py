"""An env that faults on every step stops the run with the env's own error, not a success of 0."""

import pytest

from agentrl_jax.envs import frozenlake
from agentrl_jax.envs import registry
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib


@registry.register("test_broken_lake")
class BrokenLake(frozenlake.FrozenLake):
  """FrozenLake whose engine fails at every step, like an env whose data file is missing."""

  def _step(self, action):
    raise OSError("lake data file missing: /nowhere/lake.bin")


def test_a_run_whose_env_faults_on_every_step_stops_naming_the_fault(tmp_path):
  with pytest.raises(registry.EnvFaultError, match="lake data file missing"):
    learner.train(
        str(tmp_path),
        config=configs.TrainConfig(env_name="test_broken_lake", num_iterations=2,
                                   tasks_per_iteration=2, group_size=2,
                                   restrict_to_action_words=True),
        model=transformer.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                            mlp_dim=64, position="turn_slot", alibi=True,
                                            max_turns=16, max_slots=64),
        rollout=loop_lib.RolloutConfig(max_turns=10, max_len=288, obs_buckets=(48,),
                                       length_buckets=(288,)),
        warm_start=configs.WarmStartConfig(iterations=0),
        evaluation=configs.EvalConfig(num_tasks=2, pass_k=0))
  # It stopped at the first batch: no iteration was recorded as trained.
  assert not (tmp_path / "checkpoints" / "1").exists()
