"""LoRA chosen for training: only the adapters move, the checkpoint keeps the base's identity,
and the exported merged checkpoint is the merged policy."""

import glob
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import config_errors
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.learner import step as step_lib
from agentrl_jax.models import hf
from agentrl_jax.models import lora as lora_lib
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

LORA = lora_lib.LoRAConfig(rank=4, alpha=8.0, targets=("wq", "wv", "w_up"))


def _model(vocab_size=1):
  return transformer.TransformerConfig(vocab_size=vocab_size, num_layers=1, d_model=32,
                                       num_heads=4, mlp_dim=64, position="rope")


def _train(workdir, seed=0, iterations=2):
  return learner.train(
      str(workdir),
      config=configs.TrainConfig(env_name="frozenlake", env_kwargs={"size": 4, "max_turns": 6},
                                 num_iterations=iterations, tasks_per_iteration=2, group_size=2,
                                 checkpoint_every=1, seed=seed),
      model=_model(),
      rollout=loop_lib.RolloutConfig(max_turns=6, max_len=192, obs_buckets=(48,),
                                     sampling=sampler_lib.SamplingConfig()),
      # The entropy bonus moves the policy even when every reward is 0 (untrained, tiny).
      loss=step_lib.LossConfig(entropy_coef=0.1, kl_coef=0.05),
      optim=configs.OptimConfig(learning_rate=3e-2),
      warm_start=configs.WarmStartConfig(iterations=0),
      evaluation=configs.EvalConfig(every=100, num_tasks=2, pass_k=0),
      lora=LORA)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("lora_run")
  return workdir, _train(workdir)


def _seed_base():
  vocab = tokenizer_lib.load_tokenizer(None).vocab_size
  model = _model(vocab)
  return model, transformer.create(model, seed=0)[1]


def test_only_the_adapters_train_and_the_export_is_the_merged_policy(run):
  workdir, outcome = run
  model, base = _seed_base()
  adapters = outcome.state.policy_params
  assert set(adapters) == {f"blocks.0.{n}" for n in ("attn.wq", "attn.wv", "mlp.w_up")}
  # b starts at zero: two updates moved it.
  assert any(float(jnp.max(jnp.abs(ad["b"]))) > 0 for ad in adapters.values())
  assert np.isfinite(outcome.final_metrics["loss/policy"])
  assert outcome.final_metrics["memory/peak_rss_gb"] > 0.1  # a live process holds > 100 MB

  exported_cfg, graphdef, exported = hf.load(str(workdir / "lora_merged"))
  flat_base = {hf.path_name(p): np.asarray(v[...]) for p, v in
               jax.tree_util.tree_leaves_with_path(base, is_leaf=lambda x: hasattr(x, "get_metadata"))}
  flat_out = {hf.path_name(p): np.asarray(v[...]) for p, v in
              jax.tree_util.tree_leaves_with_path(exported, is_leaf=lambda x: hasattr(x, "get_metadata"))}
  assert set(flat_out) == set(flat_base)
  for name, weights in flat_base.items():
    if name in adapters:  # the adapted weights are the base plus the adapters' delta
      np.testing.assert_allclose(flat_out[name],
                                 weights + np.asarray(lora_lib.delta(adapters[name], LORA.scale)),
                                 atol=1e-6, err_msg=name)
      assert not np.array_equal(flat_out[name], weights), name
    else:  # every other weight is the seed's base, bit for bit
      np.testing.assert_array_equal(flat_out[name], weights, err_msg=name)

  # The merged checkpoint read back by models/hf.py scores tokens as the merged params do.
  merged = lora_lib.merge(base, adapters, LORA)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, model.vocab_size, (2, 9)), jnp.int32)
  pos = transformer.positions_from_turns(jnp.zeros((2, 9), jnp.int32))
  ours, _ = transformer.apply(transformer.create(model, seed=0)[0], merged, tokens, pos)
  theirs, _ = transformer.apply(graphdef, exported, tokens, pos)
  np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=1e-5)
  _, meta = lora_lib.load_adapters(str(workdir / "lora_adapters"), base)
  assert meta == LORA


def test_the_checkpoint_holds_adapters_and_the_base_identity_not_the_base(run):
  workdir, _ = run
  step = max(int(os.path.basename(p)) for p in glob.glob(str(workdir / "checkpoints" / "[0-9]*")))
  # The manifest and extra items are JSON files; the arrays are binary (skipped unread as text).
  texts = [open(f, errors="ignore").read() for f in glob.glob(
      str(workdir / "checkpoints" / str(step) / "**"), recursive=True) if os.path.isfile(f)]
  texts = [t for t in texts if t.lstrip().startswith("{")]
  manifest = next(json.loads(t) for t in texts if '"leaves"' in t and '"fingerprint"' in t)
  paths = list(manifest["leaves"])
  assert any("wq" in p for p in paths)
  assert not any("embed" in p or "final_norm" in p for p in paths), paths  # no base weight
  extra = next(json.loads(t) for t in texts if "base_fingerprint" in t)
  identity = extra["credit_state"][-1]
  assert identity["base_source"].startswith("seed 0")
  assert identity["base_fingerprint"] == lora_lib.fingerprint(_seed_base()[1])


def test_a_resume_on_another_base_is_refused(run, tmp_path):
  workdir, _ = run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  with pytest.raises(config_errors.ConfigError, match="fingerprint"):
    _train(copy, seed=1, iterations=3)


def test_fingerprint_sees_one_changed_word():
  _, base = _seed_base()
  changed = jax.tree.map(lambda x: x, base)
  changed["embed"].value = changed["embed"].value.at[3, 5].add(1e-3)
  assert lora_lib.fingerprint(changed) != lora_lib.fingerprint(base)
  assert lora_lib.fingerprint(jax.tree.map(lambda x: x, base)) == lora_lib.fingerprint(base)
