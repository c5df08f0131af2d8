"""Shared property tests of every correction (docs/methods.md#correction-properties).

(sign) sign(A') ∈ {sign(A), 0}; (support) tokens outside the corrector's mask are unchanged;
(identity) a neutral input gives A' = A; (jit) the same result under `jax.jit` and under `vmap`
over a leading batch axis; (dtype) bf16 advantages in, bf16 out, close to the fp32 result.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.credit import c3
from agentrl_jax.credit import deltattg
from agentrl_jax.credit import gca
from agentrl_jax.credit import pearl
from agentrl_jax.credit import serl

from credit_batches import random_batch

B, L, N = 6, 32, 4


def base_batch(seed):
  rng = np.random.default_rng(seed)
  traj = random_batch(rng, b=B, max_len=L, max_turns=N)
  search = rng.random((B, N)) < 0.6
  extras = {
      "search_turn": search,
      "evidence_turn": search & (rng.random((B, N)) < 0.5),
      "teacher_logprob": (traj.sample_logprob + rng.normal(size=(B, L))).astype(np.float32),
      "update_step": np.int32(3),
  }
  sub = {"answer_correct": (rng.random(B) < 0.5).astype(np.float32)}
  traj = traj.replace(extras=extras, sub_outcomes=sub,
                      outcome=(rng.random(B) < 0.5).astype(np.float32))
  # Advantages everywhere, observation and padding tokens included, to see what a method touches.
  a = rng.normal(size=(B, L)).astype(np.float32)
  # Mostly one sign per trajectory (as outcome estimators give), some tokens of the other sign.
  a = np.abs(a) * np.where(rng.random((B, L)) < 0.8, 1.0, -1.0) * np.array([1, -1] * (B // 2))[:, None]
  a = a.astype(np.float32)
  a[rng.random((B, L)) < 0.1] = 0.0
  return traj, a


def neutral(name, traj):
  """The method's neutral input: nothing found, nothing flagged, equal progress, teacher = student."""
  if name == "gca":
    extras = dict(traj.extras, evidence_turn=np.zeros((B, N), bool))
    return traj.replace(extras=extras)
  if name == "c3":
    return traj.replace(action_valid=np.ones((B, N), bool),
                        obs_hash=np.arange(B * N, dtype=np.int32).reshape(B, N))
  if name == "serl":
    return traj.replace(extras=dict(traj.extras, teacher_logprob=traj.sample_logprob))
  return traj


def _meter(traj):
  # Remaining effort falling by one per turn to 0 at the end: every Δ equal for completed rows.
  n = traj.turn_mask.sum(1, keepdims=True)
  return jnp.where(traj.turn_mask, n - jnp.arange(N)[None, :], 0.0).astype(jnp.float32)


def make_corrector(name, traj):
  if name == "gca":
    return gca.grounded_credit
  if name == "c3":
    return c3.c3
  if name == "serl":
    return serl.environment_reweighted_credit
  if name == "deltattg_random_meter":
    params = deltattg.init_meter(deltattg.MeterConfig(num_buckets=64, width=8, hidden=8),
                                 jax.random.key(0))
    return deltattg.DeltaTTG(params=params)
  if name == "deltattg_constant_progress":
    return lambda t, a: deltattg.ttg_redistribution(t, a, _meter(t))
  if name == "pearl":
    memory = pearl.PearlMemory(min_count=1, cluster_threshold=0.3, update_memory=False)
    decisions = jax.device_get(memory.decisions(traj))
    for _ in range(2):  # two steps, so every failure cluster counts as recurring
      memory.observe(decisions._replace(upper_success=np.zeros(B, bool)))
    return memory
  raise KeyError(name)


NAMES = ["gca", "c3", "serl", "deltattg_random_meter", "deltattg_constant_progress", "pearl"]


@pytest.mark.parametrize("name", NAMES)
def test_sign_support_and_purity(name):
  traj, a = base_batch(0)
  correct = make_corrector(name, traj)
  before = a.copy()
  out = np.asarray(jax.jit(correct)(traj, a))
  np.testing.assert_array_equal(a, before)                               # inputs not mutated
  assert np.all((np.sign(out) == np.sign(a)) | (out == 0))
  outside = ~traj.action_mask
  np.testing.assert_array_equal(out[outside], a[outside])
  if name != "deltattg_constant_progress":  # that one is the identity case on completed rows
    assert np.any(out != a), "the property test should exercise a non-trivial correction"


@pytest.mark.parametrize("name", ["gca", "c3", "serl", "deltattg_constant_progress", "pearl"])
def test_identity_on_neutral_input(name):
  traj, a = base_batch(1)
  if name == "deltattg_constant_progress":
    traj = traj.replace(success=np.ones(B, bool))
    a = np.where(traj.action_mask, a[:, :1], 0.0).astype(np.float32)  # a trajectory advantage
  if name == "pearl":
    correct = pearl.PearlMemory(update_memory=False)  # empty memory
  else:
    correct = make_corrector(name, traj)
  np.testing.assert_allclose(jax.jit(correct)(neutral(name, traj), a), a, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_jit_and_vmap_agree(name):
  traj0, a0 = base_batch(2)
  traj1, a1 = base_batch(3)
  correct = make_corrector(name, traj0)
  eager = np.stack([np.asarray(correct(traj0, a0)), np.asarray(correct(traj1, a1))])
  np.testing.assert_allclose(jax.jit(correct)(traj0, a0), eager[0], atol=1e-5)
  stacked = jax.tree.map(lambda x, y: np.stack([x, y]), traj0, traj1)
  np.testing.assert_allclose(jax.vmap(correct)(stacked, np.stack([a0, a1])), eager, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_in_bf16_out(name):
  traj, a = base_batch(4)
  correct = make_corrector(name, traj)
  a16 = jnp.asarray(a, jnp.bfloat16)
  jitted = jax.jit(correct)
  out16 = jitted(traj, a16)
  assert out16.dtype == jnp.bfloat16
  reference = np.asarray(jitted(traj, np.asarray(a16.astype(jnp.float32))))
  # One bf16 rounding of the output: relative error ≤ 2^−8.
  np.testing.assert_allclose(np.asarray(out16, np.float32), reference, rtol=2 ** -8, atol=1e-6)
