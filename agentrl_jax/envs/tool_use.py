"""A tau-bench-like customer-service task: tools over an order database, a scripted user, a policy.

The agent is a store's support agent. A rule-based user reveals their request over turns: first
only that they need help, then (when the agent talks to them) their name and order id, then what
they want (a refund of a damaged item, or a cancellation). The agent acts through tool calls in a
plain text syntax, one per turn:

    get_order(order_id=O1234)            look an order up
    refund(order_id=O1234, reason=...)   refund a delivered order (marks it refunded)
    cancel_order(order_id=O1234)         cancel an order (marks it cancelled)
    respond(text)                        say something to the user; the user replies
    end_conversation()                   end the episode

Policy (shown in the first observation): look an order up before acting on it; refund only
delivered orders at most 30 days after delivery; cancel only orders still processing; shipped
orders can be neither refunded nor cancelled. Tools execute whatever they are asked (as in
tau-bench): following the policy is the agent's job, and the verifier checks it.

Success (reward 1) when the agent ends the conversation after the request was revealed and the
target order was looked up, with the final database equal to the one the policy prescribes (the
right refund or cancellation issued, nothing else changed) and, for a request the policy denies,
after telling the user. `info`: `action_valid`,
`tool` (the tool name of a valid call); last step: `success` and `sub_outcomes` =
`request_revealed`, `order_looked_up`, `db_match`, `no_forbidden_action` (no refund/cancel other
than the prescribed one was executed), `user_informed` (the prescribed change was made, or, when
the policy forbids the request, the agent messaged the user after looking the order up); success
needs all five. The last step's `sub_outcomes` also count them (`verifiers_passed` of
`verifiers_total` = 5), so `rewards.process.verifier_count_reward` can rank failed episodes by how
many checks they pass.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np

from agentrl_jax import extra_keys
from agentrl_jax.envs import base
from agentrl_jax.envs import registry

TOOLS = ("get_order", "refund", "cancel_order", "respond", "end_conversation")
TOOL_HELP = ("tools: get_order(order_id=...), refund(order_id=..., reason=...), "
             "cancel_order(order_id=...), respond(text), end_conversation()")
POLICY = ("you are a store support agent. policy: look up an order before acting on it; refund "
          "only delivered orders at most 30 days after delivery; cancel only orders still "
          "processing; shipped orders can be neither refunded nor cancelled.")
REFUND_WINDOW_DAYS = 30
SCENARIOS = ("refund_ok", "refund_late", "cancel_ok", "cancel_shipped")

_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.DOTALL)
_KWARG = re.compile(r"\s*(\w+)\s*=\s*(\"[^\"]*\"|'[^']*'|[^,]*)\s*(?:,|$)")
_MAX_ACTION_CHARS = 400
_MAX_QUOTED_CHARS = 24
_NAMES = ("Ada Moreno", "Bilal Chen", "Carla Novak", "Dmitri Osei", "Elena Park", "Farid Lund",
          "Grace Kim", "Hugo Silva", "Ines Dubois", "Jonas Berg", "Kemi Adeyemi", "Luca Rossi")
_ITEMS = (("desk lamp", 39.0), ("kettle", 25.0), ("backpack", 60.0), ("headphones", 89.0),
          ("blender", 75.0), ("jacket", 120.0), ("board game", 35.0), ("monitor", 210.0))


def make_task(seed: int) -> dict[str, Any]:
  """The scenario of episode `seed`: the customer, their three orders, the target and request."""
  rng = np.random.default_rng([seed, 5])
  scenario = SCENARIOS[int(rng.integers(len(SCENARIOS)))]
  ids = rng.choice(np.arange(1000, 10000), size=3, replace=False)
  items = rng.choice(len(_ITEMS), size=3, replace=False)
  target_status = {"refund_ok": "delivered", "refund_late": "delivered",
                   "cancel_ok": "processing", "cancel_shipped": "shipped"}[scenario]
  orders = {}
  for k in range(3):
    status = target_status if k == 0 else ("delivered", "shipped", "processing")[rng.integers(3)]
    days = None
    if status == "delivered":
      days = int(rng.integers(1, REFUND_WINDOW_DAYS + 1))
      if k == 0 and scenario == "refund_late":
        days = int(rng.integers(REFUND_WINDOW_DAYS + 1, 120))
    item, price = _ITEMS[int(items[k])]
    orders[f"O{int(ids[k])}"] = {"item": item, "price": price, "status": status,
                                 "days_since_delivery": days}
  target = f"O{int(ids[0])}"
  return {"scenario": scenario, "customer": _NAMES[int(rng.integers(len(_NAMES)))],
          "orders": orders, "target": target}


def expected_database(task: dict[str, Any]) -> dict[str, Any]:
  """The database the policy prescribes at the end of the episode."""
  db = copy.deepcopy(task["orders"])
  if task["scenario"] == "refund_ok":
    db[task["target"]]["status"] = "refunded"
  elif task["scenario"] == "cancel_ok":
    db[task["target"]]["status"] = "cancelled"
  return db


def parse_call(action: Any) -> tuple[str, dict[str, str]] | str:
  """(tool, arguments) of a well-formed tool call, else a one-line message naming the problem.

  `respond(...)` takes its whole inner text as `text`; other tools take `key=value` arguments,
  values optionally quoted.
  """
  if not isinstance(action, str):
    return f"invalid action of type {type(action).__name__}: {TOOL_HELP}"
  if not action.strip():
    return f"empty action: {TOOL_HELP}"
  if len(action) > _MAX_ACTION_CHARS:
    return f"action too long ({len(action)} characters, limit {_MAX_ACTION_CHARS})"
  match = _CALL.match(action)
  if match is None:
    return f"not a tool call '{_quote(action)}': {TOOL_HELP}"
  tool, inner = match.group(1).lower(), match.group(2).strip()
  if tool not in TOOLS:
    return f"unknown tool '{_quote(tool)}': {TOOL_HELP}"
  if tool == "respond":
    text = inner.strip("\"'").strip()
    return (tool, {"text": text}) if text else "respond needs a message: respond(text)"
  if inner and "=" not in inner and tool in ("get_order", "cancel_order"):
    return tool, {"order_id": inner.strip("\"'").strip()}  # get_order(O1234): the one argument.
  args, pos = {}, 0
  while pos < len(inner):
    kwarg = _KWARG.match(inner, pos)
    if kwarg is None or kwarg.end() == pos:
      return f"bad arguments '{_quote(inner[pos:])}' for {tool}: use key=value, comma separated"
    args[kwarg.group(1).lower()] = kwarg.group(2).strip().strip("\"'")
    pos = kwarg.end()
  return tool, args


@registry.register("tool_use")
class CustomerService(base.TextEnv):
  """Resolve a customer's order request with tool calls while following the store policy.

  Tasks come from `make_task(seed)` (default) or, with `data_dir`, from a built TFDS task set
  (`tasksets/tool_use_tasks.py`): `reset(seed)` takes record `seed % len`.
  """

  action_words = None

  def __init__(self, max_turns: int = 8, data_dir: str | None = None,
               taskset: str = "agentrl_tool_use_tasks", split: str = "train"):
    """Builds the env.

    Args:
      max_turns: step cap (tool calls, including messages to the user).
      data_dir: read tasks from a built TFDS task set here instead of generating them.
      taskset: the task set's TFDS name, with a config after a slash.
      split: the TFDS split when `data_dir` is set.
    """
    super().__init__(max_turns)
    self._source = None
    if data_dir is not None:
      # Imported here: TFDS is an optional dependency the generator path never needs.
      # pylint: disable-next=g-import-not-at-top
      from agentrl_jax.envs.tasksets import common
      self._source = common.TaskSource(taskset, data_dir, split)
    self.task: dict[str, Any] = {}
    self.database: dict[str, Any] = {}
    self._stage = 0
    self._looked_up: set[str] = set()
    self._forbidden = False
    self._acted = False
    self._told = False

  def _reset(self, seed: int) -> str:
    self.task = self._source.task(seed) if self._source else make_task(seed)
    self.database = copy.deepcopy(self.task["orders"])
    self._stage = 0
    self._looked_up = set()
    self._forbidden = False
    self._acted = False
    self._told = False
    return f"{POLICY}\n{TOOL_HELP}\nuser: hi, I need help with one of my orders."

  @property
  def request_revealed(self) -> bool:
    return self._stage >= 2

  def expert_action(self) -> str:
    """Ask until the request is known, look the order up, act (or decline), then end."""
    target, scenario = self.task["target"], self.task["scenario"]
    if not self.request_revealed:
      return "respond(How can I help? Please share your name, order id and request.)"
    if target not in self._looked_up:
      return f"get_order(order_id={target})"
    if scenario == "refund_ok" and not self._acted:
      return f"refund(order_id={target}, reason=damaged)"
    if scenario == "cancel_ok" and not self._acted:
      return f"cancel_order(order_id={target})"
    if scenario in ("refund_late", "cancel_shipped") and not self._told:
      return ("respond(Sorry, our policy does not allow that for this order: "
              f"{self._policy_reason()}.)")
    return "end_conversation()"

  def _policy_reason(self) -> str:
    if self.task["scenario"] == "refund_late":
      return f"it was delivered more than {REFUND_WINDOW_DAYS} days ago"
    return "it has already shipped"

  def _step(self, action: Any) -> base.StepResult:
    parsed = parse_call(action)
    if isinstance(parsed, str):
      return self._reply(parsed, {"action_valid": False, "tool": ""})
    tool, args = parsed
    info = {"action_valid": True, "tool": tool}
    if tool == "end_conversation":
      return self._finish("conversation ended", info)
    if tool == "respond":
      return self._reply(self._user_reply(), info)
    order_id = args.get("order_id", "").upper()
    if not order_id:
      return self._reply(f"tool error: {tool} needs order_id=...", dict(info, action_valid=False))
    order = self.database.get(order_id)
    if order is None:
      return self._reply(f"tool error: no order {_quote(order_id)}", info)
    if tool == "get_order":
      self._looked_up.add(order_id)
      days = order["days_since_delivery"]
      when = f" {days} days ago" if days is not None else ""
      return self._reply(f"tool: order {order_id}: {order['item']}, {order['price']:.2f}, "
                         f"{order['status']}{when}", info)
    return self._reply(self._change(tool, order_id, order), info)

  def _change(self, tool: str, order_id: str, order: dict[str, Any]) -> str:
    new_status = "refunded" if tool == "refund" else "cancelled"
    if order["status"] == new_status:
      return f"tool error: order {order_id} is already {new_status}"
    prescribed = (order_id == self.task["target"] and
                  self.task["scenario"] == ("refund_ok" if tool == "refund" else "cancel_ok"))
    self._forbidden |= not prescribed
    self._acted = True
    order["status"] = new_status
    if tool == "refund":
      return f"tool: refunded {order['price']:.2f} for order {order_id}"
    return f"tool: order {order_id} cancelled"

  def _user_reply(self) -> str:
    """The scripted user: reveals identity, then the request, then waits for the resolution."""
    self._stage += 1
    target = self.task["target"]
    item = self.task["orders"][target]["item"]
    if self._stage == 1:
      return f"user: I am {self.task['customer']}, the order is {target}."
    if self._stage == 2:
      if self.task["scenario"].startswith("refund"):
        return f"user: the {item} arrived damaged. I would like a refund."
      return f"user: I changed my mind about the {item}. please cancel the order."
    if self._looked_up and target in self._looked_up:
      self._told = True
    if self._acted or self._told:
      return "user: ok, thanks. that is all."
    return "user: so, can you help me with that?"

  def _finish(self, text: str, info: dict[str, Any]) -> base.StepResult:
    outcomes = self._sub_outcomes()
    success = all(v == 1.0 for v in outcomes.values())
    return base.StepResult(text, float(success), True,
                           dict(info, success=success, sub_outcomes=_with_counts(outcomes)))

  def _sub_outcomes(self) -> dict[str, float]:
    return {"request_revealed": float(self.request_revealed),
            "order_looked_up": float(self.task["target"] in self._looked_up),
            "db_match": float(self.database == expected_database(self.task)),
            "no_forbidden_action": float(not self._forbidden),
            "user_informed": float(self._acted or self._told)}

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False, sub_outcomes=_with_counts(self._sub_outcomes()))
    return result._replace(observation=f"{result.observation}\nout of turns", done=True,
                           info=info)

  def _reply(self, text: str, info: dict[str, Any]) -> base.StepResult:
    return base.StepResult(text, 0.0, False, info)


def _with_counts(outcomes: dict[str, float]) -> dict[str, float]:
  return {**outcomes, extra_keys.VERIFIERS_PASSED_KEY: float(sum(outcomes.values())),
          extra_keys.VERIFIERS_TOTAL_KEY: float(len(outcomes))}


def _quote(text: str) -> str:
  return base.quote_action(text, _MAX_QUOTED_CHARS)
