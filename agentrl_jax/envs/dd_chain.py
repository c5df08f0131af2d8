"""DD-Chain: a text chain whose decision density ρ = m/T is exact (docs/methods.md#dd-chain).

Every episode lasts exactly T turns and every turn asks for a binary action "0" or "1". Only the
m decision turns D = round(linspace(0, T-1, m)) enter the return

    R = beta * sum_{t in D} 1[a_t = y_t] + eps,    eps ~ N(0, noise_std^2),

paid on the last turn; the other T - m turns are routine: they must be played, but no action on
them changes the law of R. The observations ("turn 3 of 16") are identical for decision and
routine turns and never reveal a target, so the policy can only learn D and y from reward.

Randomness is split on purpose: the targets y_t are fixed by `target_seed` (part of the config, so
one env config is one task), while the seed given to `reset` draws only the outcome noise eps.

Turns are numbered from 0 in the API (`decision_turns`, the maths above) and from 1 in the text.
The turn number is the whole state, so the observation keeps it; `base.observation_hash` strips
only "Step k of n" counters and thus tells the turns apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax.envs import base
from agentrl_jax.envs import registry

ACTIONS = ("0", "1")
_INSTRUCTION = "answer 0 or 1 each turn"
_FINAL_OBSERVATION = "episode over"


def decision_turns(horizon: int, num_decisions: int) -> tuple[int, ...]:
  """The evenly spaced decision turns D = round(linspace(0, T-1, m)), 0-based.

  Args:
    horizon: T, the episode length in turns.
    num_decisions: m, in [1, T].

  Returns:
    m distinct, increasing turn indices in [0, T).
  """
  turns = np.round(np.linspace(0, horizon - 1, num_decisions)).astype(int)
  # Spacing (T-1)/(m-1) >= 1 keeps the rounded turns distinct; the assert guards that argument.
  assert len(set(turns.tolist())) == num_decisions, (horizon, num_decisions, turns)
  return tuple(int(t) for t in turns)


@registry.register("dd_chain")
class DDChain(base.TextEnv):
  """The decision-density chain as a text env; `max_turns` equals `horizon`.

  Info on every turn: `decision_turn` (`extra_keys.DECISION_TURN_KEY`), whether the turn was a
  decision turn (the oracle's D; the rollout copies it to `traj.extras`). Info on the last turn: `success` (every decision turn correct) and
  `sub_outcomes = {"correct_decisions": fraction of decision turns correct}`. An invalid action
  counts as a turn and as a wrong answer.
  """

  action_words = ACTIONS

  def __init__(self, horizon: int = 16, num_decisions: int = 4, beta: float = 1.0,
               noise_std: float = 0.0, target_seed: int = 0):
    """Builds the chain.

    Args:
      horizon: T, turns per episode, >= 1.
      num_decisions: m, decision turns, in [1, T].
      beta: reward per correct decision.
      noise_std: standard deviation of the Gaussian outcome noise, >= 0.
      target_seed: seed of the targets y_t (the task), >= 0.
    """
    if not base.is_int(horizon) or horizon < 1:
      raise ValueError(f"horizon must be an int >= 1, got {horizon!r}")
    if not base.is_int(num_decisions) or not 1 <= num_decisions <= horizon:
      raise ValueError(f"num_decisions must be an int in [1, horizon={horizon}], "
                       f"got {num_decisions!r}")
    if not base.is_number(beta):
      raise ValueError(f"beta must be a number, got {beta!r}")
    if not base.is_number(noise_std) or noise_std < 0:
      raise ValueError(f"noise_std must be a number >= 0, got {noise_std!r}")
    if not base.is_int(target_seed) or target_seed < 0:
      raise ValueError(f"target_seed must be an int >= 0, got {target_seed!r}")
    super().__init__(max_turns=horizon)
    self.horizon = horizon
    self.num_decisions = num_decisions
    self.beta = float(beta)
    self.noise_std = float(noise_std)
    self.target_seed = target_seed
    self.decision_turns = decision_turns(horizon, num_decisions)
    draws = np.random.default_rng(target_seed).integers(0, 2, size=num_decisions)
    self._targets = {t: ACTIONS[int(y)] for t, y in zip(self.decision_turns, draws)}
    self._noise = 0.0
    self._num_correct = 0

  @property
  def density(self) -> float:
    """ρ = m / T."""
    return self.num_decisions / self.horizon

  @property
  def decision_mask(self) -> np.ndarray:
    """Bool [T], True on decision turns (the oracle critic's D̂)."""
    mask = np.zeros(self.horizon, dtype=bool)
    mask[list(self.decision_turns)] = True
    return mask

  @property
  def targets(self) -> dict[int, str]:
    """Decision turn → target action y_t (a copy)."""
    return dict(self._targets)

  def expert_action(self) -> str:
    """y_t on a decision turn, "0" on a routine turn."""
    return self._targets.get(self.turn, ACTIONS[0])

  def _reset(self, seed: int) -> str:
    rng = np.random.default_rng(seed)
    self._noise = float(rng.normal(0.0, self.noise_std)) if self.noise_std > 0 else 0.0
    self._num_correct = 0
    return f"{_INSTRUCTION}\n{self._turn_text(0)}"

  def _step(self, action: Any) -> base.StepResult:
    t = self.turn - 1  # `turn` already counts this step.
    word = base.parse_action(action, ACTIONS)
    if t in self._targets and word == self._targets[t]:
      self._num_correct += 1
    info: dict[str, Any] = {"action_valid": word is not None,
                            extra_keys.DECISION_TURN_KEY: t in self._targets}

    if t == self.horizon - 1:
      reward = self.beta * self._num_correct + self._noise
      info["success"] = self._num_correct == self.num_decisions
      info["sub_outcomes"] = {"correct_decisions": self._num_correct / self.num_decisions}
      done = True
      observation = _FINAL_OBSERVATION
    else:
      reward, done = 0.0, False
      observation = self._turn_text(t + 1)
    if word is None:
      observation = f"{base.invalid_action_message(action, ACTIONS)}\n{observation}"
    return base.StepResult(observation, reward, done, info)

  def _turn_text(self, t: int) -> str:
    return f"turn {t + 1} of {self.horizon}"

