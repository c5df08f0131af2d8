"""WebShop-lite: search a generated catalogue, pick a product and its size, and buy it.

Each reset seed draws a catalogue of products (category, color, material, price, available
sizes) and an instruction built from one target product, e.g. "buy a red cotton shirt under
$30, size M". The catalogue always holds near misses (same title but over budget or without
the size, same category in another color or material), so reading the results matters.

Pages and actions (WebShop's text mode, simplified):
  search page:   search[<query>]
  results page:  click[<product id>], back
  product page:  select[<size>], buy, back

`buy` ends the episode. The reward is the fraction of the instruction's required attributes
(category, color, material, price within budget, size) that the bought item matches, as
WebShop scores a purchase; success means all of them match (reward 1).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

CATEGORIES = ("shirt", "jacket", "dress", "hoodie", "skirt", "scarf", "sweater", "jeans")
COLORS = ("red", "blue", "green", "black", "white", "grey", "yellow", "pink")
MATERIALS = ("cotton", "wool", "silk", "linen", "denim", "leather")
SIZES = ("XS", "S", "M", "L", "XL")
ATTRIBUTES = ("category", "color", "material", "price", "size")
MAX_ACTION_CHARS = 200
# Results shown per search; the ranking puts every product whose title matches all query words
# first, and a catalogue never holds more than this many with the target's title.
RESULTS_PER_PAGE = 6
_QUOTE_CHARS = 16
_ACTION = re.compile(r"^(search|click|select)\s*\[(.*)\]$|^(buy|back)$", re.IGNORECASE)


class Product:
  """One catalogue item."""

  __slots__ = ("pid", "category", "color", "material", "price", "sizes")

  def __init__(self, pid: str, category: str, color: str, material: str, price: float,
               sizes: tuple[str, ...]):
    self.pid, self.category, self.color, self.material = pid, category, color, material
    self.price, self.sizes = price, sizes

  @property
  def title(self) -> str:
    return f"{self.color} {self.material} {self.category}"

  def __repr__(self) -> str:
    return f"Product({self.pid}, {self.title}, ${self.price:.2f}, {'/'.join(self.sizes)})"


class Goal:
  """The instruction's required attributes."""

  __slots__ = ("category", "color", "material", "max_price", "size")

  def __init__(self, category: str, color: str, material: str, max_price: int, size: str):
    self.category, self.color, self.material = category, color, material
    self.max_price, self.size = max_price, size

  @property
  def text(self) -> str:
    return (f"buy a {self.color} {self.material} {self.category} under ${self.max_price}, "
            f"size {self.size}")

  def matches(self, product: Product, size: str | None) -> dict[str, bool]:
    """Attribute → whether the purchase (`product` with `size` selected) satisfies it."""
    return {"category": product.category == self.category, "color": product.color == self.color,
            "material": product.material == self.material,
            "price": product.price <= self.max_price, "size": size == self.size}


def generate(seed: int, num_products: int = 40) -> tuple[list[Product], Goal, str]:
  """Draws a catalogue, an instruction and the id of a product that fully satisfies it."""
  rng = np.random.default_rng(seed)
  pick = lambda options: str(options[int(rng.integers(len(options)))])
  goal = Goal(pick(CATEGORIES), pick(COLORS), pick(MATERIALS), int(rng.integers(2, 10)) * 10,
              pick(SIZES))
  specs = []  # (category, color, material, price, sizes)

  def sizes_with(size: str | None, without: str | None = None) -> tuple[str, ...]:
    chosen = {s for s in SIZES if rng.random() < 0.5 and s != without}
    if size is not None:
      chosen.add(size)
    chosen = chosen or {s for s in SIZES if s != without}
    return tuple(s for s in SIZES if s in chosen)

  cheap = lambda: round(float(rng.uniform(0.4, 0.95)) * goal.max_price, 2)
  dear = lambda: round(float(rng.uniform(1.05, 1.8)) * goal.max_price, 2)
  title = (goal.category, goal.color, goal.material)
  specs.append((*title, cheap(), sizes_with(goal.size)))  # The target.
  specs.append((*title, dear(), sizes_with(goal.size)))  # Over budget.
  specs.append((*title, cheap(), sizes_with(None, without=goal.size)))  # Lacks the size.
  specs.append((goal.category, _other(rng, COLORS, goal.color), goal.material, cheap(),
                sizes_with(goal.size)))
  specs.append((goal.category, goal.color, _other(rng, MATERIALS, goal.material), cheap(),
                sizes_with(goal.size)))
  while len(specs) < num_products:
    spec = (pick(CATEGORIES), pick(COLORS), pick(MATERIALS))
    if spec == title:
      continue  # Keeps the number of same-title products within one results page.
    specs.append((*spec, round(float(rng.uniform(5, 150)), 2), sizes_with(None)))
  order = rng.permutation(len(specs))
  ids = rng.choice(np.arange(100, 1000), size=len(specs), replace=False)
  products = [Product(f"P{ids[i]}", *specs[j]) for i, j in enumerate(order)]
  target = products[int(np.flatnonzero(order == 0)[0])].pid
  return products, goal, target


