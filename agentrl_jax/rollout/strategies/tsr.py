"""TSR — trajectory-search rollouts: best-of-N action selection and instance filtering.

Test-time search moved into the rollout stage of training. At every turn each live episode
samples N candidate actions from the same prefix, tries each on a clone of its environment, scores
it with a cheap task scorer `f(state, action)`, and keeps the best; only the kept action's tokens
(and the sampler's log-probs of them, TITO) enter the trajectory. The optimizer is unchanged;
the selection bias is accepted, as in the paper.

Instance filtering drops prompt groups that teach nothing: all returns equal (zero variance) or a
success rate outside (p_lo, p_hi). A dropped group is re-collected on fresh tasks up to
`max_rounds` times; one still failing after that is kept in the batch (static shapes) with its
action tokens masked out of the loss and `extras["instance_kept"] = 0`.

Also here: lookahead (a candidate's score adds the best f over d greedy follow-up steps, played on
env clones) and beam search (each prompt group's rows are its B beams, re-selected every turn by
cumulative score).

Differences from the paper: the env clone is a deep copy (text envs are pure Python); a beam's
width is its group's size, and the B beams are all emitted (the group's GRPO samples).

Gin: `learner.train.strategy = @tsr.BestOfN()` with `tsr.BestOfN.num_candidates = 4`; or
`@tsr.BeamSearch()`; wrap either in `@tsr.FilterInstances()` for instance filtering.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from agentrl_jax import config_errors
from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.envs import base as envs_base
from agentrl_jax.rollout import groups as groups_lib
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import workers as workers_lib
from agentrl_jax.rollout.strategies import common

# A scorer sees the cloned env after the candidate's step and the step's result.
Scorer = Callable[[envs_base.TextEnv, envs_base.StepResult], float]

# Folded into a turn's key to derive the keys of candidates 1..N−1 (candidate 0 uses the turn's
# own key, so N = 1 samples exactly what the plain loop samples).
_CANDIDATE_SALT = 0x75A
_BEAM_SALT = 0xBEA
_ROUND_SALT = 0x7F1


def step_reward(env: envs_base.TextEnv, result: envs_base.StepResult) -> float:
  """The env's own reward for the step (the paper's default scorer)."""
  del env
  return float(result.reward)


def frozenlake_progress(env: envs_base.TextEnv, result: envs_base.StepResult) -> float:
  """FrozenLake heuristic: step reward − 0.1·(moves left to the goal); −1 more in a hole.

  A move towards the goal scores higher than one away from it even when both pay 0 reward.
  """
  if not hasattr(env, "shortest_path_length"):
    raise TypeError(f"frozenlake_progress scores FrozenLake envs, got {type(env).__name__}")
  distance = env.shortest_path_length
  if distance is None:  # in a hole: no path to the goal
    return float(result.reward) - 1.0
  return float(result.reward) - 0.1 * distance


def _score(scorer: Scorer, env, result) -> float:
  if isinstance(result, workers_lib.StepFault):
    return -math.inf  # any candidate the env accepted beats one that crashed it
  return float(scorer(env, result))


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BestOfN:
  """Best-of-N action selection at every turn.

  Attributes:
    num_candidates: N actions sampled per live episode and turn (1 = plain sampling).
    scorer: f(env after the step, step result) -> score; ties go to the earliest candidate.
    lookahead: d; a candidate's score is its own f plus the best f over up to d greedy
      follow-up steps (the policy's arg-max actions, played on clones of the candidate's env);
      0 = the candidate's own f.
  """

  num_candidates: int = 4
  scorer: Scorer = step_reward
  lookahead: int = 0

  def __post_init__(self):
    if self.num_candidates < 1:
      raise ValueError(f"BestOfN.num_candidates must be >= 1, got {self.num_candidates}")
    if not callable(self.scorer):
      raise ValueError(f"BestOfN.scorer must be callable, got {self.scorer!r}")
    if self.lookahead < 0:
      raise ValueError(f"BestOfN.lookahead must be >= 0, got {self.lookahead}")

  def collect(self, runner: loop_lib.RolloutRunner, make_env: common.MakeEnv,
              seeds: Sequence[int], group_ids: Sequence[int], *, params, rng: jax.Array,
              row_ids: Sequence[int] | None = None
              ) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
    """Plays one episode per seed, keeping the best of N candidate actions at every turn.

    Returns ordinary `Trajectories` plus `extras["tsr_scores"]` [B, N_turns, N] (each candidate's
    score; 0 for turns not played) and `extras["tsr_choice"]` [B, N_turns] (kept candidate, −1
    where no turn was played).
    """
    row_ids = common.check_inputs(seeds, group_ids, row_ids)
    start_time = time.perf_counter()
    tool = common.tools(runner)
    b, n_turns, n = len(seeds), runner.config.max_turns, self.num_candidates
    batch = common.start(runner, [make_env() for _ in seeds], seeds, group_ids, row_ids)
    stats = loop_lib.RolloutStats(episodes=b)
    scores = np.zeros((b, n_turns, n), np.float32)
    choice = np.full((b, n_turns), -1, np.float32)
    for turn in range(n_turns):
      common.append_observations(runner, batch, turn, stats)
      if not batch.active.any():
        break
      rows = np.flatnonzero(batch.active)
      key = common.turn_key(rng, turn)
      best = np.full(b, -math.inf)
      kept: dict[int, tuple[Any, ...]] = {}
      kept_cache = None
      drawn_tokens = 0
      for j in range(n):
        draw = common.sample_turn(tool, params, batch, turn, common.retry_key(key, _CANDIDATE_SALT, j))
        clones = [copy.deepcopy(batch.envs[i]) for i in rows]  # restore(s_k) for this candidate
        results = common.step_envs(tool, clones, [runner.action_text(draw.tokens[i]) for i in rows])
        bonus = (self._lookahead(runner, tool, params, batch, draw, clones, results, turn)
                 if self.lookahead else {})
        better = np.zeros(b, bool)
        for i, clone, result in zip(rows, clones, results):
          score = _score(self.scorer, clone, result) + bonus.get(i, 0.0)
          scores[i, turn, j] = max(score, np.finfo(np.float32).min)
          drawn_tokens += len(draw.tokens[i])
          if j == 0 or score > best[i]:  # strict: ties keep the earlier candidate
            best[i] = score
            better[i] = True
            choice[i, turn] = j
            kept[i] = (draw.tokens[i], draw.logprobs[i], clone, result)
        kept_cache = draw.cache if kept_cache is None else common.where_cache_rows(
            better, draw.cache, kept_cache)
      batch.cache = kept_cache
      common.write_actions(batch, rows, {i: kept[i][0] for i in rows},
                           {i: kept[i][1] for i in rows}, turn, stats)
      stats.sampled_tokens += drawn_tokens - sum(len(kept[i][0]) for i in rows)
      for i in rows:
        batch.envs[i] = kept[i][2]
        common.record_step(batch, i, kept[i][3], turn, stats)
    batch.traj.extras[extra_keys.TSR_SCORES_KEY] = scores
    batch.traj.extras[extra_keys.TSR_CHOICE_KEY] = choice
    return common.finish(runner, batch, stats, start_time)

  def _lookahead(self, runner, tool, params, batch, draw, clones, results, turn) -> dict[int, float]:
    """Best f over up to d greedy follow-up steps after each candidate (row -> bonus).

    Plays on copies (trajectory rows, env clones, the candidate's cache), so nothing of it
    reaches the batch; a row whose candidate ended the episode gets no bonus.
    """
    rows = list(draw.rows)
    look = common.RowBatch(
        traj=jax.tree.map(np.copy, batch.traj), envs=list(batch.envs),
        observations=list(batch.observations), chunks=list(batch.chunks),
        active=batch.active.copy(), cursor=batch.cursor.copy(), cache=draw.cache,
        row_ids=batch.row_ids)
    scratch = loop_lib.RolloutStats()
    common.write_actions(look, rows, draw.tokens, draw.logprobs, turn, scratch)
    for i, clone, result in zip(rows, clones, results):
      look.envs[i] = copy.deepcopy(clone)
      common.record_step(look, i, result, turn, scratch)
    best: dict[int, float] = {}
    for ahead in range(turn + 1, min(turn + 1 + self.lookahead, runner.config.max_turns)):
      common.append_observations(runner, look, ahead, scratch)
      if not look.active.any():
        break
      # Arg-max actions draw nothing: any key does.
      follow = common.sample_turn(tool, params, look, ahead, jax.random.key(0), greedy=True)
      common.commit_draw(look, follow)
      live = [int(i) for i in follow.rows]
      common.write_actions(look, live, follow.tokens, follow.logprobs, ahead, scratch)
      outcomes = common.step_envs(tool, [look.envs[i] for i in live],
                                  [runner.action_text(follow.tokens[i]) for i in live])
      for i, result in zip(live, outcomes):
        score = _score(self.scorer, look.envs[i], result)
        best[i] = max(best.get(i, -math.inf), score)
        common.record_step(look, i, result, ahead, scratch)
    return {i: max(v, np.finfo(np.float32).min) for i, v in best.items()}


class _Candidate(NamedTuple):
  score: float  # the beam's cumulative score with this step
  parent: int
  draw: int
  env: Any
  result: Any


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BeamSearch:
  """Beam search over each group: its rows are the beams (B = the group size).

  Every turn each live beam samples N candidate actions, each tried on a clone of the beam's
  env; the group's live slots then hold the best candidates by cumulative score Σ f (ties: the
  earlier-drawn candidate, then the lower row). A slot that takes another beam's candidate
  inherits that beam's prefix (tokens, cache rows, env). Finished beams keep their slots. The
  B beams are emitted as the group's trajectories.

  Attributes:
    num_candidates: N actions per live beam and turn.
    scorer: f(env after the step, step result) -> score.
  """

  num_candidates: int = 4
  scorer: Scorer = step_reward

  def __post_init__(self):
    if self.num_candidates < 1:
      raise ValueError(f"BeamSearch.num_candidates must be >= 1, got {self.num_candidates}")
    if not callable(self.scorer):
      raise ValueError(f"BeamSearch.scorer must be callable, got {self.scorer!r}")

  def collect(self, runner: loop_lib.RolloutRunner, make_env: common.MakeEnv,
              seeds: Sequence[int], group_ids: Sequence[int], *, params, rng: jax.Array,
              row_ids: Sequence[int] | None = None
              ) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
    """Plays each group as B beams.

    Returns ordinary `Trajectories` plus `extras["tsr_beam_score"]` [B] (Σ f of the beam) and
    `extras["tsr_beam_parent"]` [B, N_turns] (the row whose beam each slot extended at each
    turn; −1 where the slot played no turn).
    """
    row_ids = common.check_inputs(seeds, group_ids, row_ids)
    common.check_groups_share_seeds(seeds, group_ids, "BeamSearch")
    start_time = time.perf_counter()
    tool = common.tools(runner)
    b, n_turns = len(seeds), runner.config.max_turns
    groups = np.asarray(group_ids, np.int32)
    batch = common.start(runner, [make_env() for _ in seeds], seeds, group_ids, row_ids)
    stats = loop_lib.RolloutStats(episodes=b)
    cumulative = np.zeros(b)
    parent_log = np.full((b, n_turns), -1, np.float32)
    for turn in range(n_turns):
      common.append_observations(runner, batch, turn, stats)
      if not batch.active.any():
        break
      rows = np.flatnonzero(batch.active)
      key = common.turn_key(rng, turn)
      draws, pool = [], []
      for j in range(self.num_candidates):
        draw = common.sample_turn(tool, params, batch, turn, common.retry_key(key, _BEAM_SALT, j))
        draws.append(draw)
        clones = [copy.deepcopy(batch.envs[i]) for i in rows]
        results = common.step_envs(tool, clones, [runner.action_text(draw.tokens[i]) for i in rows])
        for i, clone, result in zip(rows, clones, results):
          pool.append(_Candidate(cumulative[i] + _score(self.scorer, clone, result), int(i), j,
                                 clone, result))
          stats.sampled_tokens += len(draw.tokens[i])
      assignment = self._select(pool, rows, groups)
      self._advance(batch, assignment, draws, turn, stats)
      for slot, cand in assignment.items():
        cumulative[slot] = cand.score
        parent_log[slot, turn] = cand.parent
    batch.traj.extras[extra_keys.TSR_BEAM_SCORE_KEY] = np.maximum(cumulative, np.finfo(np.float32).min).astype(
        np.float32)
    batch.traj.extras[extra_keys.TSR_BEAM_PARENT_KEY] = parent_log
    return common.finish(runner, batch, stats, start_time)

  @staticmethod
  def _select(pool: list, rows: np.ndarray, groups: np.ndarray) -> dict[int, _Candidate]:
    """slot -> candidate: each group's live slots take its best candidates; a candidate goes to
    its own parent's slot when that slot is free, so unchanged beams stay in place."""
    assignment: dict[int, _Candidate] = {}
    for g in np.unique(groups[rows]):
      live = [int(i) for i in rows if groups[i] == g]
      ranked = sorted((c for c in pool if groups[c.parent] == g),
                      key=lambda c: (-c.score, c.draw, c.parent))[:len(live)]
      free = list(live)
      rest = []
      for cand in ranked:
        if cand.parent in free:
          free.remove(cand.parent)
          assignment[cand.parent] = cand
        else:
          rest.append(cand)
      for slot, cand in zip(free, rest):
        assignment[slot] = cand
    return assignment

  @staticmethod
  def _advance(batch: common.RowBatch, assignment: dict[int, _Candidate], draws: list,
               turn: int, stats: loop_lib.RolloutStats) -> None:
    """Moves each slot onto its candidate: parent's prefix, the candidate's action, cache, env."""
    slots = sorted(assignment)
    parents = [assignment[s].parent for s in slots]
    before = dataclasses.replace(batch, traj=jax.tree.map(np.copy, batch.traj),
                                 envs=list(batch.envs), chunks=list(batch.chunks), observations=list(batch.observations),
                                 active=batch.active.copy(), cursor=batch.cursor.copy())
    moved = [(s, p) for s, p in zip(slots, parents) if s != p]
    common.copy_rows(batch, [s for s, _ in moved], [p for _, p in moved], source=before)
    for j, draw in enumerate(draws):
      mine = [(s, assignment[s].parent) for s in slots if assignment[s].draw == j]
      if mine:
        batch.cache = common.set_cache_rows(batch.cache, np.array([s for s, _ in mine]), draw.cache,
                                            np.array([p for _, p in mine]))
    tokens = {s: draws[assignment[s].draw].tokens[assignment[s].parent] for s in slots}
    logprobs = {s: draws[assignment[s].draw].logprobs[assignment[s].parent] for s in slots}
    kept = sum(len(t) for t in tokens.values())
    common.write_actions(batch, slots, tokens, logprobs, turn, stats)
    stats.sampled_tokens -= kept  # every candidate was already counted when drawn
    for s in slots:
      batch.envs[s] = assignment[s].env
      common.record_step(batch, s, assignment[s].result, turn, stats)


