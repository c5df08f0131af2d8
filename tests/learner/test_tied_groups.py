"""`train/tied_groups`: the share of groups a group-relative baseline gives no gradient."""

import numpy as np
import pytest

from agentrl_jax.learner import batches


def _loop(group_id, outcome):
  groups = {}
  for g, o in zip(group_id, outcome):
    groups.setdefault(int(g), []).append(float(o))
  sized = [v for v in groups.values() if len(v) > 1]
  return sum(max(v) == min(v) for v in sized) / len(sized) if sized else 0.0


def test_hand_checked():
  # Groups 0 (1, 1: tied), 1 (0, 1: not), 2 (0.5 alone: not counted), 3 (0, 0, 0: tied).
  group = np.array([3, 0, 1, 0, 2, 1, 3, 3])
  outcome = np.array([0.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.0])
  assert batches.tied_group_fraction(group, outcome) == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", range(4))
def test_matches_a_loop_over_groups(seed):
  rng = np.random.default_rng(seed)
  group = rng.integers(0, 12, size=40)
  outcome = rng.integers(0, 2, size=40).astype(np.float32) * rng.choice([1.0, 0.5], size=40)
  assert batches.tied_group_fraction(group, outcome) == pytest.approx(_loop(group, outcome))


def test_no_group_of_two_is_zero():
  assert batches.tied_group_fraction(np.arange(5), np.zeros(5)) == 0.0
  assert batches.tied_group_fraction(np.zeros(0, np.int32), np.zeros(0)) == 0.0
