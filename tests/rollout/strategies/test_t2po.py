"""T²PO turn-level dynamic sampling (docs/methods.md#t2po)."""

import jax
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax.envs import registry
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout.strategies import t2po


def _make_env():
  return registry.make("frozenlake")


def test_turn_uncertainty_by_hand():
  entropy = np.array([[0.2, 0.6, 1.0], [0.5, 0.0, 0.0]])
  confidence = np.array([[0.9, 0.5, 0.1], [0.4, 0.0, 0.0]])
  valid = np.array([[1, 1, 1], [1, 0, 0]], bool)
  u = t2po.turn_uncertainty(entropy, confidence, valid, alpha=0.5, window=2)
  # Row 0, window 2: j=0: H̄=.2, C̄=.9 -> .5*.2+.5*.1=.15; j=1: H̄=.4, C̄=.7 -> .2+.15=.35;
  # j=2: H̄=.8, C̄=.3 -> .4+.35=.75; U = (.15+.35+.75)/3 = 1.25/3.
  # Row 1: one token: .5*.5 + .5*.6 = .55.
  np.testing.assert_allclose(u, [1.25 / 3, 0.55])


def test_resample_rule_by_hand():
  u = np.array([0.5, 0.5, 0.6, 0.9, 0.5])
  prev = np.array([0.5, 0.4, 0.3, 0.5, 0.45])
  live = np.array([1, 1, 1, 1, 0], bool)
  # Δ = 0 (not > 0), .1 (< .3: yes), .3 (not < .3), .4 (no), .05 but the row is not live.
  np.testing.assert_array_equal(t2po.resample_mask(u, prev, live, 1, 0.3), [0, 1, 0, 0, 0])
  assert not t2po.resample_mask(u, prev, live, 0, 0.3).any()  # turn 0 never


def test_identical_scores_are_never_resampled(word_runner, model, check_layout):
  # Zero weights give uniform logits over the four moves: every turn's U is the same number,
  # H = log 4 / log 4 = 1, C = 1/4 -> U = .5*1 + .5*.75 = .875, so Δ = 0 and nothing is redrawn.
  zeros = jax.tree.map(np.zeros_like, model[2])
  seeds = [0, 1, 2, 3]
  traj, _ = t2po.TurnResampling(threshold=1.0).collect(
      word_runner, _make_env, seeds, seeds, params=zeros, rng=jax.random.key(0))
  check_layout(traj, word_runner, 4)
  np.testing.assert_allclose(traj.extras["t2po_uncertainty"][traj.turn_mask], 0.875, atol=1e-6)
  assert not traj.extras["t2po_retries"].any()


def test_retries_are_capped_and_never_at_turn_zero(word_runner, model, check_tito):
  seeds = [0, 1, 2, 3, 4, 5]
  # η = 2 exceeds any |ΔU| (U is in [0, 1]): every live turn k >= 1 is redrawn exactly max_try times.
  traj, stats = t2po.TurnResampling(threshold=2.0, max_try=2).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(3))
  retries = traj.extras["t2po_retries"]
  played = traj.turn_mask
  assert not retries[:, 0].any()
  np.testing.assert_array_equal(retries[:, 1:][played[:, 1:]], 2)
  assert stats.turns == played.sum() and traj.action_mask.sum() == played.sum()
  assert stats.sampled_tokens == played.sum() + 2 * played[:, 1:].sum()
  check_tito(word_runner, traj)
  # η = 0: 0 < Δ < 0 never holds, so TDS is plain sampling.
  none, _ = t2po.TurnResampling(threshold=0.0).collect(
      word_runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(3))
  assert not none.extras["t2po_retries"].any()
  plain, _ = word_runner.collect([_make_env() for _ in seeds], seeds, seeds, params=model[2],
                                 rng=jax.random.key(3))
  np.testing.assert_array_equal(none.tokens, plain.tokens)


@pytest.mark.slow  # the free-text runner's compile; the word-runner tests cover the rule
def test_kept_turns_satisfy_the_rule_unless_out_of_tries(free_runner, model, check_tito,
                                                          check_layout):
  seeds = [0, 1, 2, 3]
  method = t2po.TurnResampling(threshold=0.05, max_try=2)
  traj, _ = method.collect(free_runner, _make_env, seeds, seeds, params=model[2],
                           rng=jax.random.key(1))
  check_layout(traj, free_runner, 4)
  u, retries = traj.extras["t2po_uncertainty"], traj.extras["t2po_retries"]
  assert retries.max() <= 2 and retries.any()
  for b in range(4):
    played = np.flatnonzero(traj.turn_mask[b])
    for k in played[1:]:
      delta = abs(float(u[b, k]) - float(u[b, k - 1]))
      if retries[b, k] < 2:  # stopped early: the kept draw passed the test
        assert not 0 < delta < 0.05, (b, k, delta)
  check_tito(free_runner, traj)


def test_bad_config_is_rejected():
  with pytest.raises(ValueError, match="threshold"):
    t2po.TurnResampling(threshold=-1.0)
  with pytest.raises(ValueError, match="max_try"):
    t2po.TurnResampling(max_try=-1)
  with pytest.raises(ValueError, match="alpha"):
    t2po.TurnResampling(alpha=2.0)


def test_thinking_intervention_in_resampled_turns(tok, model, runner_for, check_tito, check_layout):
  # ε = 2 exceeds any |ΔM|: every block is forced shut at j = max(min_tokens, window + 1) = 2
  # unless the policy closes it or stops first; η = 2 redraws every turn k >= 1 once, so kept
  # turns come from both the first and the resampled draws.
  thinking = sampler_lib.ThinkingConfig(open_token_id=tok.bos_id, close_token_id=tok.eos_id,
                                        min_tokens=2, budget=3, window=1, epsilon=2.0,
                                        start_thinking=True)
  runner = runner_for(sampler_lib.SamplingConfig(max_action_tokens=5, stop_token_ids=(tok.end_id,),
                                                 thinking=thinking))
  seeds = [0, 1, 2, 3]
  traj, _ = t2po.TurnResampling(threshold=2.0, max_try=1).collect(
      runner, _make_env, seeds, seeds, params=model[2], rng=jax.random.key(5))
  check_layout(traj, runner, 4)
  assert traj.extras["t2po_retries"][:, 1:].any()
  forced_total = 0
  for b, k in zip(*np.nonzero(traj.turn_mask)):
    ids = traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]]
    forced = ~traj.action_mask[b, traj.turn_start[b, k]:traj.turn_end[b, k]]
    assert traj.extras[extra_keys.THINK_FORCED_KEY][b, k] == forced.sum()
    for j in np.flatnonzero(forced):
      # A forced token is the close, after exactly two thinking tokens (the first close).
      assert ids[j] == tok.eos_id and j == 2 and tok.eos_id not in ids[:j], (b, k, ids)
    forced_total += forced.sum()
  assert forced_total > 0
  check_tito(runner, traj)
