"""Multi-hop question answering over a synthetic local corpus with a BM25 search tool.

The corpus (`build_corpus(corpus_seed)`) describes made-up people, companies, cities and countries,
one short document per entity: a person is born in a city and works for a company, a company is
headquartered in a city, a city lies in a country. Names are synthetic, so no answer can come from
prior knowledge: it has to be looked up. Questions chain two or three of these relations, e.g.

    question: In which country was Velo Durmak born?          (person -> city -> country)

Actions (one per turn):
  * `search[query]` shows the `top_k` documents BM25 ranks highest for the query;
  * `answer[text]` ends the episode; reward 1 when `text` equals the gold answer after SQuAD
    normalisation (lowercase, no punctuation, no articles, single spaces), else 0.

`info` per step: `action_valid`, `search_turn` (this turn was a valid search); last step:
`success` and `sub_outcomes = {"evidence_found": a document shown during the episode contains the
normalised gold answer, "answer_correct": the answer matched}`.

Search uses the `bm25s` package (an `envs` extra); the index over the ~250 documents of a corpus
is built once per process and corpus seed.
"""

from __future__ import annotations

import functools
import re
import string
from typing import Any

import numpy as np

from agentrl_jax.envs import base
from agentrl_jax.envs import registry

ACTION_HELP = "use search[query] or answer[text]"
_ACTION = re.compile(r"^\s*(search|answer)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_MAX_QUERY_CHARS = 200
_MAX_QUOTED_CHARS = 24

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr",
           "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "", "n", "r", "l", "s", "k", "m")
_COMPANY_SUFFIXES = ("Labs", "Works", "Systems", "Foods", "Motors", "Textiles")
_JOBS = ("engineer", "teacher", "chemist", "pilot", "designer", "lawyer", "baker", "nurse")

# Question kinds: the relation chain and its wording; {0} is the starting entity.
QUESTION_KINDS = {
    "person_employer_city": "In which city is the company that {0} works for headquartered?",
    "person_birth_country": "In which country was {0} born?",
    "company_country": "In which country is {0} headquartered?",
    "person_employer_country": "In which country is the company that {0} works for "
                               "headquartered?",
}


def _name(rng: np.random.Generator, syllables: int) -> str:
  parts = []
  for _ in range(syllables):
    parts.append(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))] +
                 _CODAS[rng.integers(len(_CODAS))])
  return "".join(parts).capitalize()


def _unique_names(rng: np.random.Generator, count: int, make, taken: set[str]) -> list[str]:
  names = []
  while len(names) < count:
    name = make()
    # Every word of a name must be new: BM25 matches words, and a word shared by two entities
    # would make a name query ambiguous.
    words = set(name.lower().split()) - {s.lower() for s in _COMPANY_SUFFIXES}
    if name in taken or words & taken:
      continue
    taken.add(name)
    taken.update(words)
    names.append(name)
  return names


# Sized for training over many corpora (`num_corpora`): a corpus and its index take under a
# second to build, once per process.
@functools.lru_cache(maxsize=64)
def build_corpus(corpus_seed: int = 0, num_people: int = 150, num_companies: int = 40,
                 num_cities: int = 30, num_countries: int = 10) -> dict[str, Any]:
  """The synthetic world and its documents, a deterministic function of the arguments.

  Returns:
    A dict with `titles` and `texts` (one document per entity, aligned lists) and the relations
    `employer`, `birth_city` (person -> ...), `hq_city` (company -> city), `country` (city ->
    country).
  """
  rng = np.random.default_rng([corpus_seed, 7])
  taken: set[str] = set()
  countries = _unique_names(rng, num_countries, lambda: _name(rng, 2) + "ia", taken)
  cities = _unique_names(rng, num_cities, lambda: _name(rng, 2), taken)
  companies = _unique_names(
      rng, num_companies,
      lambda: f"{_name(rng, 2)} {_COMPANY_SUFFIXES[rng.integers(len(_COMPANY_SUFFIXES))]}", taken)
  people = _unique_names(rng, num_people, lambda: f"{_name(rng, 2)} {_name(rng, 2)}", taken)
  country = {c: countries[rng.integers(num_countries)] for c in cities}
  hq_city = {c: cities[rng.integers(num_cities)] for c in companies}
  birth_city = {p: cities[rng.integers(num_cities)] for p in people}
  employer = {p: companies[rng.integers(num_companies)] for p in people}
  titles, texts = [], []
  for p in people:
    job = _JOBS[rng.integers(len(_JOBS))]
    titles.append(p)
    texts.append(f"{p} is a {job} who was born in {birth_city[p]}. {p} works for {employer[p]}.")
  for c in companies:
    titles.append(c)
    texts.append(f"{c} is a company headquartered in {hq_city[c]}, founded in "
                 f"{int(rng.integers(1950, 2020))}.")
  for c in cities:
    titles.append(c)
    texts.append(f"{c} is a city in {country[c]} with about {int(rng.integers(20, 900))} "
                 "thousand inhabitants.")
  for c in countries:
    capital = next((x for x in cities if country[x] == c), None)
    texts.append(f"{c} is a country" + (f" whose largest city is {capital}." if capital else "."))
    titles.append(c)
  return {"titles": titles, "texts": texts, "employer": employer, "birth_city": birth_city,
          "hq_city": hq_city, "country": country, "people": people, "companies": companies}


