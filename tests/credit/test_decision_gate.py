"""Tests for agentrl_jax.credit.decision_gate (docs/methods.md#decision-density)."""

import jax
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax.credit import decision_gate
from agentrl_jax.envs import dd_chain
from agentrl_jax.rollout import loop

from credit_batches import Turn, make_batch, outcome_advantages, random_batch

GATE = jax.jit(decision_gate.oracle_decision_gate)


def _with_decisions(traj, decision):
  return traj.replace(extras={extra_keys.DECISION_TURN_KEY: np.asarray(decision, np.float32)})


def test_hand_checked_gate():
  # Row 0: three turns, decision only on turn 1 -> its two tokens keep 0.5, the others 0.
  # Row 1: two turns, both decisions -> unchanged (-1 on its three action tokens).
  traj = make_batch([[Turn(act=(10,)), Turn(act=(11, 12)), Turn(act=(13,))],
                     [Turn(act=(10, 11)), Turn(act=(12,))]], max_len=12, max_turns=3)
  a = outcome_advantages(traj, [0.5, -1.0])
  out = np.asarray(GATE(_with_decisions(traj, [[0, 1, 0], [1, 1, 0]]), a))
  want = np.zeros_like(a)
  want[0, traj.turn_start[0, 1]:traj.turn_end[0, 1]] = 0.5
  want[1] = a[1]
  np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("seed", range(3))
def test_matches_a_loop_over_turns(seed):
  rng = np.random.default_rng(seed)
  traj = random_batch(rng)
  decision = rng.random(traj.turn_mask.shape) < 0.4
  a = rng.normal(size=traj.tokens.shape).astype(np.float32)
  want = a.copy()
  for b in range(a.shape[0]):
    for k in range(traj.turn_mask.shape[1]):
      if traj.turn_mask[b, k] and not decision[b, k]:
        want[b, traj.turn_start[b, k]:traj.turn_end[b, k]] = 0.0
  out = np.asarray(GATE(_with_decisions(traj, decision), a))
  np.testing.assert_array_equal(out, want)  # observation tokens keep whatever they carried


def test_all_decision_turns_is_the_identity_and_missing_oracle_is_named():
  traj = random_batch(np.random.default_rng(7))
  a = np.random.default_rng(8).normal(size=traj.tokens.shape).astype(np.float32)
  np.testing.assert_array_equal(GATE(_with_decisions(traj, np.ones(traj.turn_mask.shape)), a), a)
  with pytest.raises(ValueError, match="needs traj.extras\\['decision_turn'\\]"):
    decision_gate.oracle_decision_gate(traj, a)


def test_dd_chain_step_info_becomes_the_gates_input():
  # The rollout writes each step's info with `record_step_info`; DD-Chain's reaches the gate's key.
  env = dd_chain.DDChain(horizon=6, num_decisions=2)  # D = {0, 5}
  traj = make_batch([[Turn()] * 6], max_len=24, max_turns=6)
  env.reset(0)
  for turn in range(6):
    loop.record_step_info(traj, env.step("1").info, 0, turn)
  np.testing.assert_array_equal(traj.extras[extra_keys.DECISION_TURN_KEY][0], env.decision_mask)
