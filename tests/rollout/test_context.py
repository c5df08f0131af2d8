"""Context-window policies: floors as promised, the attention floor mask, TITO under each policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import context
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def test_turn_floor_hand_checked():
  # Observations of turns 0..3 start at tokens 0, 10, 25, 40; turn 3's action may end at 60.
  opens = [0, 10, 25, 40]
  floor = lambda **kw: context.turn_floor(context.ContextConfig(**kw), opens, 60)
  assert floor(policy="full") == 0
  assert floor(policy="last_k", history_turns=0) == 40   # turn 3 alone
  assert floor(policy="last_k", history_turns=1) == 25   # turns 2..3
  assert floor(policy="last_k", history_turns=9) == 0    # fewer turns than k: everything
  # 60 − 0 = 60, 60 − 10 = 50, 60 − 25 = 35, 60 − 40 = 20: the oldest start within the limit.
  assert floor(policy="truncate_oldest", max_context_tokens=35) == 25
  assert floor(policy="truncate_oldest", max_context_tokens=34) == 40
  assert floor(policy="truncate_oldest", max_context_tokens=50) == 10
  assert floor(policy="truncate_oldest", max_context_tokens=10) == 40  # the current turn stays


def test_floor_per_token_hand_checked():
  turn_of_token = jnp.asarray([[0, 0, 1, 1, 1, 2, 2, -1], [0, 1, 1, 1, 1, 1, 1, 1]], jnp.int32)
  context_floor = jnp.asarray([[0, 0, 2], [0, 1, 0]], jnp.float32)
  expected = [[0, 0, 0, 0, 0, 2, 2, 0],   # padding (−1) gets 0
              [0, 1, 1, 1, 1, 1, 1, 1]]
  out = jax.jit(distribution.floor_per_token)(turn_of_token, context_floor)
  assert out.dtype == jnp.int32
  np.testing.assert_array_equal(out, expected)


def test_bad_context_config_is_named():
  with pytest.raises(ValueError, match="policy"):
    context.ContextConfig(policy="sliding")
  with pytest.raises(ValueError, match="history_turns"):
    context.ContextConfig(policy="last_k", history_turns=-1)
  with pytest.raises(ValueError, match="max_context_tokens"):
    context.ContextConfig(policy="truncate_oldest")
  with pytest.raises(ValueError, match="cannot hold one turn"):
    loop_lib.RolloutConfig(obs_buckets=(48,), sampling=sampler_lib.SamplingConfig(max_action_tokens=8),
                           context=context.ContextConfig(policy="truncate_oldest", max_context_tokens=50))


@pytest.mark.parametrize("position,alibi", [("rope", False), ("turn_slot", True)])
def test_attention_floor_hides_exactly_the_keys_below_it(position, alibi):
  cfg = tfm.tiny(30, d_model=32, num_heads=4, mlp_dim=64, position=position, alibi=alibi)
  graphdef, params = tfm.create(cfg, seed=0)
  tokens = jax.random.randint(jax.random.key(1), (1, 10), 0, 30)
  pos = tfm.positions_from_turns(jnp.asarray([[0] * 4 + [1] * 6], jnp.int32))
  floor = jnp.asarray([[0] * 4 + [4] * 6], jnp.int32)   # turn 1 may not see turn 0
  masked = tfm.Positions(*pos, floor)
  out, _ = tfm.apply(graphdef, params, tokens, masked)
  # Changing the hidden tokens changes nothing at or after the floor ...
  other = tokens.at[0, :4].set((tokens[0, :4] + 7) % 30)
  out_other, _ = tfm.apply(graphdef, params, other, masked)
  np.testing.assert_allclose(out_other[0, 4:], out[0, 4:], atol=1e-5)
  # ... and without the floor it would: the mask, not the model, removed them.
  free, _ = tfm.apply(graphdef, params, tokens, pos)
  free_other, _ = tfm.apply(graphdef, params, other, pos)
  assert np.abs(free_other[0, 4:] - free[0, 4:]).max() > 1e-3
  # A zero floor is no mask at all.
  zero, _ = tfm.apply(graphdef, params, tokens, tfm.Positions(*pos, jnp.zeros_like(floor)))
  np.testing.assert_array_equal(zero, free)


def _collect(tok, model, ctx):
  cfg, graphdef, params = model
  # Stop strings cut some actions short, so floors must follow the kept tokens, not the budget.
  sampling = sampler_lib.SamplingConfig(max_action_tokens=3, stop_strings=("o",))
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, loop_lib.RolloutConfig(
      max_turns=8, max_len=200, obs_buckets=(48,), sampling=sampling, context=ctx))
  envs = [registry.make("frozenlake") for _ in range(3)]
  return runner.collect(envs, [0, 1, 2], [0, 1, 2], params=params, rng=jax.random.key(4))


def _replayed_log_probs(model, traj, floor):
  _, graphdef, params = model
  device = jax.tree.map(jnp.asarray, traj)
  pos = distribution.trajectory_positions(device)
  assert (pos.floor is not None) == ("context_floor" in traj.extras)
  if not floor:
    pos = tfm.positions_from_turns(device.turn_of_token)
  view = distribution.action_view(jnp.asarray(traj.action_mask), 16)
  logp, _ = distribution.action_log_probs(graphdef, params, jnp.asarray(traj.tokens), pos, view, None, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  out[np.arange(out.shape[0])[:, None], np.asarray(view.index)] = np.where(view.valid, logp, 0.0)
  return out


def _observation_starts(traj, b):
  """Token offset where each turn's observation starts, read off turn_of_token."""
  turns = traj.turn_of_token[b]
  return [int(np.flatnonzero(turns == k)[0]) for k in range(turns.max() + 1)]


