"""Tests of the negotiation env: the counterpart's rules, surplus, process dimensions."""

import random

import pytest

from agentrl_jax.envs import negotiation
from agentrl_jax.envs import registry

import episodes

# Measured with `_random_episode` over seeds 0..999: 17.1% success (a random offer sometimes
# lands inside the zone of agreement), mean reward -0.41 (many deals beyond the own value).
RANDOM_SUCCESS_BOUND = 0.3


def _expert_episode(env, seed):
  return episodes.expert_final(env, seed)


def _random_episode(env, seed, rng):
  env.reset(seed)
  while True:
    action = rng.choice(["accept", "reject", "say thanks",
                         f"offer {env.value * rng.uniform(0.5, 1.5):.2f}"])
    result = env.step(action)
    if result.done:
      return result


def test_registered():
  assert isinstance(registry.make("negotiation", style="fair"), negotiation.Negotiation)


@pytest.mark.parametrize("role", negotiation.ROLES)
def test_seed_leaves_a_zone_of_agreement(role):
  env = negotiation.Negotiation(role=role)
  for seed in range(50):
    env.reset(seed)
    buyer_value, seller_cost = ((env.value, env.counter_value) if role == "buyer"
                                else (env.counter_value, env.value))
    assert buyer_value > seller_cost
    # The counterpart opens beyond the policy's own value.
    assert env.sign * (env.counter_offer - env.value) > 0


def test_surplus_normalisation_by_hand():
  env = negotiation.Negotiation(role="buyer")
  env.reset(0)
  env.value, env.counter_value = 120.0, 80.0
  # (120 - 90) / (120 - 80) = 0.75; at the counterpart's reservation 1; at the own value 0.
  assert env.surplus(90.0) == pytest.approx(0.75)
  assert env.surplus(80.0) == pytest.approx(1.0)
  assert env.surplus(120.0) == pytest.approx(0.0)
  env = negotiation.Negotiation(role="seller")
  env.reset(0)
  env.value, env.counter_value = 80.0, 120.0
  assert env.surplus(110.0) == pytest.approx((110 - 80) / 40)
  # Selling at 20 would be (20 - 80) / 40 = -1.5, clipped to -1.
  assert env.surplus(20.0) == -1.0


def test_counterpart_concedes_at_its_style_rate():
  env = negotiation.Negotiation(role="buyer", style="fair")
  env.reset(3)
  ask, reserve = env.counter_offer, env.counter_value
  result = env.step("reject")
  # Rate = 0.2 (fair) + 0.1 * rapport 0.5 = 0.25 of the remaining gap.
  expected = round(ask + 0.25 * (reserve - ask), 2)
  assert env.counter_offer == pytest.approx(expected)
  assert f"${expected:.2f}" in result.observation


def test_counterpart_accepts_an_offer_at_its_next_price_but_never_below_reservation():
  env = negotiation.Negotiation(role="buyer", style="eager")
  env.reset(5)
  next_ask = round(env.counter_offer + 0.45 * (env.counter_value - env.counter_offer), 2)
  result = env.step(f"offer {next_ask - 1:.2f}")
  assert not result.done
  env.reset(5)
  result = env.step(f"offer {next_ask:.2f}")
  assert result.done and result.info["sub_outcomes"]["deal"] == 1.0
  assert result.reward == pytest.approx(env.surplus(next_ask))
  # Far below the seller's cost: refused however many turns pass.
  env.reset(5)
  for _ in range(env.max_turns - 1):
    assert not env.step(f"offer {env.counter_value - 5:.2f}").done
  final = env.step(f"offer {env.counter_value - 5:.2f}")
  assert final.done and final.reward == 0.0 and final.info["sub_outcomes"]["deal"] == 0.0


def test_rapport_moves_with_courtesy_and_insults():
  env = negotiation.Negotiation()
  env.reset(0)
  assert env.step("say thank you, I appreciate it").info["process"]["rapport"] == 0.75
  assert env.step("say this is a scam").info["process"]["rapport"] == pytest.approx(0.45)
  assert env.step("say the weather").info["process"]["rapport"] == pytest.approx(0.45)


def test_process_dimensions():
  env = negotiation.Negotiation(role="buyer", style="tough")
  env.reset(1)
  low = round(env.value * 0.6, 2)
  first = env.step(f"offer {low}").info["process"]
  second = env.step(f"offer {round(env.value * 0.8, 2)}").info["process"]
  assert first["protocol_coherence"] == 1.0 and second["protocol_coherence"] == 1.0
  assert 0.0 <= first["goal_advancement"] < second["goal_advancement"] <= 1.0
  # Moving the own offer back down retracts a concession.
  assert env.step(f"offer {low}").info["process"]["protocol_coherence"] == 0.5
  assert env.step("haggle").info["process"]["protocol_coherence"] == 0.0
  for dims in (first, second):
    assert set(dims) == {"goal_advancement", "rapport", "protocol_coherence"}


def test_accepting_beyond_own_value_is_a_loss():
  env = negotiation.Negotiation(role="buyer")
  env.reset(2)
  result = env.step("accept")
  # The opening ask is above the buyer's value, so the surplus is negative.
  assert result.done and result.reward < 0 and not result.info["success"]
  assert result.info["process"]["protocol_coherence"] == 0.5


@pytest.mark.parametrize("style", sorted(negotiation.STYLES))
@pytest.mark.parametrize("role", negotiation.ROLES)
def test_expert_reaches_good_deals(style, role):
  env = negotiation.Negotiation(style=style, role=role)
  finals = [_expert_episode(env, s) for s in range(100)]
  assert sum(f.info["success"] for f in finals) >= 95
  assert min(f.reward for f in finals) > 0.2


def test_random_policy_success_is_recorded():
  env = negotiation.Negotiation()
  rng = random.Random(0)
  finals = [_random_episode(env, s, rng) for s in range(300)]
  rate = sum(f.info["success"] for f in finals) / 300
  assert rate <= RANDOM_SUCCESS_BOUND
  assert sum(f.reward for f in finals) / 300 < 0.3


def test_same_seed_same_episode():
  actions = ["say hi", "offer 100", "reject", "offer 150.5", "accept"]

  def play(seed):
    env = negotiation.Negotiation()
    trace = [env.reset(seed)]
    for a in actions:
      result = env.step(a)
      trace.append(result)
      if result.done:
        break
    return trace

  assert play(9) == play(9)
  assert play(9)[0] != play(10)[0]


@pytest.mark.parametrize("action, fragment", [
    ("", "empty action"),
    (None, "action of type NoneType"),
    ("x" * 5000, "longer than 300"),
    ("offer lots", "cannot read a price in 'offer lots'"),
    ("say", "say needs a message"),
    ("accept now please", "unknown action"),
    ("offer 0", "the price must be positive"),
    ("bribe", "unknown action 'bribe'"),
])
def test_malformed_actions_get_a_clear_observation(action, fragment):
  env = negotiation.Negotiation()
  env.reset(0)
  result = env.step(action)
  assert fragment in result.observation
  assert result.info["action_valid"] is False and not result.done and result.reward == 0.0
  assert result.info["process"]["protocol_coherence"] == 0.0
