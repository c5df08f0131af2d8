"""Context-window policies: which earlier tokens each turn of a conversation may attend to.

Every token gets a context floor, the first absolute token position it may attend to; all tokens
of turn k (its observation and its action) share the floor `context_floor[k]`:

  * 'full': 0, the whole conversation.
  * 'last_k': the start of turn max(0, k − history_turns)'s observation, so turn k sees the
    last `history_turns` turns and itself (verl-agent's `history_length`).
  * 'truncate_oldest': the start of the oldest whole turn j ≤ k such that the tokens from there to
    the end of turn k's action fit in `max_context_tokens`. The action's length is not known when
    the turn starts, so its budget (the per-turn cap, or what is left of the trajectory's) is
    counted instead: the context never exceeds the limit.

The KV cache keeps every token and the floor only masks keys (`transformer.Positions.floor`), so
no turn is re-prefilled and relative positions (RoPE, ALiBi) are unchanged. The K/V of a cached
token were computed under its own turn's floor; a full forward pass with `floor_per_token`
computes them under the same floor, so the learner scores exactly what the sampler drew (TITO).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from agentrl_jax import config_errors

POLICIES = ("full", "last_k", "truncate_oldest")


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContextConfig:
  """A context-window policy.

  Attributes:
    policy: 'full', 'last_k' or 'truncate_oldest' (module docstring).
    history_turns: 'last_k' only: how many earlier turns stay visible (0 = the current turn only).
    max_context_tokens: 'truncate_oldest' only: the most tokens a turn may attend to, its own
      observation and action budget included.
  """

  policy: str = "full"
  history_turns: int = 0
  max_context_tokens: int = 0

  def __post_init__(self):
    config_errors.check_field_types(self)
    if self.policy not in POLICIES:
      raise ValueError(f"ContextConfig.policy must be one of {POLICIES}, got {self.policy!r}")
    if self.history_turns < 0:
      raise ValueError(f"ContextConfig.history_turns must be >= 0, got {self.history_turns}")
    if self.policy == "truncate_oldest" and self.max_context_tokens <= 0:
      raise ValueError("ContextConfig(policy='truncate_oldest') needs max_context_tokens > 0, got "
                       f"{self.max_context_tokens}")

  @property
  def masks(self) -> bool:
    """Whether the policy ever hides a token (everything but 'full')."""
    return self.policy != "full"


def turn_floor(config: ContextConfig, turn_open: Sequence[int], context_end: int) -> int:
  """The context floor of the latest turn k of one conversation.

  Args:
    config: the policy.
    turn_open: token offsets where the observations of turns 0..k start (k + 1 entries).
    context_end: where turn k's context ends at most: its action's start plus the action budget.
  Returns:
    The first absolute token position turn k may attend to.
  """
  k = len(turn_open) - 1
  if k < 0:
    raise ValueError("turn_floor: turn_open is empty; pass the start of at least the current turn")
  if config.policy == "last_k":
    return int(turn_open[max(0, k - config.history_turns)])
  if config.policy == "truncate_oldest":
    for start in turn_open:  # oldest first: the first that fits keeps the most turns
      if context_end - start <= config.max_context_tokens:
        return int(start)
    return int(turn_open[k])  # the current turn alone is always kept
  return 0


