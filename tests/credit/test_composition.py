"""Two corrections (GCA, then C³) composed after two different estimators (GRPO, RLOO).

The corrections never learn which estimator ran: the same pipeline stage gives the hand-derived
arrays after either.
"""

import functools

import jax
import numpy as np
import pytest

from agentrl_jax.advantages import estimators
from agentrl_jax.credit import c3
from agentrl_jax.credit import gca
from agentrl_jax.learner import pipeline
from agentrl_jax.rewards import curiosity

from credit_batches import Turn, make_batch


def search_pair():
  """One group of two; turn 0 searches, turn 1 answers (one action token each, logp −1).

  Row 0: the search found the evidence, the answer is right (outcome 1) but its action was
  rejected by the env (flagged for C³). Row 1: nothing found, wrong answer (outcome 0).
  """
  rows = [[Turn(act=(20,), obs_hash=1, logp=-1.0), Turn(act=(30,), obs_hash=2, valid=False, logp=-1.0, reward=1.0)],
          [Turn(act=(21,), obs_hash=3, logp=-1.0), Turn(act=(31,), obs_hash=4, logp=-1.0)]]
  traj = make_batch(rows, max_len=8, max_turns=2)
  return traj.replace(
      sub_outcomes={"answer_correct": np.array([1.0, 0.0], np.float32)},
      extras={"search_turn": np.array([[True, False]] * 2),
              "evidence_turn": np.array([[True, False], [False, False]])})


def run(estimator_name, traj, shapers=()):
  credit = pipeline.CreditPipeline(
      estimator=functools.partial(estimators.get_estimator(estimator_name), num_groups=2),
      reward_shapers=tuple(shapers), corrections=(gca.grounded_credit, c3.c3))
  return np.asarray(jax.jit(credit)(traj).advantages)


@pytest.mark.parametrize("estimator_name, base", [
    # GRPO: outcomes [1, 0], mean 0.5, unbiased std √0.5 → A = ±0.5/(√0.5 + 1e-6).
    ("grpo", 0.5 / (np.sqrt(0.5) + 1e-6)),
    # RLOO: A_b = R_b − mean of the others = [1 − 0, 0 − 1].
    ("rloo", 1.0),
])
def test_gca_then_c3_after_two_estimators(estimator_name, base):
  traj = search_pair()
  out = run(estimator_name, traj)
  # Row 0 search token: GCA +10% → 1.1·A; answer token: GCA leaves it (found ∧ correct), C³
  # shrinks it by 1 − conf = 1 − e^−1. Row 1: −A everywhere (no evidence, wrong: no GCA case;
  # C³ never touches negatives). Observation tokens stay 0.
  expected = np.zeros((2, 8), np.float32)
  expected[0, traj.turn_start[0, 0]] = 1.1 * base
  expected[0, traj.turn_start[0, 1]] = (1 - np.exp(-1.0)) * base
  expected[1, traj.turn_start[1]] = -base
  np.testing.assert_allclose(out, expected, atol=1e-5)


def test_shaper_then_estimator_then_corrections():
  # Row 1 now revisits its first observation (hash 3 → 3): curiosity takes 0.1 from its outcome,
  # so RLOO gives [1 − (−0.1), −0.1 − 1] = [1.1, −1.1]; then GCA and C³ as above.
  traj = search_pair()
  traj = traj.replace(obs_hash=np.array([[1, 2], [3, 3]], np.int32))
  out = run("rloo", traj, shapers=(curiosity.duplicate_observation_penalty,))
  expected = np.zeros((2, 8), np.float32)
  expected[0, traj.turn_start[0, 0]] = 1.1 * 1.1
  expected[0, traj.turn_start[0, 1]] = (1 - np.exp(-1.0)) * 1.1
  expected[1, traj.turn_start[1]] = -1.1
  np.testing.assert_allclose(out, expected, atol=1e-5)
