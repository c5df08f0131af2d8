"""The shared group view: checked against a dict loop over groups, ids in any order."""

import numpy as np
import pytest

from agentrl_jax.rollout import groups as groups_lib
from agentrl_jax.rollout.strategies import tsr


def _loop(group_id, values):
  groups = {}
  for g, v in zip(group_id, values):
    groups.setdefault(int(g), []).append(float(v))
  return {g: groups[g] for g in sorted(groups)}


@pytest.mark.parametrize("seed", range(3))
def test_sizes_ties_and_means_match_a_loop(seed):
  rng = np.random.default_rng(seed)
  group = rng.choice([7, 3, 11, 40, 2], size=30)
  outcome = rng.integers(0, 2, size=30) * rng.choice([1.0, 0.5], size=30)
  success = rng.integers(0, 2, size=30).astype(bool)
  view = groups_lib.groups_of(group, outcome)
  expected = _loop(group, outcome)
  np.testing.assert_array_equal(view.size, [len(v) for v in expected.values()])
  np.testing.assert_array_equal(view.tied, [max(v) == min(v) for v in expected.values()])
  means = [np.mean(v) for v in _loop(group, success).values()]
  np.testing.assert_allclose(groups_lib.group_mean(view, success), means)
  # index maps each row to its group's position in sorted id order.
  np.testing.assert_array_equal(np.array(sorted(expected))[view.index], group)


@pytest.mark.parametrize("seed", range(3))
def test_informative_groups_match_a_loop(seed):
  rng = np.random.default_rng(seed)
  group = rng.integers(0, 6, size=24)
  outcome = rng.integers(0, 2, size=24).astype(np.float32)
  success = outcome > 0
  kept = tsr.informative_groups(group, outcome, success, 0.2, 0.9)
  for g in np.unique(group):
    rows = group == g
    want = np.ptp(outcome[rows]) > 0 and 0.2 < success[rows].mean() < 0.9
    assert (kept[rows] == want).all()
