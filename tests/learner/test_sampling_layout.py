"""The sampler gets the policy in the 'sample' layout: no fsdp split, so decoding never gathers."""

import jax
import numpy as np

from agentrl_jax.learner import rollouts
from agentrl_jax.models import transformer
from agentrl_jax.parallel import mesh as mesh_lib
from agentrl_jax.parallel import rules as rules_lib


def test_sampling_params_are_resharded_to_the_sample_rules():
  mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(data=1, fsdp=4, tensor=2))
  _, params = transformer.create(transformer.tiny(64, d_model=32, num_heads=4, mlp_dim=64), 0)
  params = rules_lib.shard_state(params, mesh)
  train_specs = [x.sharding.spec for x in jax.tree.leaves(params)]
  assert any("fsdp" in str(spec) for spec in train_specs)
  sampled = rollouts.sampling_layout(params, mesh)(params)
  specs = [x.sharding.spec for x in jax.tree.leaves(sampled)]
  assert not any("fsdp" in str(spec) for spec in specs)
  assert any("tensor" in str(spec) for spec in specs)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(sampled)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_without_a_mesh_the_params_are_used_as_they_are():
  _, params = transformer.create(transformer.tiny(64, d_model=32, num_heads=4, mlp_dim=64), 0)
  assert rollouts.sampling_layout(params, None)(params) is params
