"""T²PO thinking intervention in the sampler and the rollout loop (docs/methods.md#t2po)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax.envs import registry
from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

WORDS = ("left", "down", "right", "up")


def _thinking(tok, **kw):
  # bos/eos: reserved ids the tokenizer never produces from text.
  return sampler_lib.ThinkingConfig(open_token_id=tok.bos_id, close_token_id=tok.eos_id, **kw)


def _collect(tok, model, sampling, n=4, key=0):
  cfg, graphdef, params = model
  rollout = loop_lib.RolloutConfig(max_turns=4, max_len=160, obs_buckets=(48,), sampling=sampling)
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  envs = [registry.make("frozenlake") for _ in range(n)]
  traj, _ = runner.collect(envs, list(range(n)), list(range(n)), params=params,
                           rng=jax.random.key(key))
  traj.validate()
  return traj


def _replayed_log_probs(model, traj, sampling):
  """The learner's full-sequence log-probs of the action tokens, scattered back to [B, L]."""
  _, graphdef, params = model
  allowed = distribution.vocabulary_mask(model[0].vocab_size, sampling.allowed_token_ids)
  view = distribution.action_view(jnp.asarray(traj.action_mask), traj.max_len)
  logp, _ = distribution.action_log_probs(graphdef, params, jnp.asarray(traj.tokens),
                                      tfm.positions_from_turns(jnp.asarray(traj.turn_of_token)),
                                      view, allowed, 1.0)
  out = np.zeros(traj.tokens.shape, np.float32)
  out[np.arange(out.shape[0])[:, None], np.asarray(view.index)] = np.where(view.valid, logp, 0.0)
  return out


def _walk_blocks(traj, thinking):
  """Per turn, replays the thinking blocks on the host.

  Returns (closes, forced_per_turn): closes = [(thinking tokens before the close, forced?)];
  asserts forced tokens are close tokens inside a block and no block outgrows the budget.
  """
  closes, forced_per_turn = [], np.zeros(traj.turn_mask.shape)
  for b, k in zip(*np.nonzero(traj.turn_mask)):
    span = slice(traj.turn_start[b, k], traj.turn_end[b, k])
    ids, forced = traj.tokens[b, span], ~traj.action_mask[b, span]
    forced_per_turn[b, k] = forced.sum()
    inside, j = thinking.start_thinking, 0
    for t, f in zip(ids, forced):
      if inside and t == thinking.close_token_id:
        closes.append((j, bool(f)))
        inside = False
        continue
      assert not f, (b, k, "a forced token that is not a close inside a block")
      if inside:
        j += 1
        assert j <= thinking.budget, (b, k, j)
      elif t == thinking.open_token_id:
        inside, j = True, 0
  return closes, forced_per_turn


def _numpy_scores(entropy, confidence, alpha, window):
  """M_j for j = 1..n of one block, straight from the definition."""
  return np.array([alpha * entropy[max(0, j - window):j].mean()
                   + (1 - alpha) * (1 - confidence[max(0, j - window):j].mean())
                   for j in range(1, len(entropy) + 1)])


def test_token_uncertainty_matches_numpy():
  logits = np.random.default_rng(0).normal(size=(3, 7)).astype(np.float32) * 3
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1), np.float64)
  got = sampler_lib.token_uncertainty(jnp.asarray(logp, jnp.float32), top_k=3, support=7)
  p = np.sort(np.exp(logp), axis=-1)[:, ::-1][:, :3]
  np.testing.assert_allclose(got.entropy, -(p * np.log(p)).sum(-1) / np.log(7), atol=1e-5)
  np.testing.assert_allclose(got.confidence, p[:, 0], atol=1e-5)
  # Uniform over 4 allowed tokens of 7, top-4: H = log 4 / log 4 = 1, C = 1/4.
  uniform = jnp.where(jnp.arange(7) < 4, jnp.log(0.25), -1e30)[None]
  got = sampler_lib.token_uncertainty(uniform, top_k=4, support=4)
  np.testing.assert_allclose([got.entropy[0], got.confidence[0]], [1.0, 0.25], atol=1e-6)


def test_think_state_by_hand():
  # w = 2, α = .5, H = .2, .6, 1.0, C = .9, .5, .1: M_1 = .5*.2 + .5*.1 = .15,
  # M_2 = .5*.4 + .5*.3 = .35, M_3 = .5*.8 + .5*.7 = .75; at j = 3, |M_3 − M_1| = .6.
  def run(epsilon):
    cfg = sampler_lib.ThinkingConfig(open_token_id=1, close_token_id=2, min_tokens=3, budget=9,
                                     window=2, alpha=0.5, epsilon=epsilon)
    state = sampler_lib.initial_think_state(jnp.array([True]), cfg.window)
    for h, c in [(.2, .9), (.6, .5), (1.0, .1)]:
      assert not sampler_lib.stalled(state, cfg)[0]
      u = sampler_lib.TokenUncertainty(jnp.array([h]), jnp.array([c]))
      state = sampler_lib.advance_thinking(state, jnp.array([7]), u, jnp.array([True]), cfg)
    return state, cfg
  state, cfg = run(0.61)
  assert int(state.count[0]) == 3 and bool(sampler_lib.stalled(state, cfg)[0])
  np.testing.assert_allclose(state.score[0, 3 % 3], 0.75, atol=1e-6)
  state, cfg = run(0.59)
  assert not sampler_lib.stalled(state, cfg)[0]


