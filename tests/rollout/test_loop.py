"""Rollout loop + sampler: TITO, cached decode vs full forward, determinism, budgets."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers as workers_lib


def _runner(tok, model, sampling, **kw):
  cfg, graphdef, _ = model
  rollout = loop_lib.RolloutConfig(max_turns=10, max_len=160, obs_buckets=(48,), sampling=sampling, **kw)
  return loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)


def _collect(runner, params, n=6, key=0, env="frozenlake"):
  envs = [registry.make(env) for _ in range(n)]
  return runner.collect(envs, list(range(n)), list(range(n)), params=params, rng=jax.random.key(key))


def _replayed_log_probs(model, traj, allowed, max_actions):
  """The learner's full-sequence log-probs of the recorded tokens, scattered back to [B, L]."""
  _, graphdef, params = model
  tokens = jnp.asarray(traj.tokens)
  view = distribution.action_view(jnp.asarray(traj.action_mask), max_actions)
  logp, _ = distribution.action_log_probs(graphdef, params, tokens,
                                      tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)),
                                      view, allowed, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  rows = np.arange(out.shape[0])[:, None]
  out[rows, np.asarray(view.index)] = np.where(view.valid, logp, 0.0)
  return out


def test_sampled_logprobs_match_a_full_forward_pass_restricted(tok, model):
  ids = tuple(tok.single_token_id(w) for w in ("left", "down", "right", "up"))
  sampling = sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=ids)
  traj, stats = _collect(_runner(tok, model, sampling), model[2])
  traj.validate()
  allowed = distribution.vocabulary_mask(tok.vocab_size, ids)
  replay = _replayed_log_probs(model, traj, allowed, 10)
  mask = traj.action_mask
  assert mask.sum() == stats.turns
  np.testing.assert_allclose(replay[mask], traj.sample_logprob[mask], atol=1e-4)
  assert set(np.unique(traj.tokens[mask])) <= set(ids)


def test_multi_token_actions_with_stop_token_match_full_forward(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=3, stop_token_ids=(tok.end_id,))
  traj, stats = _collect(_runner(tok, model, sampling), model[2], n=4, key=3)
  traj.validate()
  spans = traj.turn_end - traj.turn_start
  assert spans.max() <= 3 and spans[traj.turn_mask].min() >= 1
  replay = _replayed_log_probs(model, traj, None, 30)
  np.testing.assert_allclose(replay[traj.action_mask], traj.sample_logprob[traj.action_mask], atol=1e-4)
  # A stop token, when sampled, is the last token of its turn's action.
  for b, k in zip(*np.nonzero(traj.turn_mask)):
    span = traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]]
    assert tok.end_id not in span[:-1]
  # Untrained policies babble: the env must have flagged malformed actions, never raised.
  assert stats.env_errors == 0 and stats.invalid_actions > 0


def test_same_key_same_rollout_other_key_differs(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=(
      tuple(tok.single_token_id(w) for w in ("left", "down", "right", "up"))))
  runner = _runner(tok, model, sampling)
  a, _ = _collect(runner, model[2], key=5)
  b, _ = _collect(runner, model[2], key=5)
  c, _ = _collect(runner, model[2], key=6)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)


def test_observations_are_tokenized_once_and_actions_kept_exactly(tok, model):
  """TITO: every turn is <|obs|> tokenize(obs) <|act|> followed by the sampled ids, verbatim."""
  sampling = sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=(
      tuple(tok.single_token_id(w) for w in ("left", "down", "right", "up"))))
  runner = _runner(tok, model, sampling)
  traj, _ = _collect(runner, model[2], n=3, key=1)
  env = registry.make("frozenlake")
  for b in range(3):
    obs = env.reset(b)
    cursor = 0
    for k in np.flatnonzero(traj.turn_mask[b]):
      expected = runner.observation_tokens(obs)
      np.testing.assert_array_equal(traj.tokens[b, cursor:cursor + len(expected)], expected)
      start, end = traj.turn_start[b, k], traj.turn_end[b, k]
      assert start == cursor + len(expected)
      action = tok.decode(traj.tokens[b, start:end])
      obs = env.step(action).observation
      cursor = end
    assert not traj.action_mask[b, cursor:].any() and (traj.turn_of_token[b, cursor:] == -1).all()


