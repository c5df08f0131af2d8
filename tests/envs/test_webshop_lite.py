"""Tests of WebShop-lite: catalogue generation, pages, the attribute-matching reward."""

import random

import numpy as np
import pytest

from agentrl_jax.envs import registry
from agentrl_jax.envs import webshop_lite
from agentrl_jax.learner import configs
from agentrl_jax.learner import warm_start

import episodes

# Measured with `_random_episode` over seeds 0..999: 0.2% success, mean reward 0.17.
RANDOM_SUCCESS_BOUND = 0.05


def _expert_episode(env, seed):
  return episodes.expert_final(env, seed)


def _random_episode(env, seed, rng):
  """Uniform over the page's actions; a search uses random catalogue words."""
  env.reset(seed)
  while True:
    action = rng.choice(env.available_actions())
    if action.startswith("search"):
      words = [rng.choice(w) for w in (webshop_lite.COLORS, webshop_lite.MATERIALS,
                                       webshop_lite.CATEGORIES)]
      action = f"search[{' '.join(words)}]"
    result = env.step(action)
    if result.done:
      return result


def test_registered():
  assert isinstance(registry.make("webshop_lite"), webshop_lite.WebShopLite)


def test_catalogue_has_exactly_one_full_match_and_near_misses():
  for seed in range(50):
    products, goal, target = webshop_lite.generate(seed)
    full = [p for p in products
            if any(all(goal.matches(p, s).values()) for s in p.sizes)]
    assert [p.pid for p in full] == [target]
    same_title = [p for p in products
                  if (p.category, p.color, p.material) == (goal.category, goal.color,
                                                           goal.material)]
    assert 3 == len(same_title) <= webshop_lite.RESULTS_PER_PAGE
    assert len({p.pid for p in products}) == len(products)


def test_reward_is_fraction_of_attributes_matched():
  env = webshop_lite.WebShopLite()
  env.reset(0)
  goal = env.goal
  # A product of the right title but over budget, bought in the right size: 4 of 5 attributes.
  dear = next(p for p in env.products
              if p.title == f"{goal.color} {goal.material} {goal.category}"
              and p.price > goal.max_price)
  env.step(f"search[{dear.title}]")
  env.step(f"click[{dear.pid}]")
  env.step(f"select[{goal.size}]")
  result = env.step("buy")
  assert result.done and result.reward == pytest.approx(4 / 5)
  assert not result.info["success"]
  assert result.info["sub_outcomes"]["price"] == 0.0
  assert result.info["sub_outcomes"]["attributes_matched"] == pytest.approx(0.8)


def test_buying_without_a_size_misses_the_size():
  env = webshop_lite.WebShopLite()
  env.reset(1)
  env.step(env.expert_action())  # search
  env.step(env.expert_action())  # click the target
  result = env.step("buy")
  assert result.reward == pytest.approx(4 / 5) and result.info["sub_outcomes"]["size"] == 0.0


def test_back_navigates_between_pages():
  env = webshop_lite.WebShopLite()
  env.reset(2)
  env.step("search[anything red]")
  assert env.page == "results"
  pid = env.available_actions()[0][len("click["):-1]
  env.step(f"click[{pid}]")
  assert env.page == "product"
  env.step("back")
  assert env.page == "results"
  env.step("back")
  assert env.page == "search"


def test_expert_succeeds():
  env = webshop_lite.WebShopLite()
  assert sum(_expert_episode(env, s).info["success"] for s in range(100)) >= 95


def test_random_policy_rarely_succeeds():
  env = webshop_lite.WebShopLite()
  rng = random.Random(0)
  rate = sum(_random_episode(env, s, rng).info["success"] for s in range(300)) / 300
  assert rate <= RANDOM_SUCCESS_BOUND


def test_step_cap_ends_without_purchase():
  env = webshop_lite.WebShopLite(max_turns=3)
  env.reset(0)
  env.step("search[red]")
  env.step("back")
  result = env.step("search[blue]")
  assert result.done and result.reward == 0.0 and not result.info["success"]
  assert result.info["sub_outcomes"]["purchased"] == 0.0


def test_same_seed_same_episode():
  actions = ["search[red cotton shirt]", "click[P1]", "back", "search[blue wool]", "buy"]

  def play(seed):
    env = webshop_lite.WebShopLite()
    trace = [env.reset(seed)]
    trace += [env.step(a) for a in actions]
    return trace

  assert play(4) == play(4)
  assert play(4)[0] != play(5)[0]


@pytest.mark.parametrize("action, fragment", [
    ("", "empty action"),
    (None, "action of type NoneType"),
    ("x" * 5000, "longer than 200"),
    ("purchase it", "cannot parse 'purchase it'"),
    ("search[red", "cannot parse"),
    ("search[  ]", "empty search query"),
    ("click[P1]", "click is only possible on a results page"),
    ("buy", "buy is only possible on a product page"),
    ("back", "already on the search page"),
])
def test_malformed_actions_get_a_clear_observation(action, fragment):
  env = webshop_lite.WebShopLite()
  env.reset(0)
  result = env.step(action)
  assert fragment in result.observation
  assert result.info["action_valid"] is False and not result.done and result.reward == 0.0
  assert len(result.observation) < 300


def test_unknown_product_and_size_are_invalid():
  env = webshop_lite.WebShopLite()
  env.reset(0)
  env.step(env.expert_action())
  result = env.step("click[P0]")
  assert "no product 'P0' on this page" in result.observation
  env.step(env.expert_action())
  result = env.step("select[XXXL]")
  assert "size 'XXXL' is not offered" in result.observation
  assert not result.info["action_valid"]


def test_noisy_demonstrations_draw_valid_actions_and_the_expert_still_buys_the_target():
  env = webshop_lite.WebShopLite(max_turns=30)
  assert episodes.noisy_expert_wins(env, range(20)) >= 10  # the noise drew other actions
  # The search page's noise searches other titles; it never buys.
  rng = np.random.default_rng(1)
  env.reset(3)
  queries = {env.random_action(rng) for _ in range(20)}
  assert len(queries) > 5 and all(q.startswith("search[") for q in queries)
  env.step(env.expert_action())
  env.step(env.expert_action())  # on the target's page: select, buy or back
  assert "buy" not in {env.random_action(rng) for _ in range(50)}
  warm_start.check_noise(configs.WarmStartConfig(iterations=1, expert_noise=0.3),
                         lambda: webshop_lite.WebShopLite())