@pytest.mark.parametrize("jit", [False, True])
def test_think_state_matches_numpy_reference(jit):
  cfg = sampler_lib.ThinkingConfig(open_token_id=1, close_token_id=2, min_tokens=5, budget=7,
                                   window=2, alpha=0.3, epsilon=0.1)
  rng = np.random.default_rng(1)
  steps = 24
  # Row 0 thinks from the start; row 1 opens at step 2; row 2 opens, closes and opens again;
  # row 3 stops emitting (finished) halfway.
  tokens = rng.integers(5, 9, size=(4, steps))
  tokens[1, 2] = 1
  tokens[2, [1, 6, 8]] = [1, 2, 1]
  emit = np.ones((4, steps), bool)
  emit[3, 12:] = False
  entropy = rng.uniform(size=(4, steps)).astype(np.float32)
  confidence = rng.uniform(size=(4, steps)).astype(np.float32)

  def step(state, token, h, c, e):
    forced = e & sampler_lib.stalled(state, cfg)
    token = jnp.where(forced, cfg.close_token_id, token)
    u = sampler_lib.TokenUncertainty(h, c)
    return sampler_lib.advance_thinking(state, token, u, e, cfg), forced
  step = jax.jit(step) if jit else step

  state = sampler_lib.initial_think_state(jnp.array([True, False, False, True]), cfg.window)
  got_forced, got_count = [], []
  for s in range(steps):
    state, forced = step(state, jnp.asarray(tokens[:, s]), jnp.asarray(entropy[:, s]),
                         jnp.asarray(confidence[:, s]), jnp.asarray(emit[:, s]))
    got_forced.append(np.asarray(forced))
    got_count.append(np.asarray(state.count))
  got_forced, got_count = np.stack(got_forced, 1), np.stack(got_count, 1)

  for b in range(4):
    inside, hs, cs = b in (0, 3), [], []
    for s in range(steps):
      if not emit[b, s]:
        assert not got_forced[b, s]
        continue
      j = len(hs)
      m = _numpy_scores(np.array(hs), np.array(cs), cfg.alpha, cfg.window)
      stall = (inside and j >= cfg.min_tokens and j > cfg.window
               and abs(m[j - 1] - m[j - 1 - cfg.window]) < cfg.epsilon)
      want_forced = inside and (j >= cfg.budget or stall)
      assert got_forced[b, s] == want_forced, (b, s, j)
      token = cfg.close_token_id if want_forced else tokens[b, s]
      if inside and token == cfg.close_token_id:
        inside = False
      elif inside:
        hs.append(entropy[b, s])
        cs.append(confidence[b, s])
      elif token == cfg.open_token_id:
        inside, hs, cs = True, [], []
      assert got_count[b, s] == len(hs), (b, s)
  assert got_forced.any()


def test_outside_thinking_by_hand():
  cfg = sampler_lib.ThinkingConfig(open_token_id=1, close_token_id=2)
  # 9 [1 4 4 2] 5 [1 6 ...unclosed]  ->  9 5
  assert sampler_lib.outside_thinking([9, 1, 4, 4, 2, 5, 1, 6], cfg) == [9, 5]
  starts = dataclasses.replace(cfg, start_thinking=True)
  assert sampler_lib.outside_thinking([4, 4, 2, 7], starts) == [7]
  assert sampler_lib.outside_thinking([4, 2, 7], None) == [4, 2, 7]


def test_stalled_thinking_closes_exactly_at_min_tokens_and_keeps_tito(tok, model):
  # ε = 2 exceeds any |ΔM| (M is in [0, 1]), so the stall test fires as soon as it may:
  # at j = max(min_tokens, window + 1) = 3, never before.
  thinking = _thinking(tok, min_tokens=3, budget=5, window=1, epsilon=2.0, start_thinking=True)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=8, stop_token_ids=(tok.end_id,),
                                        thinking=thinking)
  traj = _collect(tok, model, sampling)
  closes, forced_per_turn = _walk_blocks(traj, thinking)
  forced_at = [j for j, forced in closes if forced]
  assert forced_at and set(forced_at) == {3}
  np.testing.assert_array_equal(traj.extras[extra_keys.THINK_FORCED_KEY], forced_per_turn)
  forced = _in_action_span(traj) & ~traj.action_mask
  assert forced.sum() == len(forced_at) and (traj.tokens[forced] == tok.eos_id).all()
  assert (traj.sample_logprob[forced] == 0).all()
  replay = _replayed_log_probs(model, traj, sampling)
  np.testing.assert_allclose(replay[traj.action_mask], traj.sample_logprob[traj.action_mask],
                             atol=1e-4)


