"""Injected env faults over 200 episodes: every one is isolated, counted, and gets no credit."""

import time

import jax
import numpy as np

from agentrl_jax.advantages import estimators
from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib
from agentrl_jax.rollout import workers

EPISODES = 200
HANG_S = 1.0


class _FaultyFrozenLake:
  """FrozenLake whose steps raise with prob. 10% and hang past the timeout with prob. 2%.

  The fault schedule is drawn from the episode seed, so the test knows exactly which episodes
  fault, and how, before they run.
  """

  action_words = ("left", "down", "right", "up")
  max_turns = 10

  def __init__(self, log):
    self._inner = registry.make("frozenlake")
    self._log = log

  def reset(self, seed):
    self._seed = seed
    self._rng = np.random.default_rng(seed)
    return self._inner.reset(seed)

  def step(self, action):
    draw = self._rng.random()
    if draw < 0.10:
      self._log.append((self._seed, "exception"))
      raise RuntimeError("injected env crash")
    if draw < 0.12:
      self._log.append((self._seed, "timeout"))
      time.sleep(HANG_S)
    return self._inner.step(action)


def test_injected_faults_are_counted_isolated_and_get_no_advantage():
  tok = tokenizer_lib.load_tokenizer()
  cfg = transformer.tiny(tok.vocab_size, d_model=16, num_heads=2, mlp_dim=32,
                         position="turn_slot", alibi=True, max_turns=16, max_slots=64)
  graphdef, params = transformer.create(cfg, seed=0)
  ids = tuple(tok.single_token_id(w) for w in _FaultyFrozenLake.action_words)
  rollout = loop_lib.RolloutConfig(
      max_turns=10, max_len=288, obs_buckets=(48,),
      sampling=sampler_lib.SamplingConfig(max_action_tokens=1, allowed_token_ids=ids),
      workers=workers.WorkerConfig(num_threads=EPISODES, step_timeout_s=0.5))
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, rollout)
  log = []
  envs = [_FaultyFrozenLake(log) for _ in range(EPISODES)]
  groups = [i // 4 for i in range(EPISODES)]
  traj, stats = runner.collect(envs, list(range(EPISODES)), groups, params=params,
                               rng=jax.random.key(0))

  faulted = {seed for seed, _ in log}
  assert stats.env_errors == len(log) == len(faulted)  # a fault ends its episode at once
  assert stats.env_timeouts == sum(kind == "timeout" for _, kind in log)
  assert stats.env_timeouts > 0 and stats.env_errors > stats.env_timeouts
  valid = np.asarray(traj.valid_trajectory)
  np.testing.assert_array_equal(~valid, np.isin(np.arange(EPISODES), sorted(faulted)))

  # Distinct outcomes per row, so every valid trajectory would get credit if it were scored.
  scored = jax.tree.map(np.asarray, traj).replace(outcome=np.arange(EPISODES, dtype=np.float32))
  out = estimators.get_estimator("grpo")(scored, num_groups=EPISODES)
  advantages = np.asarray(out.advantages)
  assert not advantages[~valid].any(), "a faulted episode carries credit"
  assert advantages[valid].any()