def _other(rng: np.random.Generator, options: tuple[str, ...], exclude: str) -> str:
  rest = [o for o in options if o != exclude]
  return rest[int(rng.integers(len(rest)))]


def rank(products: list[Product], query: str) -> list[Product]:
  """Products by the number of query words in their title (ties: catalogue order)."""
  words = set(re.findall(r"[a-z]+", query.lower()))
  scored = [(len(words & set(p.title.split())), i, p) for i, p in enumerate(products)]
  scored = [s for s in scored if s[0] > 0]
  scored.sort(key=lambda s: (-s[0], s[1]))
  return [p for _, _, p in scored]


@registry.register("webshop_lite")
class WebShopLite(base.TextEnv):
  """Product search and purchase with an attribute-matching reward (module docstring).

  Final info: `success` (reward 1), `sub_outcomes = {"attributes_matched": fraction,
  "purchased": 0/1, <attribute>: 0/1 ...}`.
  """

  def __init__(self, max_turns: int = 10, num_products: int = 40):
    """Builds the env.

    Args:
      max_turns: step cap, >= 1.
      num_products: catalogue size, >= 5 (the target and its four near misses).
    """
    if not base.is_int(num_products) or num_products < 5:
      raise ValueError(f"num_products must be an int >= 5, got {num_products!r}")
    super().__init__(max_turns=max_turns)
    self.num_products = num_products
    self.products: list[Product] = []
    self.goal: Goal | None = None
    self.target = ""
    self._page = "search"
    self._results: list[Product] = []
    self._product: Product | None = None
    self._size: str | None = None

  @property
  def page(self) -> str:
    """"search", "results" or "product"."""
    return self._page

  def available_actions(self) -> list[str]:
    """Concrete actions of the current page (search lists a template)."""
    if self._page == "search":
      return ["search[<query>]"]
    if self._page == "results":
      return [f"click[{p.pid}]" for p in self._results] + ["back"]
    return [f"select[{s}]" for s in self._product.sizes] + ["buy", "back"]

  @property
  def has_random_actions(self) -> bool:
    return True  # every page lists its actions; the search page's query is drawn from titles

  def random_action(self, rng: np.random.Generator) -> str | None:
    """A uniformly random action of the current page other than `buy`, which would end the
    episode with nothing left to recover from; on the search page a search for a random title
    (color, material, category), so the results usually lack the target."""
    if self._page == "search":
      words = (str(rng.choice(COLORS)), str(rng.choice(MATERIALS)), str(rng.choice(CATEGORIES)))
      return f"search[{' '.join(words)}]"
    return str(rng.choice([a for a in self.available_actions() if a != "buy"]))

  def expert_action(self) -> str:
    """Search the goal's words, open the target, select the size, buy."""
    goal = self.goal
    if self._page == "search":
      return f"search[{goal.color} {goal.material} {goal.category}]"
    if self._page == "results":
      if any(p.pid == self.target for p in self._results):
        return f"click[{self.target}]"
      return "back"
    if self._product.pid != self.target:
      return "back"
    if self._size != goal.size:
      return f"select[{goal.size}]"
    return "buy"

  def _reset(self, seed: int) -> str:
    self.products, self.goal, self.target = generate(seed, self.num_products)
    self._page, self._results, self._product, self._size = "search", [], None, None
    return f"instruction: {self.goal.text}\n{self._render()}"

  def _step(self, action: Any) -> base.StepResult:
    parsed = _parse(action)
    if isinstance(parsed, str):
      return self._invalid(parsed)
    verb, arg = parsed
    if verb == "search":
      if self._page != "search":
        return self._invalid("search is only possible on the search page (use back)")
      if not arg:
        return self._invalid("empty search query")
      self._results = rank(self.products, arg)[:RESULTS_PER_PAGE]
      self._page = "results"
    elif verb == "click":
      if self._page != "results":
        return self._invalid("click is only possible on a results page")
      found = [p for p in self._results if p.pid.lower() == arg.lower()]
      if not found:
        return self._invalid(f"no product '{_quote(arg)}' on this page")
      self._product, self._size, self._page = found[0], None, "product"
    elif verb == "select":
      if self._page != "product":
        return self._invalid("select is only possible on a product page")
      size = {s.lower(): s for s in self._product.sizes}.get(arg.lower())
      if size is None:
        return self._invalid(f"size '{_quote(arg)}' is not offered; options: "
                             f"{', '.join(self._product.sizes)}")
      self._size = size
    elif verb == "back":
      if self._page == "search":
        return self._invalid("already on the search page")
      self._page = "results" if self._page == "product" else "search"
    else:  # buy
      if self._page != "product":
        return self._invalid("buy is only possible on a product page")
      return self._purchase()
    return base.StepResult(self._render(), 0.0, False, {"action_valid": True})

  def _purchase(self) -> base.StepResult:
    matched = self.goal.matches(self._product, self._size)
    reward = sum(matched.values()) / len(matched)
    sub_outcomes = {"attributes_matched": reward, "purchased": 1.0}
    sub_outcomes.update({k: float(v) for k, v in matched.items()})
    info = {"action_valid": True, "success": reward == 1.0, "sub_outcomes": sub_outcomes}
    observation = (f"bought {self._product.title} ({self._product.pid}), size "
                   f"{self._size or 'none'}: {sum(matched.values())}/{len(matched)} "
                   "attributes match")
    return base.StepResult(observation, reward, True, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    sub_outcomes = {"attributes_matched": 0.0, "purchased": 0.0}
    sub_outcomes.update({k: 0.0 for k in ATTRIBUTES})
    info = dict(result.info, success=False, sub_outcomes=sub_outcomes)
    return result._replace(done=True, info=info,
                           observation=result.observation + "\nstep limit reached, nothing bought")

  def _invalid(self, problem: str) -> base.StepResult:
    return base.StepResult(f"invalid action: {problem}\n{self._render()}", 0.0, False,
                           {"action_valid": False})

  def _render(self) -> str:
    if self._page == "search":
      return "[search page] actions: search[query]"
    if self._page == "results":
      lines = [f"{p.pid} {p.title} ${p.price:.2f}" for p in self._results] or ["no results"]
      return "[results]\n" + "\n".join(lines) + "\nactions: click[id], back"
    p = self._product
    chosen = f", selected {self._size}" if self._size else ""
    return (f"[product {p.pid}] {p.title} ${p.price:.2f}; sizes {' '.join(p.sizes)}{chosen}\n"
            "actions: select[size], buy, back")


def _parse(action: Any) -> tuple[str, str] | str:
  """(verb, argument) of a well-formed action, else a message naming the problem."""
  usage = "use search[query], click[id], select[size], buy or back"
  problem = base.text_action_problem(action, MAX_ACTION_CHARS)
  if problem:
    return f"{problem}; {usage}"
  text = action.strip()
  match = _ACTION.match(text)
  if match is None:
    return f"cannot parse '{_quote(text)}'; {usage}"
  if match.group(1):
    return match.group(1).lower(), match.group(2).strip()
  return match.group(3).lower(), ""


def _quote(text: str) -> str:
  return base.quote_action(text, _QUOTE_CHARS)
