"""LoRA: starts at the base, merges as W + (alpha/r)·A·B, trains only the adapters, exports."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentrl_jax.models import hf
from agentrl_jax.models import lora
from agentrl_jax.models import transformer

CFG = transformer.tiny(30, d_model=16, num_heads=2, num_kv_heads=1, mlp_dim=32, qkv_bias=True)
LORA = lora.LoRAConfig(rank=2, alpha=4.0, targets=("wq", "wo", "w_down"))


def _setup():
  graphdef, base = transformer.create(CFG, seed=0)
  return graphdef, base, lora.init_adapters(base, LORA, seed=1)


def _flat(params):
  return {hf.path_name(p): np.asarray(v[...]) for p, v in
          jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda x: isinstance(x, hf.nnx.Variable))}


def test_adapters_cover_the_targets_and_start_at_the_base():
  _, base, adapters = _setup()
  # 2 layers x 3 targets.
  assert sorted(adapters) == sorted(f"blocks.{i}.{m}" for i in range(2)
                                    for m in ("attn.wq", "attn.wo", "mlp.w_down"))
  assert adapters["blocks.0.attn.wq"]["a"].shape == (16, 2)        # [D, r]
  assert adapters["blocks.0.attn.wq"]["b"].shape == (2, 2, 8)      # [r, H, Dh]
  assert adapters["blocks.0.attn.wo"]["a"].shape == (2, 8, 2)      # [H, Dh, r]
  for k, v in _flat(lora.merge(base, adapters, LORA)).items():
    np.testing.assert_array_equal(v, _flat(base)[k])


def test_merge_adds_scaled_low_rank_product():
  _, base, adapters = _setup()
  rng = np.random.default_rng(0)
  adapters = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), adapters)
  merged = _flat(lora.merge(base, adapters, LORA))
  a = np.asarray(adapters["blocks.1.attn.wo"]["a"])  # [H, Dh, r]
  b = np.asarray(adapters["blocks.1.attn.wo"]["b"])  # [r, D]
  want = _flat(base)["blocks.1.attn.wo"].copy()
  for h in range(2):
    for k in range(8):
      for d in range(16):
        want[h, k, d] += (4.0 / 2) * sum(a[h, k, r] * b[r, d] for r in range(2))
  np.testing.assert_allclose(merged["blocks.1.attn.wo"], want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(merged["blocks.1.attn.wk"], _flat(base)["blocks.1.attn.wk"])


def test_training_moves_only_the_adapters():
  graphdef, base, adapters = _setup()
  tree = lora.trainable(base, adapters)
  tx = lora.optimizer(optax.adam(1e-2))
  opt_state = tx.init(tree)
  tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 30)
  pos = transformer.positions_from_turns(jnp.zeros((2, 8), jnp.int32))

  def loss_fn(tree):
    logits, _ = transformer.apply(graphdef, lora.merged(tree, LORA), tokens, pos)
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  @jax.jit
  def step(tree, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(tree)
    updates, opt_state = tx.update(grads, opt_state, tree)
    return optax.apply_updates(tree, updates), opt_state, loss, grads

  first = None
  for _ in range(5):
    tree, opt_state, loss, grads = step(tree, opt_state)
    first = loss if first is None else first
  assert loss < first
  assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["base"]))
  for k, v in _flat(tree["base"]).items():
    np.testing.assert_array_equal(v, _flat(base)[k])
  assert max(float(jnp.abs(x["b"]).max()) for x in tree["lora"].values()) > 0


def test_export_merged_and_separate_round_trip(tmp_path):
  _, base, adapters = _setup()
  rng = np.random.default_rng(1)
  adapters = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), adapters)
  tree = lora.trainable(base, adapters)
  lora.export_merged(str(tmp_path / "merged"), CFG, tree, LORA, model_type="qwen2")
  _, _, loaded = hf.load(str(tmp_path / "merged"))
  for k, v in _flat(lora.merge(base, adapters, LORA)).items():
    np.testing.assert_array_equal(_flat(loaded)[k], v)

  lora.save_adapters(str(tmp_path / "adapters"), adapters, LORA, CFG)
  back, config = lora.load_adapters(str(tmp_path / "adapters"), base)
  assert config == LORA
  for name in adapters:
    for part in ("a", "b"):
      np.testing.assert_array_equal(np.asarray(back[name][part]), np.asarray(adapters[name][part]))
  stored = hf.open_safetensors(str(tmp_path / "adapters" / lora.ADAPTER_FILE))
  # q_proj: lora_A [r, D] = [2, 16], lora_B [H*Dh, r] = [16, 2].
  assert stored["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (2, 16)
  assert stored["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].shape == (16, 2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(rank=0), "rank"), (dict(alpha=0.0), "alpha"), (dict(targets=("wz",)), "unknown"),
])
def test_bad_lora_config_names_the_field(kwargs, match):
  with pytest.raises(ValueError, match=match):
    lora.LoRAConfig(**kwargs)