def _in_action_span(traj):
  cols = np.arange(traj.max_len)[None, :, None]
  spans = ((cols >= traj.turn_start[:, None]) & (cols < traj.turn_end[:, None])
           & traj.turn_mask[:, None])
  return spans.any(axis=2)


def test_opened_thinking_always_closes_by_the_budget(tok, model):
  # ε = 0 never stalls (|ΔM| < 0 is impossible), so every forced close sits at j = budget. A
  # small action vocabulary makes the policy open blocks often.
  ids = (tok.bos_id, tok.eos_id, tok.end_id) + tuple(tok.single_token_id(w) for w in WORDS)
  thinking = _thinking(tok, min_tokens=1, budget=3, window=2, epsilon=0.0)
  sampling = sampler_lib.SamplingConfig(max_action_tokens=10, stop_token_ids=(tok.end_id,),
                                        allowed_token_ids=ids, thinking=thinking)
  traj = _collect(tok, model, sampling, n=6, key=2)
  closes, forced_per_turn = _walk_blocks(traj, thinking)
  forced_at = [j for j, forced in closes if forced]
  assert forced_at and set(forced_at) == {3}
  assert forced_per_turn.sum() == len(forced_at)
  replay = _replayed_log_probs(model, traj, sampling)
  np.testing.assert_allclose(replay[traj.action_mask], traj.sample_logprob[traj.action_mask],
                             atol=1e-4)


def test_thinking_that_never_opens_samples_as_without_it(tok, model):
  # The open token is outside the action vocabulary, so no block ever starts: the draws (and so
  # the trajectories) must be bit-identical to sampling with thinking off.
  ids = (tok.eos_id, tok.end_id) + tuple(tok.single_token_id(w) for w in WORDS)
  plain = sampler_lib.SamplingConfig(max_action_tokens=3, stop_token_ids=(tok.end_id,),
                                     allowed_token_ids=ids)
  off = _collect(tok, model, plain, key=4)
  on = _collect(tok, model, dataclasses.replace(plain, thinking=_thinking(tok)), key=4)
  for name in ("tokens", "action_mask", "sample_logprob", "turn_start", "turn_end", "reward"):
    np.testing.assert_array_equal(getattr(on, name), getattr(off, name), err_msg=name)
  assert extra_keys.THINK_FORCED_KEY not in off.extras
  assert not on.extras[extra_keys.THINK_FORCED_KEY].any()


def test_bad_thinking_config_is_rejected(tok, model):
  with pytest.raises(ValueError, match="must differ"):
    sampler_lib.ThinkingConfig(open_token_id=3, close_token_id=3)
  with pytest.raises(ValueError, match="budget"):
    sampler_lib.ThinkingConfig(open_token_id=2, close_token_id=3, min_tokens=10, budget=5)
  with pytest.raises(ValueError, match="alpha"):
    sampler_lib.ThinkingConfig(open_token_id=2, close_token_id=3, alpha=1.5)
  with pytest.raises(ValueError, match="window"):
    sampler_lib.ThinkingConfig(open_token_id=2, close_token_id=3, window=0)
  with pytest.raises(ValueError, match="stop tokens"):
    sampler_lib.SamplingConfig(stop_token_ids=(3,), thinking=sampler_lib.ThinkingConfig(
        open_token_id=2, close_token_id=3))
  with pytest.raises(ValueError, match="max_action_tokens >= 2, got 1"):
    sampler_lib.SamplingConfig(max_action_tokens=1, thinking=sampler_lib.ThinkingConfig(
        open_token_id=2, close_token_id=3, start_thinking=True))
  far = sampler_lib.SamplingConfig(thinking=sampler_lib.ThinkingConfig(
      open_token_id=2, close_token_id=10**6))
  cfg, graphdef, _ = model
  with pytest.raises(ValueError, match="close_token_id=1000000 is outside the vocabulary"):
    loop_lib.RolloutRunner(graphdef, cfg, tok, loop_lib.RolloutConfig(sampling=far))


def test_scripted_demonstrations_close_an_opened_thought(tok, model):
  # With start_thinking the env would be shown nothing of a demo left inside the block.
  cfg, graphdef, _ = model
  sampling = sampler_lib.SamplingConfig(max_action_tokens=4, stop_token_ids=(tok.end_id,),
                                        thinking=_thinking(tok, start_thinking=True))
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, loop_lib.RolloutConfig(
      max_turns=4, max_len=160, obs_buckets=(48,), sampling=sampling))
  envs = [registry.make("frozenlake") for _ in range(2)]
  traj, _ = runner.collect(envs, [0, 1], [0, 1], actor=loop_lib.noisy_expert(0.0),
                           actor_rng=np.random.default_rng(0))
  assert traj.action_valid[traj.turn_mask].all()
  assert (traj.tokens[np.arange(2), traj.turn_start[:, 0]] == tok.eos_id).all()