@config_errors.config_class
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FilterInstances:
  """Instance filtering around any strategy (or plain sampling).

  A group (rows sharing a group id) is kept iff its returns are not all equal and its success
  rate lies strictly inside (success_low, success_high). Failing groups are played again on new
  tasks (seed + round·seed_stride) up to `max_rounds` times; a group failing every round stays in
  the batch with no loss (action tokens masked) and `extras["instance_kept"] = 0`.

  Attributes:
    base: the strategy that collects (None: `RolloutRunner.collect`).
    success_low, success_high: exclusive bounds on a kept group's success rate.
    max_rounds: re-collections of failing groups (0: filter only).
    seed_stride: seed offset of each re-collection round.
  """

  base: Any = None
  success_low: float = 0.0
  success_high: float = 1.0
  max_rounds: int = 2
  seed_stride: int = 1_000_003

  def __post_init__(self):
    if not self.success_low < self.success_high:
      raise ValueError(f"FilterInstances: need success_low < success_high, got "
                       f"{self.success_low}, {self.success_high}")
    if self.max_rounds < 0:
      raise ValueError(f"FilterInstances.max_rounds must be >= 0, got {self.max_rounds}")
    if self.seed_stride <= 0:
      raise ValueError(f"FilterInstances.seed_stride must be positive, got {self.seed_stride}")
    if self.base is not None and not callable(getattr(self.base, "collect", None)):
      raise ValueError(f"FilterInstances.base must be a strategy with .collect, got {self.base!r}")

  def kept_groups(self, traj: types.Trajectories) -> np.ndarray:
    """[B] bool: the row's group passes the filter."""
    return informative_groups(np.asarray(traj.group_id), np.asarray(traj.outcome),
                              np.asarray(traj.success), self.success_low, self.success_high)

  def collect(self, runner: loop_lib.RolloutRunner, make_env: common.MakeEnv,
              seeds: Sequence[int], group_ids: Sequence[int], *, params, rng: jax.Array,
              row_ids: Sequence[int] | None = None
              ) -> tuple[types.Trajectories, loop_lib.RolloutStats]:
    row_ids = common.check_inputs(seeds, group_ids, row_ids)
    start_time = time.perf_counter()
    seeds = np.asarray(seeds, np.int64)
    group_ids = np.asarray(group_ids, np.int32)
    traj, stats = self._base_collect(runner, make_env, seeds, group_ids, params, rng, row_ids)
    traj = common.pad_tokens(traj, runner.config.max_len)
    kept = self.kept_groups(traj)
    for round_ in range(1, self.max_rounds + 1):
      redo = np.flatnonzero(~kept)
      if not redo.size:
        break
      sub, sub_stats = self._base_collect(
          runner, make_env, seeds[redo] + round_ * self.seed_stride, group_ids[redo], params,
          jax.random.fold_in(jax.random.fold_in(rng, _ROUND_SALT), round_), row_ids[redo])
      common.merge_stats(stats, sub_stats)
      sub = common.pad_tokens(sub, runner.config.max_len)
      passed = self.kept_groups(sub)
      common.copy_traj_rows(traj, redo[passed], sub, np.flatnonzero(passed))
      kept[redo[passed]] = True
    # Static shapes: a group that never passed stays, carrying no loss.
    traj.action_mask[~kept] = False
    traj.sample_logprob[~kept] = 0.0
    traj.extras[extra_keys.INSTANCE_KEPT_KEY] = kept.astype(np.float32)
    stats.seconds = time.perf_counter() - start_time
    return common.trim_to_bucket(runner, traj), stats

  def _base_collect(self, runner, make_env, seeds, group_ids, params, rng, row_ids):
    if self.base is None:
      return runner.collect([make_env() for _ in seeds], [int(s) for s in seeds],
                            [int(g) for g in group_ids], params=params, rng=rng, row_ids=row_ids)
    return self.base.collect(runner, make_env, [int(s) for s in seeds], [int(g) for g in group_ids],
                             params=params, rng=rng, row_ids=row_ids)


def informative_groups(group_id: np.ndarray, outcome: np.ndarray, success: np.ndarray,
                       success_low: float, success_high: float) -> np.ndarray:
  """[B] bool: the row's group has unequal returns and success rate in (low, high)."""
  groups = groups_lib.groups_of(group_id, outcome)
  rate = groups_lib.group_mean(groups, success)
  kept = ~groups.tied & (success_low < rate) & (rate < success_high)
  return kept[groups.index]