def test_scripted_expert_solves_and_budget_truncates(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=1)
  runner = _runner(tok, model, sampling)
  envs = [registry.make("frozenlake") for _ in range(4)]
  traj, stats = runner.collect(envs, [0, 1, 2, 3], [0, 1, 2, 3], actor=loop_lib.noisy_expert(0.0),
                               actor_rng=np.random.default_rng(0))
  assert traj.success.all() and stats.truncated == 0
  tight = _runner(tok, model, sampling, length_buckets=())
  tight = loop_lib.RolloutRunner(model[1], model[0], tok, dataclasses.replace(tight.config, max_len=60))
  envs = [registry.make("frozenlake") for _ in range(2)]
  traj, stats = tight.collect(envs, [0, 1], [0, 1], actor=loop_lib.noisy_expert(0.0),
                              actor_rng=np.random.default_rng(0))
  assert stats.truncated == 2 and not traj.success.any()
  assert (traj.turn_of_token >= 0).sum(axis=1).max() <= 60


class _Exploding:
  """An env whose step raises on the second turn."""

  action_words = ("left", "down", "right", "up")
  max_turns = 10

  def __init__(self):
    self._inner = registry.make("frozenlake")
    self._n = 0

  def reset(self, seed):
    self._n = 0
    return self._inner.reset(seed)

  def step(self, action):
    self._n += 1
    if self._n == 2:
      raise RuntimeError("simulated env crash")
    return self._inner.step(action)


def test_env_exception_ends_only_that_trajectory(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=(
      tuple(tok.single_token_id(w) for w in ("left", "down", "right", "up"))))
  runner = _runner(tok, model, sampling)
  envs = [_Exploding(), registry.make("frozenlake"), registry.make("frozenlake")]
  traj, stats = runner.collect(envs, [0, 1, 2], [0, 1, 2], params=model[2], rng=jax.random.key(0))
  valid = np.asarray(traj.valid_trajectory)
  if traj.turn_mask[0].sum() >= 2:  # the episode lived long enough to hit the crash
    assert stats.env_errors == 1 and not valid[0] and traj.env_error[0, 1]
  assert valid[1:].all()


def test_a_row_samples_the_same_tokens_whatever_batch_it_is_in(tok, model):
  # Rows 4..5 of a 6-row batch, played alone with their global row ids, must draw exactly the
  # tokens they drew inside the batch (what lets a batch be split over hosts).
  runner = _runner(tok, model, sampler_lib.SamplingConfig(max_action_tokens=4))
  full, _ = _collect(runner, model[2], n=6, key=3)
  envs = [registry.make("frozenlake") for _ in range(2)]
  part, _ = runner.collect(envs, [4, 5], [4, 5], params=model[2], rng=jax.random.key(3),
                           row_ids=[4, 5])
  width = min(full.tokens.shape[1], part.tokens.shape[1])
  np.testing.assert_array_equal(part.tokens[:, :width], full.tokens[4:, :width])
  np.testing.assert_allclose(part.sample_logprob[:, :width], full.sample_logprob[4:, :width], atol=1e-5)
  # Without the ids the same two rows would be rows 0..1 and draw differently.
  other, _ = runner.collect([registry.make("frozenlake") for _ in range(2)], [4, 5], [4, 5],
                            params=model[2], rng=jax.random.key(3))
  assert not np.array_equal(other.tokens[:, :width], full.tokens[4:, :width])


def _action_spans(traj):
  for b, k in zip(*np.nonzero(traj.turn_mask)):
    yield b, k, traj.tokens[b, traj.turn_start[b, k]:traj.turn_end[b, k]]


