"""Host-side views of a batch's sampling groups: the episodes drawn from one task.

A group-relative baseline (GRPO, RLOO, Dr.GRPO) gives every episode of a group whose returns are
all equal zero advantage. Both the learner's `train/tied_groups` metric and TSR's instance filter
ask which groups those are; they share this one vectorised answer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Groups(NamedTuple):
  index: np.ndarray  # [B] int: the row's group, 0..G-1 in sorted order of group id
  size: np.ndarray   # [G] int: rows per group
  tied: np.ndarray   # [G] bool: every row of the group has the same outcome


def groups_of(group_id: np.ndarray, outcome: np.ndarray) -> Groups:
  """The groups of `group_id` [B] and whether each one's `outcome` [B] values are all equal."""
  _, index, size = np.unique(np.asarray(group_id), return_inverse=True, return_counts=True)
  index = index.reshape(-1)
  outcome = np.asarray(outcome, np.float64).reshape(-1)
  low = np.full(len(size), np.inf)
  high = np.full(len(size), -np.inf)
  np.minimum.at(low, index, outcome)
  np.maximum.at(high, index, outcome)
  return Groups(index=index, size=size, tied=low == high)


def group_mean(groups: Groups, values: np.ndarray) -> np.ndarray:
  """[G] the mean of `values` [B] over each group's rows."""
  return np.bincount(groups.index, np.asarray(values, np.float64).reshape(-1),
                     minlength=len(groups.size)) / groups.size
