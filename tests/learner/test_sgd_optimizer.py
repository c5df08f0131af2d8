"""`OptimConfig.optimizer = 'sgd'`: clipped SGD with momentum and decoupled weight decay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.learner import assembly
from agentrl_jax.learner import configs


def _numpy_sgd(grads, w0, *, lr0, lr1, total, momentum, decay, max_norm):
  """The reference loop: clip, momentum trace, decoupled decay, linearly decayed rate."""
  w, trace = w0.copy(), np.zeros_like(w0)
  for k, g in enumerate(grads):
    norm = np.sqrt(np.sum(g ** 2))
    g = g * min(1.0, max_norm / norm)
    trace = g + momentum * trace
    rate = lr0 + (lr1 - lr0) * min(k, total) / total
    w = w - rate * (trace + decay * w)
  return w


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sgd_matches_a_numpy_loop(momentum):
  steps = 6
  config = configs.OptimConfig(optimizer="sgd", learning_rate=0.1, end_learning_rate=0.02,
                               b1=momentum, weight_decay=0.01, max_grad_norm=1.0)
  optimizer = assembly.make_optimizer(config, steps)
  rng = np.random.default_rng(0)
  # Gradients of norm ~3 and ~0.3: the clip acts on some steps and not on others.
  grads = [rng.normal(size=16).astype(np.float32) * s for s in (0.8, 0.08, 0.8, 0.08, 0.8, 0.08)]
  w0 = rng.normal(size=16).astype(np.float32)
  params = {"w": jnp.asarray(w0)}
  state = optimizer.init(params)
  for g in grads:
    updates, state = optimizer.update({"w": jnp.asarray(g)}, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  expected = _numpy_sgd(grads, w0, lr0=0.1, lr1=0.02, total=steps, momentum=momentum,
                        decay=0.01, max_norm=1.0)
  np.testing.assert_allclose(np.asarray(params["w"]), expected, rtol=1e-5, atol=1e-6)


def test_sgd_holds_no_second_moment():
  config = configs.OptimConfig(optimizer="sgd", learning_rate=0.1)
  state = assembly.make_optimizer(config, 4).init({"w": jnp.zeros(3)})
  assert not [s for s in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "nu"))
              if hasattr(s, "nu")]


@pytest.mark.parametrize("kwargs, message", [
    (dict(optimizer="lion"), "optimizer must be one of"),
    (dict(b1=1.0), "b1 must be in"),
])
def test_bad_optimizer_settings_are_named(kwargs, message):
  with pytest.raises(ValueError, match=message):
    configs.OptimConfig(**kwargs)