def make_task(seed: int, corpus_seed: int = 0) -> dict[str, Any]:
  """The question of episode `seed`: kind, question, answer, the entities to look up (`hops`)
  and the expert's search query for each (`queries`)."""
  world = build_corpus(corpus_seed)
  rng = np.random.default_rng([seed, 3])
  kinds = list(QUESTION_KINDS)
  kind = kinds[int(rng.integers(len(kinds)))]
  if kind == "company_country":
    start = world["companies"][int(rng.integers(len(world["companies"])))]
    city = world["hq_city"][start]
    hops, answer = [start, city], world["country"][city]
  else:
    start = world["people"][int(rng.integers(len(world["people"])))]
    if kind == "person_birth_country":
      city = world["birth_city"][start]
      hops, answer = [start, city], world["country"][city]
    else:
      company = world["employer"][start]
      city = world["hq_city"][company]
      if kind == "person_employer_city":
        hops, answer = [start, company], city
      else:
        hops, answer = [start, company, city], world["country"][city]
  # The expert's query per hop: the entity's name plus the word of the relation it needs, so the
  # entity's own document outranks the many that merely mention a popular city or company.
  world_words = {**{c: "headquartered" for c in world["companies"]},
                 **{c: "city" for c in world["country"]}}
  queries = [f"{h} {world_words[h]}" if h in world_words else h for h in hops]
  return {"corpus_seed": corpus_seed, "kind": kind, "question": QUESTION_KINDS[kind].format(start),
          "answer": answer, "hops": hops, "queries": queries}


