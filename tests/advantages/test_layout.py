"""Tests for agentrl_jax.advantages.layout (step rows <-> concatenated trajectories)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import estimators
from agentrl_jax.advantages import layout

FLATTEN = jax.jit(layout.flatten_to_steps, static_argnames=("history_turns", "row_length"))
UNFLATTEN = jax.jit(layout.steps_to_flatten, static_argnames=("max_turns", "max_len"))


def build(turns, length, max_turns, seed=0):
  """Concatenated Trajectories from per-episode lists of (observation_len, action_len) turns.

  Tokens are distinct positive ids, log-probs random negatives, so any misplaced copy shows.
  """
  rng = np.random.RandomState(seed)
  b = len(turns)
  traj = types.empty_trajectories(b, length, max_turns)
  for i, row in enumerate(turns):
    pos = 0
    for k, (obs_len, act_len) in enumerate(row):
      traj.turn_of_token[i, pos:pos + obs_len + act_len] = k
      traj.tokens[i, pos:pos + obs_len + act_len] = 1000 * (i + 1) + np.arange(
          pos, pos + obs_len + act_len)
      pos += obs_len
      traj.action_mask[i, pos:pos + act_len] = True
      traj.sample_logprob[i, pos:pos + act_len] = -rng.rand(act_len) - 0.1
      traj.turn_start[i, k], traj.turn_end[i, k] = pos, pos + act_len
      traj.turn_mask[i, k] = True
      pos += act_len
    if row:
      traj.done[i, len(row) - 1] = True
  traj.reward[:] = np.where(traj.turn_mask, rng.randn(b, max_turns), 0).astype(np.float32)
  traj.obs_hash[:] = np.where(traj.turn_mask, rng.randint(1, 4, (b, max_turns)), 0)
  traj.action_valid[:] = traj.turn_mask & (rng.rand(b, max_turns) > 0.2)
  traj.outcome[:] = traj.reward.sum(1)
  traj.success[:] = traj.outcome > 0
  traj.group_id[:] = np.arange(b) // 2
  traj = traj.replace(
      sub_outcomes={"format": rng.rand(b).astype(np.float32)},
      extras={extra_keys.INITIAL_OBS_HASH_KEY: rng.randint(0, 2, b).astype(np.int32),
              "prefix_embedding": rng.randn(b, max_turns, 3).astype(np.float32)})
  traj.validate()
  return traj


def random_turns(rng, b, max_turns):
  return [[(int(rng.randint(1, 4)), int(rng.randint(1, 4)))
           for _ in range(rng.randint(1, max_turns + 1))] for _ in range(b)]


def assert_trees_equal(got, want):
  got_leaves, got_def = jax.tree.flatten(got)
  want_leaves, want_def = jax.tree.flatten(want)
  assert got_def == want_def
  for g, w, path in zip(got_leaves, want_leaves, jax.tree_util.tree_flatten_with_path(want)[0]):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=str(path[0]))
    assert np.asarray(g).dtype == np.asarray(w).dtype, path[0]


def test_hand_checked_rows():
  # One episode, 3 turns: (obs, act) lengths (2, 1), (1, 2), (2, 1); L = 10, tokens 1000 + pos.
  #   positions: turn 0 = [0, 3) action [2, 3); turn 1 = [3, 6) action [4, 6);
  #              turn 2 = [6, 9) action [8, 9); position 9 is padding.
  # history_turns = 1, row_length = 6:
  #   row 0: window [0, 3)                -> tokens 1000..1002, context 0, action at 2
  #   row 1: window [0, 6) (turns 0-1)    -> tokens 1000..1005, context 3, action at 4, 5
  #   row 2: window [3, 9) (turns 1-2)    -> tokens 1003..1008, context 3, action at 5
  traj = build([[(2, 1), (1, 2), (2, 1)]], length=10, max_turns=3)
  rows = FLATTEN(traj, history_turns=1, row_length=6)
  rows.validate()
  want_tokens = [[1000, 1001, 1002, 0, 0, 0],
                 [1000, 1001, 1002, 1003, 1004, 1005],
                 [1003, 1004, 1005, 1006, 1007, 1008]]
  np.testing.assert_array_equal(rows.tokens, want_tokens)
  np.testing.assert_array_equal(rows.action_mask, [[0, 0, 1, 0, 0, 0],
                                                   [0, 0, 0, 0, 1, 1],
                                                   [0, 0, 0, 0, 0, 1]])
  np.testing.assert_array_equal(rows.turn_of_token, [[0, 0, 0, -1, -1, -1], [0] * 6, [0] * 6])
  np.testing.assert_array_equal(rows.extras[layout.STEP_CONTEXT_LENGTH], [0, 3, 3])
  np.testing.assert_array_equal(rows.extras[layout.STEP_WINDOW_START], [0, 0, 3])
  np.testing.assert_array_equal(rows.turn_start[:, 0], [2, 4, 5])
  np.testing.assert_array_equal(rows.turn_end[:, 0], [3, 6, 6])
  # Only the row's own action carries log-probs: row 1 holds turn 0's action as context.
  np.testing.assert_array_equal(rows.sample_logprob[1, :4], 0.0)
  np.testing.assert_array_equal(rows.sample_logprob[1, 4:], traj.sample_logprob[0, 4:6])
  np.testing.assert_array_equal(rows.extras[layout.STEP_TRUNCATED], [False, False, False])
  np.testing.assert_array_equal(rows.reward[:, 0], traj.reward[0])
  np.testing.assert_array_equal(rows.outcome, [traj.outcome[0]] * 3)
  assert layout.required_row_length(traj, 1) == 6


@pytest.mark.parametrize("history_turns,jit", [(0, True), (1, True), (1, False), (2, True),
                                               (50, True)])
def test_round_trip_is_exact(history_turns, jit):
  rng = np.random.RandomState(history_turns)
  max_turns, length = 4, 28
  traj = build(random_turns(rng, 6, max_turns), length, max_turns, seed=history_turns)
  width = layout.required_row_length(traj, history_turns)
  if jit:
    rows = FLATTEN(traj, history_turns=history_turns, row_length=width)
    back = UNFLATTEN(rows, max_turns=max_turns, max_len=length)
  else:
    rows = layout.flatten_to_steps(traj, history_turns, width)
    back = layout.steps_to_flatten(rows, max_turns=max_turns, max_len=length)
  rows.validate()
  assert rows.tokens.shape == (6 * max_turns, width)
  assert_trees_equal(back, jax.tree.map(jnp.asarray, traj))


def test_history_zero_rows_hold_only_their_turn_and_large_history_the_whole_prefix():
  rng = np.random.RandomState(7)
  max_turns, length = 5, 40
  traj = build(random_turns(rng, 4, max_turns), length, max_turns, seed=7)
  own = FLATTEN(traj, history_turns=0, row_length=layout.required_row_length(traj, 0))
  full = FLATTEN(traj, history_turns=100, row_length=length)
  np.testing.assert_array_equal(own.extras[layout.STEP_CONTEXT_LENGTH], 0)
  for r in range(4 * max_turns):
    b, k = divmod(r, max_turns)
    if not traj.turn_mask[b, k]:
      assert np.all(own.turn_of_token[r] == -1) and np.all(full.turn_of_token[r] == -1)
      continue
    turn_tokens = traj.tokens[b][traj.turn_of_token[b] == k]
    n_own = len(turn_tokens)
    np.testing.assert_array_equal(own.tokens[r, :n_own], turn_tokens)
    assert np.all(own.turn_of_token[r, n_own:] == -1)
    prefix = traj.tokens[b][(traj.turn_of_token[b] >= 0) & (traj.turn_of_token[b] <= k)]
    np.testing.assert_array_equal(full.tokens[r, :len(prefix)], prefix)
    assert full.extras[layout.STEP_CONTEXT_LENGTH][r] == len(prefix) - n_own


def test_truncated_history_keeps_actions_exact_and_is_reported():
  rng = np.random.RandomState(3)
  max_turns, length = 4, 28
  traj = build(random_turns(rng, 6, max_turns), length, max_turns, seed=3)
  width = 4  # every action (≤ 3 tokens) fits; most histories do not
  rows = FLATTEN(traj, history_turns=3, row_length=width)
  back = UNFLATTEN(rows, max_turns=max_turns, max_len=length)
  np.testing.assert_array_equal(back.action_mask, traj.action_mask)
  np.testing.assert_array_equal(back.sample_logprob, traj.sample_logprob)
  np.testing.assert_array_equal(np.where(traj.action_mask, back.tokens, 0),
                                np.where(traj.action_mask, traj.tokens, 0))
  for name in ("turn_start", "turn_end", "reward", "turn_mask"):
    np.testing.assert_array_equal(getattr(back, name), getattr(traj, name))
  window = (np.asarray(layout.required_row_length(traj, 3)))
  assert window > width and np.any(rows.extras[layout.STEP_TRUNCATED])
  # A row is truncated exactly when its full window (NumPy) is longer than the row.
  for r in range(6 * max_turns):
    b, k = divmod(r, max_turns)
    if traj.turn_mask[b, k]:
      tot = traj.turn_of_token[b]
      full = np.sum((tot >= max(0, k - 3)) & (tot <= k))
      assert rows.extras[layout.STEP_TRUNCATED][r] == (full > width)


def test_bad_inputs_raise():
  traj = build([[(2, 3), (1, 1)]], length=8, max_turns=2)
  with pytest.raises(ValueError, match=r"trajectory 0 turn 0 has an action of 3 tokens"):
    layout.flatten_to_steps(traj, 1, 2)
  with pytest.raises(ValueError, match="history_turns must be an int >= 0, got -1"):
    layout.flatten_to_steps(traj, -1, 8)
  with pytest.raises(ValueError, match="row_length must be an int >= 1, got 0"):
    layout.flatten_to_steps(traj, 1, 0)
  rows = FLATTEN(traj, history_turns=1, row_length=8)
  with pytest.raises(ValueError, match="not a whole number of episodes"):
    layout.steps_to_flatten(rows, max_turns=3, max_len=8)
  with pytest.raises(ValueError, match="lacks"):
    layout.steps_to_flatten(traj, max_turns=2, max_len=8)
  holes = traj.turn_of_token.copy()
  holes[0, 2] = -1  # padding inside turn 0
  with pytest.raises(ValueError, match="token 3 belongs to turn 0 after a token of padding"):
    layout.flatten_to_steps(traj.replace(turn_of_token=holes), 1, 8)
  swapped = traj.turn_of_token.copy()
  swapped[0, 6] = 0  # a turn-0 token after turn 1 started (turn 1 holds positions 5 and 6)
  with pytest.raises(ValueError, match="token 6 belongs to turn 0 after a token of turn 1"):
    layout.flatten_to_steps(traj.replace(turn_of_token=swapped), 1, 8)
  out_of_range = traj.turn_of_token.copy()
  out_of_range[0, 0] = 2
  with pytest.raises(ValueError, match=r"turn_of_token\[0\] = 2 is outside \[-1, 2\)"):
    layout.flatten_to_steps(traj.replace(turn_of_token=out_of_range), 1, 8)
  bad = traj.replace(extras={"odd": np.zeros((5,), np.float32)})
  with pytest.raises(ValueError, match=r"extras\['odd'\] has shape \[5\]"):
    layout.flatten_to_steps(bad, 1, 8)


def test_no_retrace_on_new_values():
  @functools.partial(jax.jit, static_argnames=("history_turns", "row_length"))
  @chex.assert_max_traces(n=1)
  def run(traj, history_turns, row_length):
    return layout.flatten_to_steps(traj, history_turns, row_length)

  rng = np.random.RandomState(5)
  turns = random_turns(rng, 4, 3)
  for seed in range(3):
    run(jax.tree.map(jnp.asarray, build(turns, 20, 3, seed=seed)), history_turns=1, row_length=12)


def _row_advantages_loop(flat_adv, traj, rows):
  """NumPy: the advantage each action token of each step row should get (flat token ↦ row token)."""
  width = rows.tokens.shape[1]
  out = np.zeros((rows.batch_size, width), np.float32)
  n = traj.max_turns
  for r in range(rows.batch_size):
    b, k = divmod(r, n)
    if not traj.turn_mask[b, k]:
      continue
    start = rows.extras[layout.STEP_WINDOW_START][r]
    for pos in range(traj.turn_start[b, k], traj.turn_end[b, k]):
      if traj.action_mask[b, pos]:
        out[r, pos - start] = flat_adv[b, pos]
  return out


@pytest.mark.parametrize("name", sorted(estimators.ESTIMATORS))
def test_every_estimator_gives_each_action_token_the_same_advantage_in_both_layouts(name):
  rng = np.random.RandomState(11)
  max_turns, length = 3, 24
  traj = build(random_turns(rng, 6, max_turns), length, max_turns, seed=11)
  traj.env_error[5, 0] = True  # a faulted episode: zero in both layouts
  est = estimators.get_estimator(name)
  rows = FLATTEN(traj, history_turns=1, row_length=layout.required_row_length(traj, 1))
  flat_values = rows_values = None
  if est.needs_critic:
    flat_values = rng.randn(6, length).astype(np.float32)
    # The critic sees each row's own context; a token's value is read from the row that owns it.
    rows_values = np.asarray(layout.tokens_to_step_rows(flat_values, rows))
  want = jax.jit(est)(traj, flat_values)
  got = jax.jit(functools.partial(layout.on_step_rows, est, max_turns=max_turns, max_len=length))(
      rows, rows_values)
  for field in ("advantages", "returns"):
    flat = np.asarray(getattr(want, field))
    expected = _row_advantages_loop(flat, traj, rows)
    np.testing.assert_allclose(getattr(got, field), expected, atol=1e-6, err_msg=field)
    # Every action token appears in exactly one row: the totals agree.
    np.testing.assert_allclose(np.sum(getattr(got, field)), np.sum(flat), rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(want.advantages)).sum() > 0  # the check is not vacuous


def test_on_step_rows_by_name_with_hyperparameters():
  traj = build([[(1, 2), (2, 1)], [(2, 2)]], length=10, max_turns=2)
  rows = FLATTEN(traj, history_turns=1, row_length=8)
  got = jax.jit(functools.partial(layout.on_step_rows, "gigpo", max_turns=2, max_len=10,
                                  discount=0.5))(rows)
  want = estimators.gigpo(traj, None, discount=0.5)
  np.testing.assert_allclose(got.advantages,
                             _row_advantages_loop(np.asarray(want.advantages), traj, rows),
                             atol=1e-6)
  with pytest.raises(ValueError, match="needs critic values"):
    layout.on_step_rows("gae", rows, None, max_turns=2, max_len=10)
