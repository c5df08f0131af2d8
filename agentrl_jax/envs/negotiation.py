"""Negotiation: multi-turn bargaining over one item against a scripted counterpart.

The policy is the buyer or the seller (constructor `role`, or drawn by the seed). Each side has
a private reservation price drawn by the seed: the buyer's value (pay no more) and the seller's
cost (sell for no less); the seed always leaves a zone of agreement between them. The
counterpart opens with an anchor beyond its reservation and concedes towards it each time it
counters; its style sets how fast:

  tough  concedes 8% of the remaining gap per counter-offer,
  fair   concedes 20%,
  eager  concedes 40%,

and good rapport (built with courteous `say` messages, spent by insults) adds up to 10 points to
that rate. The counterpart accepts an offer at least as good for it as its next counter-offer,
and never one beyond its reservation price.

Actions: `offer <price>`, `accept` (the counterpart's standing offer), `reject` (ask for a better
offer), `say <text>`. A deal ends the episode with reward = the policy's normalised surplus,
(value - price) / (value - counterpart reservation) for a buyer and the mirror for a seller:
1 is the best deal the counterpart would ever take, 0 is the policy's own reservation price, and
a deal beyond it is negative (clipped at -1). No deal (step cap) pays 0. Success is a deal with positive surplus.

Every step also reports `info["process"]` with three dimensions in [0, 1] for stage-aware process
rewards (docs/methods.md#socialrl): `goal_advancement` (how far the gap between the two sides'
latest prices has closed since the policy's first offer; 1 on a deal), `rapport` (the counterpart's
current rapport) and `protocol_coherence` (1 for a well-formed move consistent with the policy's
goal and earlier moves, 0.5 for a legal but incoherent one: retracting a concession, or offering
or accepting a price beyond the policy's own value; 0 for a malformed action).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

ROLES = ("buyer", "seller")
STYLES = {"tough": 0.08, "fair": 0.2, "eager": 0.4}
ITEMS = ("used bike", "vintage lamp", "laptop", "sofa", "camera", "guitar", "desk", "watch")
MAX_ACTION_CHARS = 300
_QUOTE_CHARS = 16
# The expert's opening distance from its value (a fraction of it) and its per-turn concession
# (a fraction of the remaining distance): tuned so it closes against every style within 12 turns.
EXPERT_ANCHOR = 0.35
EXPERT_CONCESSION = 0.25
_RAPPORT_BONUS = 0.1  # Added to the concession rate at full rapport.
_POLITE = ("please", "thank", "thanks", "appreciate", "fair", "great", "happy", "glad", "sorry",
           "understand", "kind", "deal")
_RUDE = ("ridiculous", "stupid", "scam", "joke", "insult", "idiot", "greedy", "rip")
_USAGE = "use offer <price>, accept, reject or say <text>"
_OFFER = re.compile(r"^offer\s+\$?(-?\d+(?:\.\d+)?)\s*$", re.IGNORECASE)


@registry.register("negotiation")
class Negotiation(base.TextEnv):
  """Bargaining against a scripted counterpart (see the module docstring).

  Info every step: `action_valid`, `process`. Final step: `success`, `sub_outcomes = {"deal",
  "surplus", "rapport"}`.
  """

  def __init__(self, max_turns: int = 12, role: str | None = None, style: str | None = None):
    """Builds the env.

    Args:
      max_turns: step cap, >= 1.
      role: "buyer" or "seller" for the policy; None = drawn by the reset seed.
      style: counterpart style, one of `STYLES`; None = drawn by the reset seed.
    """
    if role is not None and role not in ROLES:
      raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
    if style is not None and style not in STYLES:
      raise ValueError(f"style must be one of {sorted(STYLES)} or None, got {style!r}")
    super().__init__(max_turns=max_turns)
    self.fixed_role, self.fixed_style = role, style
    self.role, self.style, self.item = "buyer", "fair", ITEMS[0]
    self.value = 0.0  # The policy's reservation price.
    self.counter_value = 0.0  # The counterpart's reservation price.
    self.counter_offer = 0.0  # The counterpart's standing offer.
    self.own_offer: float | None = None
    self.rapport = 0.5
    self._initial_gap: float | None = None

  @property
  def sign(self) -> float:
    """+1 for a buyer (lower prices are better for the policy), -1 for a seller."""
    return 1.0 if self.role == "buyer" else -1.0

  def surplus(self, price: float) -> float:
    """The policy's normalised surplus of a deal at `price` (module docstring), >= -1."""
    # Clipped below so one absurd offer cannot dominate a batch's rewards.
    return max(-1.0, self.sign * (self.value - price) / abs(self.value - self.counter_value))

  def expert_action(self) -> str:
    """A concession strategy that sees only its own value and the counterpart's offers.

    Opens with a courteous message, anchors `EXPERT_ANCHOR` of its value away from it (lower
    as a buyer, higher as a seller), then concedes `EXPERT_CONCESSION` of the remaining distance
    to its value each turn, and accepts a standing offer no worse than the offer it would make.
    """
    if self.turn == 0:
      return "say thanks, happy to find a fair deal"
    if self.own_offer is None:
      target = self.value * (1.0 - self.sign * EXPERT_ANCHOR)
    else:
      target = self.own_offer + EXPERT_CONCESSION * (self.value - self.own_offer)
    if self.sign * (target - self.counter_offer) >= 0:
      return "accept"
    return f"offer {target:.2f}"

  def _reset(self, seed: int) -> str:
    rng = np.random.default_rng(seed)
    self.role = self.fixed_role or ROLES[int(rng.integers(2))]
    self.style = self.fixed_style or sorted(STYLES)[int(rng.integers(len(STYLES)))]
    self.item = ITEMS[int(rng.integers(len(ITEMS)))]
    mid = float(rng.integers(50, 500))
    zone = mid * float(rng.uniform(0.15, 0.4))  # Width of the zone of agreement.
    cost, worth = round(mid - zone / 2, 2), round(mid + zone / 2, 2)
    self.value, self.counter_value = (worth, cost) if self.role == "buyer" else (cost, worth)
    # The counterpart anchors beyond the policy's value (and so beyond its own reservation):
    # accepting the opening offer is always a loss.
    anchor = 1.0 + float(rng.uniform(0.05, 0.3))
    self.counter_offer = round(worth * anchor if self.role == "buyer" else cost / anchor, 2)
    self.own_offer = None
    self.rapport = 0.5
    self._initial_gap = None
    other = "seller" if self.role == "buyer" else "buyer"
    limit = "pay more than" if self.role == "buyer" else "sell for less than"
    return (f"you are the {self.role} of a {self.item}. your private value is "
            f"${self.value:.2f}: never {limit} that.\n"
            f"{other}: my price is ${self.counter_offer:.2f}.\n{_USAGE}")

  def _step(self, action: Any) -> base.StepResult:
    parsed = _parse(action)
    if isinstance(parsed, str):
      return self._result(f"invalid action: {parsed}", valid=False, coherence=0.0)
    verb, arg = parsed
    if verb == "say":
      return self._say(arg)
    if verb == "accept":
      # Accepting a price beyond one's own value is legal but contradicts the private goal.
      return self._deal(self.counter_offer, "deal: you accepted",
                        coherent=self.surplus(self.counter_offer) >= 0)
    if verb == "reject":
      self._concede()
      return self._result(f"{self._other()}: then how about ${self.counter_offer:.2f}?",
                          valid=True, coherence=1.0)
    price = arg
    if price <= 0:
      return self._result("invalid action: the price must be positive", valid=False,
                          coherence=0.0)
    # Moving one's own offer away from the other side is legal but retracts a concession.
    retracts = self.own_offer is not None and self.sign * (price - self.own_offer) < 0
    incoherent = retracts or self.surplus(price) < 0
    if self._initial_gap is None:
      # Gaps are measured from the moment both sides have named a price.
      self._initial_gap = max(abs(self.counter_offer - price), 1e-6)
    self.own_offer = price
    next_offer = self._next_counter_offer()
    if self.sign * (price - next_offer) >= 0 and self._acceptable(price):
      return self._deal(price, f"{self._other()}: deal at ${price:.2f}", coherent=not incoherent)
    self.counter_offer = next_offer
    return self._result(f"{self._other()}: I can do ${self.counter_offer:.2f}.", valid=True,
                        coherence=0.5 if incoherent else 1.0)

  def _say(self, text: str) -> base.StepResult:
    words = set(re.findall(r"[a-z]+", text.lower()))
    polite = any(w.startswith(p) for w in words for p in _POLITE)
    rude = any(w.startswith(r) for w in words for r in _RUDE)
    if rude:
      self.rapport = max(0.0, self.rapport - 0.3)
      reply = "that is uncalled for."
    elif polite:
      self.rapport = min(1.0, self.rapport + 0.25)
      reply = "likewise, let us make this work."
    else:
      reply = "go on."
    reply += f" my offer stands at ${self.counter_offer:.2f}."
    return self._result(f"{self._other()}: {reply}", valid=True, coherence=1.0)

  def _deal(self, price: float, message: str, coherent: bool = True) -> base.StepResult:
    surplus = self.surplus(price)
    process = self._process(coherence=1.0 if coherent else 0.5, closed=True)
    info = {"action_valid": True, "success": surplus > 0, "process": process,
            "sub_outcomes": {"deal": 1.0, "surplus": surplus, "rapport": self.rapport}}
    return base.StepResult(f"{message}. your surplus: {surplus:.2f}", surplus, True, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False,
                sub_outcomes={"deal": 0.0, "surplus": 0.0, "rapport": self.rapport})
    return result._replace(done=True, info=info,
                           observation=result.observation + "\nout of time: no deal")

  def _result(self, observation: str, *, valid: bool, coherence: float) -> base.StepResult:
    info = {"action_valid": valid, "process": self._process(coherence=coherence)}
    if not valid:
      observation += f"; {_USAGE}"
    return base.StepResult(observation, 0.0, False, info)

  def _process(self, *, coherence: float, closed: bool = False) -> dict[str, float]:
    if closed:
      advancement = 1.0
    elif self.own_offer is None:
      advancement = 0.0
    else:
      gap = abs(self.counter_offer - self.own_offer)
      advancement = float(np.clip(1.0 - gap / self._initial_gap, 0.0, 1.0))
    return {"goal_advancement": advancement, "rapport": self.rapport,
            "protocol_coherence": coherence}

  def _rate(self) -> float:
    return STYLES[self.style] + _RAPPORT_BONUS * self.rapport

  def _next_counter_offer(self) -> float:
    offer = self.counter_offer + self._rate() * (self.counter_value - self.counter_offer)
    return round(offer, 2)

  def _concede(self) -> None:
    self.counter_offer = self._next_counter_offer()

  def _acceptable(self, price: float) -> bool:
    # The counterpart's own surplus must not be negative.
    return self.sign * (price - self.counter_value) >= 0

  def _other(self) -> str:
    return "seller" if self.role == "buyer" else "buyer"


def _parse(action: Any) -> tuple[str, Any] | str:
  """(verb, argument) of a well-formed action, else a message naming the problem."""
  problem = base.text_action_problem(action, MAX_ACTION_CHARS)
  if problem:
    return problem
  text = action.strip()
  word = text.split()[0].lower()
  if word in ("accept", "reject") and len(text.split()) == 1:
    return word, None
  if word == "say":
    rest = text[3:].strip()
    return ("say", rest) if rest else "say needs a message"
  if word == "offer":
    match = _OFFER.match(text)
    if match is None:
      return f"cannot read a price in '{_quote(text)}'"
    return "offer", float(match.group(1))
  return f"unknown action '{_quote(text)}'"


def _quote(text: str) -> str:
  return base.quote_action(text, _QUOTE_CHARS)
