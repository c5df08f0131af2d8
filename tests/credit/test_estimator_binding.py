"""The run's estimator as a function bound in gin, as a registry name, or as a partial.

Each form gives the same pipeline output as calling the estimator with those hyperparameters
directly, and a hyperparameter bound in gin changes the output (so the binding is not ignored).
"""

import functools

import gin
import numpy as np
import pytest

from agentrl_jax.advantages import estimators
from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs

from credit_batches import Turn, make_batch


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def two_groups():
  """Two groups of two; step rewards differ between siblings so `discount` and `step_weight` matter."""
  rows = [[Turn(act=(20,), obs_hash=1, reward=0.0), Turn(act=(30,), obs_hash=2, reward=1.0)],
          [Turn(act=(21,), obs_hash=1, reward=0.5), Turn(act=(31,), obs_hash=3, reward=0.0)],
          [Turn(act=(22,), obs_hash=5, reward=0.0), Turn(act=(32,), obs_hash=6, reward=0.0)],
          [Turn(act=(23,), obs_hash=5, reward=1.0), Turn(act=(33,), obs_hash=7, reward=0.0)]]
  return make_batch(rows, max_len=8, max_turns=2, group_id=np.array([0, 0, 1, 1]))


def config(**kw):
  return configs.TrainConfig(tasks_per_iteration=2, group_size=2, **kw)


def direct(**hyperparams):
  return np.asarray(estimators.gigpo(two_groups(), num_groups=4, **hyperparams).advantages)


def advantages(train_config):
  return np.asarray(assembly.credit_pipeline(train_config)(two_groups()).advantages)


def test_gin_bound_function_applies_its_hyperparameters(clean_gin):
  gin.parse_config("""
from __gin__ import dynamic_registration
from agentrl_jax.advantages import estimators
from agentrl_jax.learner import configs
configs.TrainConfig.estimator = @estimators.gigpo
estimators.gigpo.step_weight = 0.25
estimators.gigpo.discount = 0.5
""")
  bound = gin.get_configurable(configs.TrainConfig)(tasks_per_iteration=2, group_size=2)
  out = advantages(bound)
  np.testing.assert_allclose(out, direct(step_weight=0.25, discount=0.5), atol=1e-6)
  assert not np.allclose(out, direct())
  assert estimators.resolve(bound.estimator).name == "gigpo"


def test_registry_name_picks_up_gin_bindings(clean_gin):
  gin.parse_config("""
from __gin__ import dynamic_registration
from agentrl_jax.advantages import estimators
estimators.gigpo.step_weight = 0.25
""")
  np.testing.assert_allclose(advantages(config(estimator="gigpo")), direct(step_weight=0.25),
                             atol=1e-6)


def test_partial_and_plain_name(clean_gin):
  np.testing.assert_allclose(
      advantages(config(estimator=functools.partial(estimators.gigpo, step_weight=0.25))),
      direct(step_weight=0.25), atol=1e-6)
  np.testing.assert_allclose(advantages(config(estimator="gigpo")), direct(), atol=1e-6)


def test_critic_flag_follows_the_function():
  assert estimators.resolve(functools.partial(estimators.gae, discount=0.9)).needs_critic
  with pytest.raises(ValueError, match="'gae' needs a critic"):
    assembly.credit_pipeline(config(estimator=estimators.gae))


def test_own_estimator_function_runs():
  def constant(traj, values=None):
    del values
    adv = np.asarray(traj.action_mask, np.float32)
    return estimators.AdvantageOutput(advantages=adv, returns=adv)

  spec = estimators.resolve(constant)
  assert (spec.name, spec.needs_critic) == ("constant", False)
  np.testing.assert_array_equal(advantages(config(estimator=constant)),
                                np.asarray(two_groups().action_mask, np.float32))


def test_not_a_function_is_named():
  with pytest.raises(ValueError, match="a function or a registry name"):
    estimators.resolve(3)