@pytest.mark.parametrize("ctx", [context.ContextConfig(policy="last_k", history_turns=1),
                                 context.ContextConfig(policy="truncate_oldest", max_context_tokens=100)],
                         ids=["last_k", "truncate_oldest"])
def test_recorded_floors_are_the_promised_ones_and_tito_holds(tok, model, ctx):
  traj, _ = _collect(tok, model, ctx)
  floors = traj.extras["context_floor"]
  assert floors.dtype == np.float32 and floors.shape == traj.turn_mask.shape
  for b in range(traj.batch_size):
    opens = _observation_starts(traj, b)
    for k in np.flatnonzero(traj.turn_mask[b]):
      if ctx.policy == "last_k":
        expected = opens[max(0, k - 1)]
      else:  # oldest turn start with (action start + 3-token budget) − start ≤ 100
        end = traj.turn_start[b, k] + 3
        expected = min(s for s in opens[:k + 1] if end - s <= 100)
      assert floors[b, k] == expected, (b, k)
  assert floors.max() > 0  # the episodes ran long enough for the policy to hide something
  mask = traj.action_mask
  np.testing.assert_allclose(_replayed_log_probs(model, traj, True)[mask], traj.sample_logprob[mask],
                             atol=1e-4)
  # The floor matters: scored without it, the same tokens get other log-probs.
  assert np.abs(_replayed_log_probs(model, traj, False)[mask] - traj.sample_logprob[mask]).max() > 1e-3


def test_a_floor_that_hides_nothing_samples_the_same_episodes(tok, model):
  # 'last_k' with more history than turns passes a zero floor through the masked code path.
  full, _ = _collect(tok, model, context.ContextConfig())
  wide, _ = _collect(tok, model, context.ContextConfig(policy="last_k", history_turns=8))
  assert "context_floor" not in full.extras and not wide.extras["context_floor"].any()
  np.testing.assert_array_equal(wide.tokens, full.tokens)
  # Two different programs: XLA may order their float operations differently (it does at
  # another optimisation level), so the log-probs agree to rounding, not bit for bit.
  np.testing.assert_allclose(wide.sample_logprob, full.sample_logprob, rtol=1e-6, atol=1e-6)
