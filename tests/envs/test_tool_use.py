"""Tests of the tau-bench-like customer-service env."""

import collections

import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs import tool_use


def _run(env, seed, policy):
  env.reset(seed)
  results = []
  while not results or not results[-1].done:
    results.append(env.step(policy(env)))
  return results


def _seed_of(scenario):
  return next(s for s in range(100) if tool_use.make_task(s)["scenario"] == scenario)


def test_registered_and_builds_by_name():
  assert isinstance(registry.make("tool_use", max_turns=6), tool_use.CustomerService)


def test_expert_succeeds_on_100_seeds_across_scenarios():
  env = tool_use.CustomerService()
  wins, scenarios = 0, collections.Counter()
  for seed in range(100):
    results = _run(env, seed, lambda e: e.expert_action())
    wins += results[-1].info["success"]
    scenarios[env.task["scenario"]] += 1
    assert all(r.info["action_valid"] for r in results)
  assert wins >= 95
  assert set(scenarios) == set(tool_use.SCENARIOS)


def test_random_policy_success():
  # Random tool calls with a random one of the customer's order ids.
  # Measured: 0.005 over seeds 0..199 (docs/envs_table_a.md).
  rng = np.random.default_rng(0)

  def policy(env):
    order = list(env.task["orders"])[rng.integers(3)]
    return [f"get_order(order_id={order})", f"refund(order_id={order}, reason=x)",
            f"cancel_order(order_id={order})", "respond(hello)", "end_conversation()"][
                rng.integers(5)]

  env = tool_use.CustomerService()
  wins = sum(_run(env, seed, policy)[-1].info["success"] for seed in range(100))
  assert wins <= 10


def test_user_reveals_the_request_over_turns():
  env = tool_use.CustomerService()
  env.reset(_seed_of("refund_ok"))
  target = env.task["target"]
  first = env.step("respond(hi, how can I help?)").observation
  assert target in first and env.task["customer"] in first and "refund" not in first
  second = env.step("respond(what do you need?)").observation
  assert "refund" in second and env.task["orders"][target]["item"] in second


@pytest.mark.parametrize("scenario, action, outcome", [
    # Refunding a late delivery breaks the policy: database differs and a forbidden action ran.
    ("refund_late", "refund(order_id={t}, reason=damaged)",
     {"db_match": 0.0, "no_forbidden_action": 0.0}),
    # Cancelling a shipped order, likewise.
    ("cancel_shipped", "cancel_order(order_id={t})",
     {"db_match": 0.0, "no_forbidden_action": 0.0}),
    # Refunding the wrong (another) order in a refund_ok scenario.
    ("refund_ok", "refund(order_id={other}, reason=damaged)",
     {"db_match": 0.0, "no_forbidden_action": 0.0}),
])
def test_policy_violations_fail_verification(scenario, action, outcome):
  env = tool_use.CustomerService(max_turns=10)
  env.reset(_seed_of(scenario))
  target = env.task["target"]
  other = next(o for o in env.task["orders"] if o != target)
  env.step("respond(hello)")
  env.step("respond(tell me more)")
  env.step(f"get_order(order_id={target})")
  env.step(action.format(t=target, other=other))
  env.step("respond(done)")
  result = env.step("end_conversation()")
  assert result.done and not result.info["success"] and result.reward == 0.0
  for key, value in outcome.items():
    assert result.info["sub_outcomes"][key] == value


def test_declining_without_telling_the_user_fails():
  env = tool_use.CustomerService()
  env.reset(_seed_of("cancel_shipped"))
  for action in ("respond(hi)", "respond(go on)", f"get_order({env.task['target']})"):
    env.step(action)
  result = env.step("end_conversation()")
  assert not result.info["success"]
  assert result.info["sub_outcomes"]["user_informed"] == 0.0
  assert result.info["sub_outcomes"]["db_match"] == 1.0


def test_ending_before_the_request_is_known_fails():
  env = tool_use.CustomerService()
  env.reset(0)
  result = env.step("end_conversation()")
  assert result.done and not result.info["success"]
  assert result.info["sub_outcomes"]["request_revealed"] == 0.0


def test_parse_call():
  assert tool_use.parse_call('refund(order_id=O12, reason="a, b")') == (
      "refund", {"order_id": "O12", "reason": "a, b"})
  assert tool_use.parse_call("get_order(O12)") == ("get_order", {"order_id": "O12"})
  assert tool_use.parse_call("respond(hi there)") == ("respond", {"text": "hi there"})
  assert tool_use.parse_call("end_conversation()") == ("end_conversation", {})
  assert tool_use.parse_call("fly(to=moon)").startswith("unknown tool 'fly'")
  assert tool_use.parse_call("get_order(order_id=1, =)").startswith("bad arguments")


@pytest.mark.parametrize("action, expected", [
    ("", "empty action"), (None, "invalid action of type NoneType"),
    ("hello", "not a tool call 'hello'"), ("respond()", "respond needs a message"),
    ("x" * 5000, "action too long (5000 characters"), ("refund(reason=x)", "tool error: refund"),
    ("get_order(order_id=O1)", "tool error: no order O1"),
])
def test_malformed_actions_get_a_clear_observation(action, expected):
  env = tool_use.CustomerService()
  env.reset(0)
  result = env.step(action)
  assert result.observation.startswith(expected) and not result.done
  assert len(result.observation) < 200 and result.reward == 0.0


def test_same_seed_same_episode():
  actions = ["respond(hi)", "bad", "respond(more)", "get_order(O1)", "end_conversation()"]
  a, b = tool_use.CustomerService(), tool_use.CustomerService()
  assert [a.reset(5)] + [a.step(x) for x in actions] == [b.reset(5)] + [b.step(x) for x in actions]
  assert a.database == b.database


def test_step_cap():
  env = tool_use.CustomerService(max_turns=3)
  env.reset(0)
  for _ in range(3):
    result = env.step("respond(hi)")
  assert result.done and not result.info["success"] and "out of turns" in result.observation


def test_sub_outcomes_count_their_checks_for_the_verifier_count_reward():
  env = tool_use.CustomerService()
  env.reset(_seed_of("cancel_shipped"))
  for action in ("respond(hi)", "respond(go on)", f"get_order({env.task['target']})"):
    env.step(action)
  declined = env.step("end_conversation()").info["sub_outcomes"]
  # Revealed, looked up, database unchanged, nothing forbidden; the user was not told.
  assert declined["verifiers_passed"] == 4.0 and declined["verifiers_total"] == 5.0
  env.reset(0)
  ended_at_once = env.step("end_conversation()").info["sub_outcomes"]
  checks = {k: v for k, v in ended_at_once.items() if not k.startswith("verifiers_")}
  assert ended_at_once["verifiers_passed"] == sum(checks.values()) < 5.0
  env = tool_use.CustomerService(max_turns=2)
  env.reset(0)
  env.step("respond(hi)")
  capped = env.step("respond(and?)").info["sub_outcomes"]
  assert capped["verifiers_total"] == 5.0


def test_expert_episode_passes_every_check():
  env = tool_use.CustomerService()
  results = _run(env, 3, lambda e: e.expert_action())
  final = results[-1].info["sub_outcomes"]
  assert results[-1].info["success"]
  assert final["verifiers_passed"] == final["verifiers_total"] == 5.0