def test_stop_strings_cut_the_turn_and_tito_holds(tok, model):
  stops = ("o", "5")
  sampling = sampler_lib.SamplingConfig(max_action_tokens=6, stop_token_ids=(tok.end_id,),
                                        stop_strings=stops)
  runner = _runner(tok, model, sampling)
  traj, stats = _collect(runner, model[2], n=4, key=3)
  traj.validate()
  cut = 0
  for _, _, span in _action_spans(traj):
    text = runner.action_text(span)
    assert 1 <= len(span) <= 6
    if any(s in text for s in stops):
      # Kept through the token that completes the first stop string, nothing after it.
      assert not any(s in runner.action_text(span[:-1]) for s in stops)
      cut += len(span) < 6
    else:
      assert len(span) == 6 or span[-1] == tok.end_id
  assert cut > 0  # the babbling policy hits "o" or "5" early in some turns
  assert stats.as_metrics()["rollout/stop_string_rate"] >= cut / stats.turns
  # TITO across turns: the dropped tokens left neither the trajectory nor the KV cache (a stale
  # cache would shift every later turn's log-probs away from the full pass).
  replay = _replayed_log_probs(model, traj, None, 60)
  np.testing.assert_allclose(replay[traj.action_mask], traj.sample_logprob[traj.action_mask], atol=1e-4)


def test_trajectory_action_budget_truncates(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=3)
  runner = _runner(tok, model, sampling, max_trajectory_action_tokens=7)
  traj, stats = _collect(runner, model[2], n=4, key=2)
  spent = traj.action_mask.sum(axis=1)
  # 3 + 3 + 1: the third turn is cut to the one token left, then the trajectory ends.
  assert (spent <= 7).all()
  for b in range(4):
    last = np.flatnonzero(traj.turn_mask[b])[-1]
    assert traj.done[b, last]
    if spent[b] == 7:
      assert traj.turn_end[b, last] - traj.turn_start[b, last] == 1 and not traj.success[b]
  # Every budget cut-off spent all 7 tokens (an env may also end on the turn that spends them).
  assert stats.truncated >= stats.budget_truncated > 0 and stats.budget_truncated <= (spent == 7).sum()
  replay = _replayed_log_probs(model, traj, None, 7)
  np.testing.assert_allclose(replay[traj.action_mask], traj.sample_logprob[traj.action_mask], atol=1e-4)
  with pytest.raises(ValueError, match="max_trajectory_action_tokens"):
    loop_lib.RolloutConfig(max_trajectory_action_tokens=-1)


def test_process_workers_play_the_same_rollout_as_local_envs(tok, model):
  sampling = sampler_lib.SamplingConfig(max_action_tokens=2)
  local, _ = _collect(_runner(tok, model, sampling), model[2], n=3, key=7)
  runner = _runner(tok, model, sampling, workers=workers_lib.WorkerConfig(
      kind="process", num_processes=2, step_timeout_s=20))
  try:
    envs = [runner.make_env("frozenlake") for _ in range(3)]
    remote, stats = runner.collect(envs, [0, 1, 2], [0, 1, 2], params=model[2], rng=jax.random.key(7))
  finally:
    runner.close()
  assert stats.env_errors == 0
  for name in ("tokens", "sample_logprob", "reward", "done", "obs_hash", "action_valid"):
    np.testing.assert_array_equal(getattr(remote, name), getattr(local, name), err_msg=name)


def test_cache_windows_sample_what_the_whole_cache_samples(tok, model):
  # Conversations grow past 64 and 128 tokens, so turns run in both windows and then in the
  # whole cache (capacity 160 + 48 + 2); keys beyond a row's length are masked either way.
  sampling = sampler_lib.SamplingConfig(max_action_tokens=2)
  whole, _ = _collect(_runner(tok, model, sampling), model[2], n=3, key=9)
  windowed, _ = _collect(_runner(tok, model, sampling, cache_windows=(64, 128)), model[2], n=3, key=9)
  assert (whole.turn_of_token >= 0).sum(axis=1).max() > 128
  np.testing.assert_array_equal(windowed.tokens, whole.tokens)
  np.testing.assert_allclose(windowed.sample_logprob, whole.sample_logprob, atol=1e-6)
  with pytest.raises(ValueError, match="cache_windows"):
    loop_lib.RolloutConfig(cache_windows=(128, 64))