def normalize_answer(text: str) -> str:
  """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in set(string.punctuation))
  text = re.sub(r"\b(a|an|the)\b", " ", text)
  return " ".join(text.split())


class _Index:
  """BM25 over one corpus (bm25s), with English stopwords removed."""

  def __init__(self, texts: list[str]):
    import bm25s  # pylint: disable=g-import-not-at-top  # An `envs` extra, loaded on first use.
    self._bm25s = bm25s
    self._retriever = bm25s.BM25()
    self._retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                          show_progress=False)
    self._size = len(texts)

  def search(self, query: str, k: int) -> list[int]:
    tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
    if not tokens.vocab:  # Only stopwords or punctuation: nothing to rank by.
      return []
    docs, scores = self._retriever.retrieve(tokens, k=min(k, self._size), show_progress=False)
    return [int(d) for d, s in zip(docs[0], scores[0]) if s > 0]


@functools.lru_cache(maxsize=64)
def _index(corpus_seed: int) -> _Index:
  return _Index(build_corpus(corpus_seed)["texts"])


@registry.register("search_qa", requires=(registry.Requirement(module="bm25s"),))
class SearchQA(base.TextEnv):
  """Answer a multi-hop question by searching a local corpus, then answering.

  Tasks come from `make_task(seed, corpus_seed)` (default) or, with `data_dir`, from a built TFDS
  task set (`tasksets/search_qa_tasks.py`): `reset(seed)` takes record `seed % len`.
  """

  action_words = None

  def __init__(self, max_turns: int = 6, top_k: int = 3, corpus_seed: int = 0,
               num_corpora: int = 1, data_dir: str | None = None,
               taskset: str = "agentrl_search_qa_tasks", split: str = "train"):
    """Builds the env.

    Args:
      max_turns: step cap (searches plus the answer).
      top_k: documents shown per search.
      corpus_seed: which synthetic corpus (tasks from a task set carry their own).
      num_corpora: episode `seed` asks about corpus `corpus_seed + seed % num_corpora`. One
        corpus has about 490 distinct questions, which a policy can learn by heart; training
        over several and evaluating on others (a `corpus_seed` past the training ones) measures
        searching and reading instead.
      data_dir: read tasks from a built TFDS task set here instead of generating them.
      taskset: the task set's TFDS name, with a config after a slash.
      split: the TFDS split when `data_dir` is set.
    """
    super().__init__(max_turns)
    if not base.is_int(top_k) or not 1 <= top_k <= 10:
      raise ValueError(f"top_k must be an int in [1, 10], got {top_k!r}")
    if not base.is_int(corpus_seed) or corpus_seed < 0:
      raise ValueError(f"corpus_seed must be a non-negative int, got {corpus_seed!r}")
    if not base.is_int(num_corpora) or num_corpora < 1:
      raise ValueError(f"num_corpora must be a positive int, got {num_corpora!r}")
    if num_corpora > 1 and data_dir is not None:
      raise ValueError("num_corpora applies to generated tasks; a task set's records carry their "
                       f"own corpus (got num_corpora={num_corpora} with data_dir={data_dir!r})")
    self.top_k = top_k
    self.corpus_seed = corpus_seed
    self.num_corpora = num_corpora
    self._source = None
    if data_dir is not None:
      # Imported here: TFDS is an optional dependency the generator path never needs.
      # pylint: disable-next=g-import-not-at-top
      from agentrl_jax.envs.tasksets import common
      self._source = common.TaskSource(taskset, data_dir, split)
    self.task: dict[str, Any] = {}
    self._evidence = False
    self._searched: list[str] = []

  @property
  def instructions(self) -> str:
    """The task and the exact action syntax, for a chat model's system message."""
    return ("Answer the question by searching a collection of documents about made-up people, "
            "companies, cities and countries; the answer is never common knowledge. Each turn, "
            f"reply with exactly one action and nothing else: search[query] shows the top "
            f"{self.top_k} documents for the query; answer[text] gives your final answer and "
            f"ends the episode. You have at most {self.max_turns} turns.")

  def _reset(self, seed: int) -> str:
    if self._source:
      self.task = self._source.task(seed)
    else:
      self.task = make_task(seed, self.corpus_seed + seed % self.num_corpora)
    self._evidence = False
    self._searched = []
    return (f"question: {self.task['question']}\n"
            f"search[query] shows the top {self.top_k} documents; answer[text] ends the episode; "
            f"at most {self.max_turns} turns")

  def expert_action(self) -> str:
    """Searches each entity of the chain (name + relation word), in order, then answers."""
    pending = [q for q in self.task["queries"] if q not in self._searched]
    if pending:
      return f"search[{pending[0]}]"
    return f"answer[{self.task['answer']}]"

  def _step(self, action: Any) -> base.StepResult:
    parsed = self._parse(action)
    if isinstance(parsed, str):
      return self._result(parsed, 0.0, False, {"action_valid": False, "search_turn": False})
    verb, argument = parsed
    if verb == "search":
      self._searched.append(argument)
      return self._result(self._search(argument), 0.0, False,
                          {"action_valid": True, "search_turn": True})
    correct = normalize_answer(argument) == normalize_answer(self.task["answer"])
    info = {"action_valid": True, "search_turn": False, "success": correct,
            "sub_outcomes": self._sub_outcomes(correct)}
    return base.StepResult("correct" if correct else "wrong answer", float(correct), True, info)

  def _on_step_cap(self, result: base.StepResult) -> base.StepResult:
    info = dict(result.info, success=False, sub_outcomes=self._sub_outcomes(False))
    return result._replace(observation=f"{result.observation}\nout of turns, no answer",
                           done=True, info=info)

  def _sub_outcomes(self, correct: bool) -> dict[str, float]:
    return {"evidence_found": float(self._evidence), "answer_correct": float(correct)}

  def _result(self, text: str, reward: float, done: bool, info: dict[str, Any]) -> base.StepResult:
    # No turn counter in the text: equal results at different turns are the same state for
    # observation-hash grouping (GiGPO anchors); the cap is stated in the first observation.
    return base.StepResult(text, reward, done, info)

  def _search(self, query: str) -> str:
    corpus = build_corpus(self.task["corpus_seed"])
    hits = _index(self.task["corpus_seed"]).search(query, self.top_k)
    if not hits:
      return f"no documents match '{_quote(query)}'"
    answer = normalize_answer(self.task["answer"])
    lines = [f"results for '{_quote(query)}':"]
    for rank, doc in enumerate(hits, 1):
      text = corpus["texts"][doc]
      if re.search(rf"\b{re.escape(answer)}\b", normalize_answer(text)):
        self._evidence = True
      lines.append(f"[{rank}] {text}")
    return "\n".join(lines)

  def _parse(self, action: Any) -> tuple[str, str] | str:
    """(verb, argument) of a well-formed action, else the feedback naming the problem."""
    if not isinstance(action, str):
      return f"invalid action of type {type(action).__name__}: {ACTION_HELP}"
    if not action.strip():
      return f"empty action: {ACTION_HELP}"
    match = _ACTION.match(action)
    if match is None:
      return f"invalid action '{_quote(action)}': {ACTION_HELP}"
    verb, argument = match.group(1).lower(), " ".join(match.group(2).split())
    if not argument:
      return f"empty {verb}[]: put the {'query' if verb == 'search' else 'answer'} in the brackets"
    if len(argument) > _MAX_QUERY_CHARS:
      return f"{verb} text too long ({len(argument)} characters, limit {_MAX_QUERY_CHARS})"
    return verb, argument


def _quote(text: str) -> str:
  return base.quote_action(text, _MAX_QUOTED_CHARS)
