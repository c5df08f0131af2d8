"""Adam's first moment in bfloat16 (`OptimConfig.first_moment_dtype`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs


def _descend(dtype: str, steps: int = 20):
  optimizer = assembly.make_optimizer(
      configs.OptimConfig(learning_rate=0.05, first_moment_dtype=dtype), steps)
  target = jnp.linspace(-1.0, 1.0, 64)
  params = {"w": jnp.zeros(64)}
  state = optimizer.init(params)
  loss = lambda p: jnp.sum((p["w"] - target) ** 2)
  for _ in range(steps):
    updates, state = optimizer.update(jax.grad(loss)(params), state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params, state


def test_bf16_first_moment_is_stored_in_bf16_and_second_in_f32():
  _, state = _descend("bfloat16", steps=1)
  dtypes = {str(getattr(leaf, "dtype", "")) for leaf in jax.tree.leaves(state)}
  adam = [s for s in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "mu")) if hasattr(s, "mu")]
  assert adam and adam[0].mu["w"].dtype == jnp.bfloat16 and adam[0].nu["w"].dtype == jnp.float32
  assert "bfloat16" in dtypes


def test_bf16_first_moment_follows_the_f32_path_closely():
  f32, _ = _descend("float32")
  bf16, _ = _descend("bfloat16")
  # Twenty steps of 0.05 move w about 1.0; bf16 rounding of mu (8-bit mantissa) stays below 1%.
  np.testing.assert_allclose(bf16["w"], f32["w"], atol=1e-2)
  assert float(jnp.abs(f32["w"]).max()) > 0.5


def test_unknown_dtype_is_named():
  with pytest.raises(ValueError, match="first_moment_dtype must be 'float32' or 'bfloat16'"):
    configs.OptimConfig(first_moment_dtype="float16")
