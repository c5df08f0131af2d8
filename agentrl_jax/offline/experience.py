"""SLEA-RL: a step-level experience library injected into observations (docs/methods.md#slea-rl).

Three parts, all host-side:
  * observation clustering: `structural_key` maps an observation to the key of its structural
    class (entity names, numbers and quoted text become placeholders; FrozenLake uses the
    player's neighbourhood), so structurally equivalent states share library entries;
  * `ExperienceLibrary`: entries `(key, kind ∈ {strategy, failure}, text, score)`, filled after
    each batch of episodes by an extractor (rule-based here; any callable, e.g. an LLM), with
    score `|Â|·(1 + n_key)^(−1/2)`, admission `score ≥ θ_adm`, at most `E_step` admissions per
    update, `E_key` entries per key and `max_entries` in all (lowest scores evicted), and
    near-duplicates (cosine ≥ 0.9) merged;
  * `ExperienceEnv`, registered as env "slea": wraps any registered env and appends the top
    entries for the current observation's key as an "experience:" block at every step. The block
    is observation text, so the rollout loop gives it `action_mask = 0` — it never carries loss —
    and the online learner runs unchanged:

      configs.TrainConfig.env_name = 'slea'
      configs.TrainConfig.env_kwargs = {'env': 'frozenlake', 'env_kwargs': {...},
                                        'library': 'run0', 'episodes_per_update': 128}

Envs built with the same `library` name share one library (`library(name)`), so all episodes of
a batch feed it. Episodes on held-out seeds (>= `read_only_from_seed`, the evaluation seeds) read
the library but never write to it. The extraction's advantage is GRPO's: an episode's return
normalised among the buffered episodes of the same seed.

Two learner-side pieces go in the reward-shaper stage (`learner.train.reward_shapers`):
  * `LibraryCheckpoint(library=name)` changes no reward; it carries the named library (entries,
    buffered episodes, update count) through the run's checkpoint, so a resumed run continues
    with the library it stopped with;
  * `use_state_key_as_obs_hash` makes GiGPO/GAGPO group steps by cluster key (SLEA-RL's key-grouped
    step advantages): the wrapper reports each step's cluster ids in `info['state_key']` (the
    state after the action) and `info['anchor_state_key']` (the state it acted from), which the
    rollout loop records as `traj.extras`, and the shaper substitutes them for the raw
    observation hashes the estimators group on.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import zlib
from typing import Any, Callable, NamedTuple, Sequence

import jax.numpy as jnp
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import group
from agentrl_jax.envs import base as envs_base
from agentrl_jax.envs import registry

STRATEGY, FAILURE = "strategy", "failure"

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_NAME = re.compile(r"\b[A-Z][a-z]+\b")
_EXPERIENCE = "\nexperience:"

# The loop stores numeric info as float32, exact for integers below 2**24.
_KEY_ID_BITS = 24


def structural_key(observation: str) -> str:
  """κ(o): the observation with entity names, numbers and quoted text replaced by placeholders.

  Every capitalised word is taken as an entity name; a template's own capitalised words then
  become the same placeholder in every observation of that template, so keys still agree.
  """
  text = _QUOTED.sub("<str>", observation)
  text = _NUMBER.sub("<num>", text)
  text = _NAME.sub("<name>", text)
  return envs_base.normalize_observation(text)


def frozenlake_key(observation: str) -> str:
  """FrozenLake's structural class: what lies left, down, right and up of the player ('#' = wall).

  Boards that differ elsewhere are equivalent for the next move.
  """
  rows = [line.split() for line in observation.splitlines()
          if line.split() and set(line.split()) <= set("PFHG")]

  def cell(i: int, j: int) -> str:
    return rows[i][j] if 0 <= i < len(rows) and 0 <= j < len(rows[i]) else "#"

  for r, row in enumerate(rows):
    if "P" in row:
      c = row.index("P")
      return (f"frozenlake left {cell(r, c - 1)} down {cell(r + 1, c)} right {cell(r, c + 1)} "
              f"up {cell(r - 1, c)}")
  return structural_key(observation)


KEY_FUNCTIONS: dict[str, Callable[[str], str]] = {"frozenlake": frozenlake_key}


def key_id(key: str) -> int:
  """c = hash(κ(o)) as an int in [0, 2**24): CRC-32 (stable across processes), low 24 bits.

  24 bits because the rollout loop records info values as float32, which holds integers exactly
  only up to 2**24. Two keys collide with probability about n²/2**25 for n distinct keys within
  one group (n = 100: 3e-4); a collision only merges two step groups.
  """
  return zlib.crc32(key.encode("utf-8")) & ((1 << _KEY_ID_BITS) - 1)


def _bag(text: str) -> collections.Counter:
  words = text.lower().split()
  return collections.Counter(words + [f"{x} {y}" for x, y in zip(words, words[1:])])


def cosine(a: str, b: str) -> float:
  """Cosine similarity of two texts' word and word-pair counts (pairs keep some word order)."""
  x, y = _bag(a), _bag(b)
  dot = sum(x[w] * y[w] for w in x)
  norm = math.sqrt(sum(v * v for v in x.values()) * sum(v * v for v in y.values()))
  return dot / norm if norm else 0.0


