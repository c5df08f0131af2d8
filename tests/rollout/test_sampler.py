"""Sampler: top-k/top-p draws against a NumPy reference, stop-string cuts, cache roll-back."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax.models import distribution
from agentrl_jax.models import transformer as tfm
from agentrl_jax.rollout import sampler as sampler_lib

NUM_KEYS = 4000


def _nucleus_reference(logits, temperature, top_k, top_p):
  """The allowed token set, in float64: tempered softmax, top-k, renormalise, smallest top set ≥ p."""
  z = np.asarray(logits, np.float64) / temperature
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  if top_k:
    probs[order[top_k:]] = 0.0
    probs /= probs.sum()
  kept, mass = set(), 0.0
  for token in order:
    if mass >= top_p:
      break
    kept.add(int(token))
    mass += probs[token]
  return kept


def _draws(logits, **config):
  config = sampler_lib.SamplingConfig(**config)
  logp = distribution.policy_log_probs(jnp.asarray(logits)[None], None, config.temperature)
  keys = jax.random.split(jax.random.key(0), NUM_KEYS)
  draw = jax.jit(lambda k: sampler_lib._draw(k, jnp.broadcast_to(logp, (NUM_KEYS, logp.shape[1])), config))
  return np.asarray(draw(keys))


def test_top_p_hand_checked_set():
  # Probabilities 0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05 (shuffled over the vocabulary): the mass
  # before each token in descending order is 0, 0.3, 0.5, 0.65, ... so top_p = 0.6 keeps the
  # three tokens with mass before < 0.6, i.e. probabilities 0.3, 0.2 and 0.15 (0.65 ≥ 0.6).
  probs = np.array([0.1, 0.3, 0.05, 0.15, 0.12, 0.2, 0.08])
  drawn = set(np.unique(_draws(np.log(probs), top_p=0.6)))
  assert drawn == {1, 5, 3}


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 0.35), (0.7, 0, 0.8), (2.0, 6, 0.5),
                                                      (1.3, 3, 0.9)])
def test_top_p_draws_stay_in_the_reference_nucleus(temperature, top_k, top_p):
  logits = np.random.default_rng(1).normal(0.0, 2.0, 24).astype(np.float32)
  kept = _nucleus_reference(logits, temperature, top_k, top_p)
  drawn = set(np.unique(_draws(logits, temperature=temperature, top_k=top_k, top_p=top_p)))
  assert drawn <= kept
  # Nothing in the nucleus is cut: with 4000 draws every kept token (all have p > 1/4000 here)
  # shows up.
  assert drawn == kept, (sorted(kept), sorted(drawn))


def test_top_p_one_draws_what_plain_categorical_draws():
  # top_p = 1 must not touch the distribution: in float32 the cumulative mass can reach 1 before
  # the tail, and a filter would then drop tail tokens. Very peaked logits make the tail tiny.
  logits = np.concatenate([[30.0], np.random.default_rng(2).normal(0, 1, 63)]).astype(np.float32)
  logp = distribution.policy_log_probs(jnp.asarray(logits)[None], None, 1.0)
  keys = jax.random.split(jax.random.key(0), NUM_KEYS)
  plain = jax.vmap(jax.random.categorical)(keys, jnp.broadcast_to(logp, (NUM_KEYS, 64)))
  np.testing.assert_array_equal(_draws(logits, top_p=1.0), plain)
  np.testing.assert_array_equal(_draws(logits), plain)


def test_bad_sampling_config_is_named():
  with pytest.raises(ValueError, match="top_p"):
    sampler_lib.SamplingConfig(top_p=0.0)
  with pytest.raises(ValueError, match="top_p"):
    sampler_lib.SamplingConfig(top_p=1.5)
  with pytest.raises(ValueError, match="stop_strings"):
    sampler_lib.SamplingConfig(stop_strings="</a>")
  with pytest.raises(ValueError, match="stop_strings"):
    sampler_lib.SamplingConfig(stop_strings=("",))
  assert sampler_lib.SamplingConfig(stop_strings=["x"]).stop_strings == ("x",)


def test_stop_string_cut_keeps_through_the_completing_token(tok):
  ids = tok.encode("go left then right")
  pieces = [tok.decode(ids[:n]) for n in range(1, len(ids) + 1)]
  # "t th" spans the tokens of "left" and "then": it is complete at the first prefix that holds it.
  first = next(n for n, text in enumerate(pieces, 1) if "t th" in text)
  assert "t th" not in tok.decode(ids[:first - 1])
  assert sampler_lib.stop_string_cut(ids, ("t th",), tok.decode) == first
  # The earliest of several stop strings wins; an absent one keeps everything.
  assert sampler_lib.stop_string_cut(ids, ("right", "t th"), tok.decode) == first
  assert sampler_lib.stop_string_cut(ids, ("nowhere",), tok.decode) == len(ids)
  assert sampler_lib.stop_string_cut(ids, (), tok.decode) == len(ids)


def test_rolled_back_cache_continues_like_a_full_pass_over_the_kept_tokens():
  """Sample 5 action tokens, keep 2 (row 0) and 5 (row 1), prefill the next observation: its
  logits equal a full forward pass over [obs_0, kept action, obs_1]."""
  cfg = tfm.tiny(40, d_model=32, num_heads=4, mlp_dim=64, position="turn_slot", alibi=True,
                 max_turns=8, max_slots=32)
  graphdef, params = tfm.create(cfg, seed=0)
  sample = sampler_lib.make_turn_sampler(graphdef, sampler_lib.SamplingConfig(max_action_tokens=5), 40)
  rng = np.random.default_rng(0)
  obs0, obs1 = rng.integers(0, 40, (2, 6)).astype(np.int32), rng.integers(0, 40, (2, 4)).astype(np.int32)
  cache = tfm.init_cache(cfg, 2, 32)
  out = sample(params, cache, obs0, np.full(2, 6, np.int32), np.ones(2, bool), np.int32(0),
               jax.random.key(0))
  keep = np.array([2, 5])
  cache = sampler_lib.rolled_back(out.cache, np.asarray(out.num_tokens) - keep)
  np.testing.assert_array_equal(cache.length, 6 + keep)
  pos = tfm.Positions(position=np.asarray(cache.length)[:, None] + np.arange(4, dtype=np.int32),
                      turn=np.ones((2, 4), np.int32), slot=np.broadcast_to(np.arange(4, dtype=np.int32), (2, 4)))
  cached, _ = tfm.apply(graphdef, params, obs1, pos, cache)
  actions = np.asarray(out.tokens)
  for b in range(2):
    tokens = np.concatenate([obs0[b], actions[b, :keep[b]], obs1[b]])[None]
    turns = np.asarray([[0] * (6 + keep[b]) + [1] * 4], np.int32)
    full, _ = tfm.apply(graphdef, params, tokens, tfm.positions_from_turns(turns))
    np.testing.assert_allclose(cached[b], full[0, -4:], atol=1e-4, rtol=1e-4)


def test_first_argmax_is_numpy_argmax_including_ties():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 4, size=(64, 9)).astype(np.float32)  # many tied maxima
  x[3] = -1e30  # a row that is all equal
  np.testing.assert_array_equal(sampler_lib.first_argmax(jnp.asarray(x)), np.argmax(x, axis=-1))