@dataclasses.dataclass
class Entry:
  key: str
  kind: str
  text: str
  score: float
  step_added: int


class StepView(NamedTuple):
  """One step of a finished episode, as the extractor sees it."""

  key: str
  observation: str
  action: str
  action_valid: bool
  next_observation: str
  done: bool


class Episode(NamedTuple):
  seed: int
  steps: tuple[StepView, ...]
  ret: float
  success: bool


class Candidate(NamedTuple):
  key: str
  kind: str
  text: str


Extractor = Callable[[Episode], list[Candidate]]


def rule_based_extractor(episode: Episode) -> list[Candidate]:
  """Strategies from successful episodes (each step's action at its key); failure patterns from
  failed ones (invalid actions, actions that left the observation unchanged, the final action)."""
  out = []
  for i, step in enumerate(episode.steps):
    if episode.success:
      out.append(Candidate(step.key, STRATEGY, f"tip: {step.action.strip()}"))
      continue
    stuck = envs_base.normalize_observation(step.observation) == envs_base.normalize_observation(
        step.next_observation)
    last = i == len(episode.steps) - 1 and step.done
    if not step.action_valid or stuck or last:
      out.append(Candidate(step.key, FAILURE, f"avoid: {step.action.strip()}"))
  return out


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LibraryConfig:
  """Retrieval and maintenance of the library (SLEA-RL defaults).

  Attributes:
    num_retrieved: n_r, entries shown per step.
    admission_threshold: θ_adm.
    max_admissions_per_update: E_step.
    max_per_key: E_key.
    max_entries: total cap (lowest scores evicted).
    dedup_similarity: cosine at or above which a candidate merges into an existing entry.
    backoff_similarity: minimum key cosine for retrieving from a neighbouring key.
    episodes_per_update: extraction runs once this many episodes are buffered.
  """

  num_retrieved: int = 3
  admission_threshold: float = 0.5
  max_admissions_per_update: int = 8
  max_per_key: int = 5
  max_entries: int = 512
  dedup_similarity: float = 0.9
  backoff_similarity: float = 0.8
  episodes_per_update: int = 128

  def __post_init__(self):
    config_errors.check_field_types(self)
    for name in ("num_retrieved", "max_admissions_per_update", "max_per_key", "max_entries",
                 "episodes_per_update"):
      if getattr(self, name) < 1:
        raise ValueError(f"LibraryConfig.{name} must be >= 1, got {getattr(self, name)}")
    for name in ("dedup_similarity", "backoff_similarity"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(f"LibraryConfig.{name} must be in [0, 1], got {getattr(self, name)}")


def group_advantages(returns: Sequence[float], seeds: Sequence[int], eps: float = 1e-6) -> np.ndarray:
  """GRPO advantages of episode returns within their seed's group (the library's
  `group.group_relative_advantages`: minus the group mean, over the unbiased std); 0 for a seed
  played once, which has no group to be compared with."""
  _, ids, counts = np.unique(np.asarray(seeds), return_inverse=True, return_counts=True)
  advantages = group.group_relative_advantages(
      jnp.asarray(returns, jnp.float32), jnp.asarray(ids, jnp.int32), num_groups=len(counts),
      eps=eps)
  return np.where(counts[ids] > 1, np.asarray(advantages, np.float64), 0.0)


class ExperienceLibrary:
  """The self-evolving library: retrieval by key, extraction from buffered episodes."""

  def __init__(self, config: LibraryConfig = LibraryConfig(), extractor: Extractor | None = None):
    self.config = config
    self.extractor = extractor or rule_based_extractor
    self.entries: list[Entry] = []
    self.pending: list[Episode] = []
    self.updates = 0

  def __len__(self) -> int:
    return len(self.entries)

  def keys(self) -> set[str]:
    return {e.key for e in self.entries}

  def retrieve(self, key: str) -> list[Entry]:
    """Top-`n_r` entries of `key` by score; fewer than `n_r` backs off to the most similar keys."""
    n = self.config.num_retrieved
    found = sorted((e for e in self.entries if e.key == key), key=lambda e: -e.score)[:n]
    if len(found) < n:
      # Ties broken by the key itself, not set order (salted per process): a resumed run must
      # retrieve what the uninterrupted one would.
      others = sorted({e.key for e in self.entries} - {key}, key=lambda k: (-cosine(k, key), k))
      for other in others:
        if cosine(other, key) < self.config.backoff_similarity or len(found) >= n:
          break
        found += sorted((e for e in self.entries if e.key == other), key=lambda e: -e.score
                        )[:n - len(found)]
    return found

  def observe(self, episode: Episode) -> int:
    """Buffers a finished episode; runs an extraction when the buffer is full. Returns admissions."""
    self.pending.append(episode)
    if len(self.pending) < self.config.episodes_per_update:
      return 0
    episodes, self.pending = self.pending, []
    return self.update(episodes)

  def update(self, episodes: Sequence[Episode]) -> int:
    """One extraction step: score candidates, admit at most E_step, keep E_key per key."""
    cfg = self.config
    self.updates += 1
    adv = group_advantages([e.ret for e in episodes], [e.seed for e in episodes])
    scored = []
    for episode, a in zip(episodes, adv):
      for cand in self.extractor(episode):
        n_key = sum(e.key == cand.key for e in self.entries)
        scored.append((abs(float(a)) / math.sqrt(1 + n_key), cand))
    admitted = 0
    for score, cand in sorted(scored, key=lambda x: -x[0]):
      if score < cfg.admission_threshold or admitted >= cfg.max_admissions_per_update:
        break
      same = [e for e in self.entries if e.key == cand.key and e.kind == cand.kind
              and cosine(e.text, cand.text) >= cfg.dedup_similarity]
      if same:
        same[0].score = max(same[0].score, score)
        continue
      self.entries.append(Entry(cand.key, cand.kind, cand.text, score, self.updates))
      admitted += 1
      in_key = sorted((e for e in self.entries if e.key == cand.key), key=lambda e: e.score)
      for e in in_key[:max(0, len(in_key) - cfg.max_per_key)]:
        self.entries.remove(e)
    if len(self.entries) > cfg.max_entries:
      self.entries = sorted(self.entries, key=lambda e: -e.score)[:cfg.max_entries]
    return admitted

  def state_dict(self) -> dict[str, Any]:
    """The library as JSON-ready values: entries, buffered episodes and the update count."""
    return {"entries": [dataclasses.asdict(e) for e in self.entries],
            "pending": [_episode_state(e) for e in self.pending],
            "updates": self.updates}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores what `state_dict` returned (a library without `pending` restores an empty buffer).

    Raises:
      ValueError: `state` lacks entries or updates, or an entry has the wrong fields.
    """
    missing = sorted({"entries", "updates"} - set(state))
    if missing:
      raise ValueError(f"ExperienceLibrary.load_state_dict: missing {missing}; got keys "
                       f"{sorted(state)}")
    try:
      entries = [Entry(**e) for e in state["entries"]]
    except TypeError as e:
      raise ValueError(f"ExperienceLibrary.load_state_dict: bad entry: {e}") from e
    self.entries = entries
    self.pending = [_episode_from_state(e) for e in state.get("pending", [])]
    self.updates = int(state["updates"])


def _episode_state(episode: Episode) -> dict[str, Any]:
  return {"seed": episode.seed, "ret": episode.ret, "success": episode.success,
          "steps": [step._asdict() for step in episode.steps]}


def _episode_from_state(state: dict[str, Any]) -> Episode:
  return Episode(seed=int(state["seed"]), ret=float(state["ret"]), success=bool(state["success"]),
                 steps=tuple(StepView(**step) for step in state["steps"]))


_LIBRARIES: dict[str, ExperienceLibrary] = {}


def library(name: str, config: LibraryConfig | None = None) -> ExperienceLibrary:
  """The process-wide library called `name`, created on first use with `config`.

  Raises:
    ValueError: `name` exists with a different config (two runs sharing a name by accident).
  """
  if name not in _LIBRARIES:
    _LIBRARIES[name] = ExperienceLibrary(config or LibraryConfig())
  elif config is not None and config != _LIBRARIES[name].config:
    raise ValueError(f"experience library {name!r} already exists with {_LIBRARIES[name].config}; "
                     f"got {config}; use another library name")
  return _LIBRARIES[name]


def drop_library(name: str) -> None:
  """Forgets the process-wide library `name` (as a new process would); absent names are ignored.

  For processes that run several trainings one after another (tests, notebooks): the next
  env built with `name` starts an empty library, which a resumed run then fills from its
  checkpoint through `LibraryCheckpoint`.
  """
  _LIBRARIES.pop(name, None)


_shared_library = library  # `ExperienceEnv.__init__` takes an argument called `library`


class LibraryCheckpoint:
  """A learner hook that checkpoints the library called `library` with the run.

  The driver saves `state_dict()` of every stateful part of the run (reward shapers,
  corrections, the strategy and hooks) in its checkpoint (`extra['credit_state']`) and calls
  `load_state_dict` on resume; this hook is how the SLEA library rides along:

    learner.train.hooks = [@experience.LibraryCheckpoint()]
    experience.LibraryCheckpoint.library = 'slea_frozenlake'   # = env_kwargs['library']

  The library is looked up by name when saved or restored, not when this object is built: the
  learner builds the env (which creates the library with its config) only after gin has built
  the shapers.
  """

  def __init__(self, library: str = "default"):
    if not isinstance(library, str) or not library:
      raise ValueError(f"LibraryCheckpoint.library must be a non-empty str, got {library!r}")
    self.library = library

  def _library(self) -> ExperienceLibrary:
    if self.library not in _LIBRARIES:
      raise ValueError(
          f"LibraryCheckpoint: no experience library named {self.library!r} exists (known: "
          f"{sorted(_LIBRARIES) or 'none'}); set it to the 'slea' env's env_kwargs['library']")
    return _LIBRARIES[self.library]

  def __call__(self, event) -> None:
    del event  # the library is saved with the checkpoint, not after every iteration

  def state_dict(self) -> dict[str, Any]:
    return {"library": self.library, **self._library().state_dict()}

  def load_state_dict(self, state: dict[str, Any]) -> None:
    """Restores the library saved by `state_dict`.

    Raises:
      ValueError: the checkpoint holds another library's state.
    """
    if state.get("library") != self.library:
      raise ValueError(f"LibraryCheckpoint({self.library!r}): the checkpoint holds library "
                       f"{state.get('library')!r}")
    self._library().load_state_dict(state)


def use_state_key_as_obs_hash(traj: types.Trajectories) -> types.Trajectories:
  """Reward-shaper stage: the cluster ids the 'slea' wrapper reported become the step hashes.

  Step-group estimators (GiGPO, GAGPO) group turns by the state they act from: `obs_hash` of the
  previous turn, and `extras['initial_obs_hash']` for turn 0. Replacing both with cluster ids
  (`extras['state_key']`, the state after each turn, and `extras['anchor_state_key'][:, 0]`, the
  state turn 0 acts from) puts structurally equivalent states in one step group (SLEA-RL: GiGPO
  with key groups). Rewards are unchanged; turns that do not exist keep their hash. Unlike a
  reward shaper proper it rewrites `obs_hash`, not `reward`: list it last among the shapers, since
  one after it that reads `obs_hash` (curiosity) would see cluster ids, not exact observations.

  Raises:
    ValueError: the batch has no cluster ids (the env is not wrapped by 'slea').
  """
  missing = [k for k in (extra_keys.STATE_KEY, extra_keys.ANCHOR_STATE_KEY) if k not in traj.extras]
  if missing:
    raise ValueError(f"use_state_key_as_obs_hash: traj.extras lacks {missing} (has: "
                     f"{sorted(traj.extras) or 'nothing'}); it needs the 'slea' env")
  state = jnp.asarray(traj.extras[extra_keys.STATE_KEY]).astype(jnp.int32)
  anchor = jnp.asarray(traj.extras[extra_keys.ANCHOR_STATE_KEY]).astype(jnp.int32)
  obs_hash = jnp.where(jnp.asarray(traj.turn_mask), state, jnp.asarray(traj.obs_hash))
  return traj.replace(obs_hash=obs_hash.astype(jnp.int32),
                      extras={**traj.extras, extra_keys.INITIAL_OBS_HASH_KEY: anchor[:, 0]})


def experience_block(entries: Sequence[Entry]) -> str:
  """The text appended to an observation: one line, entries separated by '.'."""
  if not entries:
    return ""
  return _EXPERIENCE + " " + ". ".join(e.text for e in entries)


@registry.register("slea")
class ExperienceEnv(envs_base.TextEnv):
  """Any registered env with step-level retrieved experience appended to every observation."""

  def __init__(self, env: str = "frozenlake", env_kwargs: dict[str, Any] | None = None,
               library: str = "default", num_retrieved: int = 3,
               admission_threshold: float = 0.5, max_admissions_per_update: int = 8,
               max_per_key: int = 5, max_entries: int = 512, episodes_per_update: int = 128,
               read_only_from_seed: int = 1_000_000_000):
    """Builds the wrapper.

    Args:
      env, env_kwargs: the wrapped env's registry name and arguments.
      library: name of the shared library; the other arguments configure it on first use.
      read_only_from_seed: episodes with a seed at or above this never write to the library.
    """
    if env == "slea":
      raise ValueError("ExperienceEnv cannot wrap itself")
    inner = registry.make(env, **(env_kwargs or {}))
    super().__init__(inner.max_turns)
    self.inner = inner
    self.action_words = inner.action_words
    self.library = _shared_library(library, LibraryConfig(
        num_retrieved=num_retrieved, admission_threshold=admission_threshold,
        max_admissions_per_update=max_admissions_per_update, max_per_key=max_per_key,
        max_entries=max_entries, episodes_per_update=episodes_per_update))
    self.key_fn = KEY_FUNCTIONS.get(env, structural_key)
    self.read_only_from_seed = read_only_from_seed
    self._seed = 0
    self._obs = ""
    self._steps: list[StepView] = []
    self._return = 0.0

  def expert_action(self) -> str:
    return self.inner.expert_action()

  def _augment(self, observation: str) -> str:
    return observation + experience_block(self.library.retrieve(self.key_fn(observation)))

  def _reset(self, seed: int) -> str:
    self._seed, self._steps, self._return = seed, [], 0.0
    self._obs = self.inner.reset(seed)
    return self._augment(self._obs)

  def _step(self, action: Any) -> envs_base.StepResult:
    result = self.inner.step(action)
    anchor_key = self.key_fn(self._obs)
    self._steps.append(StepView(key=anchor_key, observation=self._obs,
                                action=str(action), next_observation=result.observation,
                                action_valid=bool(result.info.get("action_valid", True)),
                                done=result.done))
    self._return += float(result.reward)
    self._obs = result.observation
    if result.done and self._seed < self.read_only_from_seed:
      self.library.observe(Episode(seed=self._seed, steps=tuple(self._steps), ret=self._return,
                                   success=bool(result.info.get("success", False))))
    info = {**result.info, extra_keys.STATE_KEY: key_id(self.key_fn(result.observation)),
            extra_keys.ANCHOR_STATE_KEY: key_id(anchor_key)}
    return result._replace(observation=self._augment(result.observation), info=info)

  def _on_step_cap(self, result: envs_base.StepResult) -> envs_base.StepResult:
    return result  # the inner env applies its own cap
