"""Tests of SLEA-RL's clustering, library maintenance and the 'slea' env wrapper."""

import json
import signal
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentrl_jax import extra_keys
from agentrl_jax import types
from agentrl_jax.advantages import step as step_lib
from agentrl_jax.envs import base as envs_base
from agentrl_jax.envs import registry
from agentrl_jax.learner import configs
from agentrl_jax.learner import learner
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer as tfm
from agentrl_jax.offline import experience
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib


def test_structural_key_ignores_entity_names_numbers_and_quotes():
  a = "You are in the Kitchen. Alice gave you 3 apples; 'open fridge' failed."
  b = "You are in the Garage. Bob gave you 17 apples; 'take key' failed."
  assert experience.structural_key(a) == experience.structural_key(b)
  assert experience.structural_key(a) != experience.structural_key("You are in a room.")


def test_frozenlake_boards_with_the_same_neighbourhood_share_a_cluster():
  a = "moved right\nF P F F\nF H F H\nF F F H\nH F F G"
  b = "hit wall\nF P F H\nF H H F\nH F F F\nF F H G"   # left F, down H, right F, up wall
  c = "moved down\nF F F F\nP H F H\nF F F H\nH F F G"
  assert experience.frozenlake_key(a) == experience.frozenlake_key(b)
  assert experience.frozenlake_key(a) != experience.frozenlake_key(c)
  lib = experience.ExperienceLibrary(experience.LibraryConfig(backoff_similarity=1.0))
  lib.entries.append(experience.Entry(experience.frozenlake_key(a), "strategy", "tip: right", 1.0, 0))
  assert [e.text for e in lib.retrieve(experience.frozenlake_key(b))] == ["tip: right"]
  assert lib.retrieve(experience.frozenlake_key(c)) == []


def _episodes(rng, n_keys, n_eps):
  out = []
  for i in range(n_eps):
    steps = tuple(experience.StepView(key=f"k{rng.integers(n_keys)}", observation=f"o{j}",
                                      action=f"a{rng.integers(50)}", action_valid=True,
                                      next_observation=f"o{j + 1}", done=j == 2)
                  for j in range(3))
    success = bool(rng.random() < 0.5)
    out.append(experience.Episode(seed=i // 4, steps=steps, ret=float(success), success=success))
  return out


def test_library_size_and_admissions_stay_bounded():
  cfg = experience.LibraryConfig(admission_threshold=0.1, max_admissions_per_update=6,
                                 max_per_key=2, max_entries=10, episodes_per_update=16)
  lib = experience.ExperienceLibrary(cfg)
  rng = np.random.default_rng(0)
  for _ in range(20):
    before = len(lib)
    admitted = lib.update(_episodes(rng, n_keys=8, n_eps=16))
    assert admitted <= 6
    assert len(lib) <= min(before + admitted, 10)
    per_key = {}
    for e in lib.entries:
      per_key[e.key] = per_key.get(e.key, 0) + 1
    assert max(per_key.values(), default=0) <= 2
  assert 0 < len(lib) <= 10


def test_score_threshold_blocks_zero_advantage_episodes():
  # Every episode of a seed has the same return -> GRPO advantage 0 -> score 0 < threshold.
  lib = experience.ExperienceLibrary(experience.LibraryConfig(admission_threshold=0.01))
  eps = _episodes(np.random.default_rng(1), 4, 8)
  eps = [e._replace(ret=1.0, success=True) for e in eps]
  assert lib.update(eps) == 0 and len(lib) == 0


def test_score_is_damped_by_the_entries_already_under_the_key():
  # Two episodes of one seed, returns 1 and 0: GRPO advantages ±0.5/(√0.5 + 1e-6), |Â| ≈ 0.70711.
  # Each yields one candidate: under "fresh" (no entries yet) the score is |Â|/√1 = 0.70711; under
  # "crowded" (3 entries) it is |Â|/√(1 + 3) = 0.35355 < θ_adm = 0.5, so only "fresh" is admitted.
  lib = experience.ExperienceLibrary(
      experience.LibraryConfig(admission_threshold=0.5, max_per_key=10),
      extractor=lambda ep: [experience.Candidate(
          "fresh" if ep.success else "crowded", experience.STRATEGY,
          "tip: open the north door" if ep.success else "tip: read the old map")])
  lib.entries = [experience.Entry("crowded", experience.FAILURE, f"avoid: pit number {i}", 0.01, 0)
                 for i in ("one", "two", "three")]
  steps = (experience.StepView(key="k", observation="o", action="a", action_valid=True,
                               next_observation="o2", done=True),)
  episodes = [experience.Episode(seed=0, steps=steps, ret=1.0, success=True),
              experience.Episode(seed=0, steps=steps, ret=0.0, success=False)]
  assert lib.update(episodes) == 1
  (added,) = [e for e in lib.entries if e.step_added == 1]
  assert added.key == "fresh"
  # rtol 1e-6: the advantages are the library's float32 GRPO kernel's (the damping is exact).
  np.testing.assert_allclose(added.score, 0.5 / (0.5**0.5 + 1e-6), rtol=1e-6)
  # With a lower threshold the crowded candidate enters too, at half the fresh score.
  lib.entries = lib.entries[:3]
  lib.config = experience.LibraryConfig(admission_threshold=0.3, max_per_key=10)
  assert lib.update(episodes) == 2
  scores = {e.key: e.score for e in lib.entries if e.step_added == 2}
  np.testing.assert_allclose(scores["crowded"], scores["fresh"] / 2, rtol=1e-9)


def test_wrapper_with_empty_library_equals_base_env_and_injects_after_extraction():
  kw = {"size": 4, "hole_prob": 0.2, "max_turns": 10}
  env = registry.make("slea", env="frozenlake", env_kwargs=kw, library="test_wrapper",
                      episodes_per_update=2, admission_threshold=0.1)
  base = registry.make("frozenlake", **kw)
  assert env.reset(7) == base.reset(7)
  for action in ("right", "down", "left"):
    r1, r2 = env.step(action), base.step(action)
    assert r1.observation == r2.observation and r1.reward == r2.reward
  # Two episodes of the same seed, one success (expert) and one failure (invalid words).
  for actor in ("expert", "bad"):
    env.reset(11)
    done = False
    while not done:
      done = env.step(env.expert_action() if actor == "expert" else "jump").done
  assert len(env.library) > 0
  assert "experience:" in env.reset(11)
  # Held-out seeds read the library but never write to it.
  size = len(env.library)
  for _ in range(2):
    env.reset(2_000_000_000)
    while not env.step("jump").done:
      pass
  assert len(env.library) == size and not env.library.pending


def test_state_dict_round_trip():
  lib = experience.ExperienceLibrary(experience.LibraryConfig(admission_threshold=0.1))
  lib.update(_episodes(np.random.default_rng(2), 4, 8))
  other = experience.ExperienceLibrary()
  other.load_state_dict(lib.state_dict())
  assert [(e.key, e.text, e.score) for e in other.entries] == [
      (e.key, e.text, e.score) for e in lib.entries]


def test_shared_library_name_with_another_config_is_an_error():
  experience.library("test_clash", experience.LibraryConfig(max_per_key=2))
  assert experience.library("test_clash").config.max_per_key == 2
  with pytest.raises(ValueError, match="test_clash"):
    experience.library("test_clash", experience.LibraryConfig(max_per_key=3))


@registry.register("slea_test_rooms")
class _Rooms(envs_base.TextEnv):
  """Door 'a' leads to the Kitchen, door 'b' to the Garage: two rooms of one template.

  Turn 0 picks a door; turn 1 ends the episode with reward 1 in the Kitchen, 0 in the Garage.
  """

  action_words = ("a", "b")

  def __init__(self):
    super().__init__(max_turns=2)
    self._room = ""

  def expert_action(self) -> str:
    return "a"

  def _reset(self, seed: int) -> str:
    self._room = ""
    return "You stand in the Hall. Pick door a or b."

  def _step(self, action):
    if not self._room:
      self._room = "Kitchen" if str(action).strip() == "a" else "Garage"
      apples = 3 if self._room == "Kitchen" else 17
      return envs_base.StepResult(f"You are in the {self._room} with {apples} apples.", 0.0,
                                  False, {"action_valid": True})
    won = self._room == "Kitchen"
    return envs_base.StepResult("The end.", float(won), True,
                                {"action_valid": True, "success": won})


def _rooms_batch(doors):
  """One group, one episode per door sequence entry, played by a scripted actor via the loop."""
  tok = tokenizer_lib.load_tokenizer()
  cfg = tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=64)
  graphdef, _ = tfm.create(cfg, seed=0)
  runner = loop_lib.RolloutRunner(graphdef, cfg, tok, loop_lib.RolloutConfig(
      max_turns=2, max_len=96, obs_buckets=(32,), length_buckets=(),
      sampling=sampler_lib.SamplingConfig(max_action_tokens=1)))
  envs = [registry.make("slea", env="slea_test_rooms", library="test_rooms") for _ in doors]
  plans = {id(env): iter([door, "a"]) for env, door in zip(envs, doors)}
  traj, _ = runner.collect(envs, [0] * len(envs), [0] * len(envs),
                           actor=lambda env, rng: next(plans[id(env)]),
                           actor_rng=np.random.default_rng(0))
  return traj


def test_key_grouped_gigpo_merges_structurally_equivalent_states():
  # Episode 0 reaches "You are in the Kitchen with 3 apples.", episode 1 "... Garage with 17
  # apples.": different text, one structural key. Both then act from that state at turn 1.
  traj = _rooms_batch(["a", "b"])
  kitchen, garage = "You are in the Kitchen with 3 apples.", "You are in the Garage with 17 apples."
  assert experience.structural_key(kitchen) == experience.structural_key(garage)
  np.testing.assert_array_equal(traj.extras[extra_keys.STATE_KEY][:, 0],
                                [experience.key_id(experience.structural_key(kitchen))] * 2)
  assert traj.obs_hash[0, 0] != traj.obs_hash[1, 0]
  shaped = experience.use_state_key_as_obs_hash(jax.tree.map(jnp.asarray, traj))
  raw_ids = step_lib.step_groups(jnp.asarray(traj.group_id), step_lib.trajectory_anchor_hashes(
      jax.tree.map(jnp.asarray, traj)), jnp.asarray(traj.turn_mask))
  key_ids = step_lib.step_groups(shaped.group_id, step_lib.trajectory_anchor_hashes(shaped),
                                 shaped.turn_mask)
  assert raw_ids[0, 1] != raw_ids[1, 1] and key_ids[0, 1] == key_ids[1, 1]
  assert key_ids[0, 0] == key_ids[1, 0]  # both start in the Hall
  # GiGPO step advantages, mean_norm, γ = 0.95: step returns G = [[0.95, 1], [0, 0]].
  # Key groups {turn 0: (0.95, 0)}, {turn 1: (1, 0)} -> A^S = [[0.475, 0.5], [-0.475, -0.5]].
  # Raw hashes split turn 1 into singletons -> A^S[:, 1] = 0.
  def step_advantages(t):
    return step_lib.gigpo_advantages(
        t.outcome, t.reward, step_lib.trajectory_anchor_hashes(t), t.turn_mask, t.group_id, 1,
        discount=0.95, mode="mean_norm").step_advantages
  np.testing.assert_allclose(step_advantages(shaped), [[0.475, 0.5], [-0.475, -0.5]], atol=1e-6)
  np.testing.assert_allclose(step_advantages(jax.tree.map(jnp.asarray, traj))[:, 1], [0, 0],
                             atol=1e-6)
  np.testing.assert_array_equal(shaped.reward, traj.reward)


def test_key_grouping_needs_the_slea_wrapper():
  traj = types.empty_trajectories(2, 8, 3)
  with pytest.raises(ValueError, match="state_key"):
    experience.use_state_key_as_obs_hash(traj)


def test_key_ids_fit_float32_exactly():
  ids = [experience.key_id(f"key {i}") for i in range(1000)]
  assert all(0 <= i < 2**24 for i in ids)
  np.testing.assert_array_equal(np.asarray(ids, np.float32).astype(np.int64), ids)


def test_library_checkpoint_restores_entries_buffer_and_count():
  cfg = experience.LibraryConfig(admission_threshold=0.1, episodes_per_update=5)
  lib = experience.library("test_ckpt", cfg)
  for episode in _episodes(np.random.default_rng(3), 4, 13):  # 2 updates, 3 episodes buffered
    lib.observe(episode)
  assert lib.updates == 2 and len(lib.pending) == 3 and len(lib) > 0
  saved = json.loads(json.dumps(experience.LibraryCheckpoint("test_ckpt").state_dict()))
  experience.drop_library("test_ckpt")
  fresh = experience.library("test_ckpt", cfg)
  assert len(fresh) == 0
  experience.LibraryCheckpoint("test_ckpt").load_state_dict(saved)
  assert fresh.entries == lib.entries and fresh.pending == lib.pending and fresh.updates == 2
  with pytest.raises(ValueError, match="other"):
    experience.LibraryCheckpoint("test_ckpt").load_state_dict({**saved, "library": "other"})
  with pytest.raises(ValueError, match="no experience library named 'nowhere'"):
    experience.LibraryCheckpoint("nowhere").state_dict()


class _StopDuringFirstUpdate:
  """A reward shaper that asks the run to stop, as SIGTERM does, while the first update is traced.

  The learner traces the credit pipeline inside iteration 1's update, so the run checkpoints and
  stops after exactly one iteration. It changes no reward.
  """

  def __init__(self):
    self.fired = False

  def __call__(self, traj):
    if not self.fired:
      self.fired = True
      signal.raise_signal(signal.SIGTERM)
    return traj


def _slea_train(workdir, shapers):
  env_kwargs = {"env": "frozenlake", "env_kwargs": {"size": 4, "hole_prob": 0.2, "max_turns": 10},
                "library": "test_resume", "episodes_per_update": 3, "admission_threshold": 0.0}
  return learner.train(
      str(workdir),
      config=configs.TrainConfig(
          env_name="slea", env_kwargs=env_kwargs, num_iterations=2, tasks_per_iteration=2,
          group_size=2, estimator="gigpo", restrict_to_action_words=True, checkpoint_every=1),
      model=tfm.TransformerConfig(vocab_size=1, num_layers=1, d_model=32, num_heads=4,
                                  mlp_dim=64, position="turn_slot", alibi=True, max_turns=16,
                                  max_slots=96),
      rollout=loop_lib.RolloutConfig(max_turns=10, max_len=640, obs_buckets=(48, 64, 96),
                                     length_buckets=(288, 448)),
      warm_start=configs.WarmStartConfig(iterations=0),
      evaluation=configs.EvalConfig(every=1, num_tasks=2, pass_k=0),
      reward_shapers=[*shapers, experience.use_state_key_as_obs_hash],
      hooks=[experience.LibraryCheckpoint("test_resume")])


def _last_row(workdir):
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl") if line.strip()]
  return {k: v for k, v in rows[-1].items() if not k.startswith(_TIMING)}


_TIMING = ("time/", "memory/", "rollout/seconds", "rollout/tokens_per_s",
           "rollout/turns_per_s")


@pytest.mark.slow
def test_stopped_and_resumed_run_ends_with_the_uninterrupted_library_and_metrics(tmp_path):
  if threading.current_thread() is not threading.main_thread():
    pytest.skip("the learner installs its SIGTERM handler only on the main thread")
  experience.drop_library("test_resume")
  reference = _slea_train(tmp_path / "reference", [])
  reference_library = experience.library("test_resume").state_dict()
  # 4 episodes per iteration, extraction every 3: 2 updates and 2 buffered episodes at the end.
  assert reference_library["updates"] == 2 and len(reference_library["pending"]) == 2
  assert reference_library["entries"]

  experience.drop_library("test_resume")
  stopper = _StopDuringFirstUpdate()
  stopped = _slea_train(tmp_path / "run", [stopper])
  assert stopped.preempted and stopped.iterations == 1
  # At the stop the library holds one update and one buffered episode, both in the checkpoint.
  at_stop = experience.library("test_resume")
  assert at_stop.updates == 1 and len(at_stop.pending) == 1

  experience.drop_library("test_resume")  # what a new process starts with
  resumed = _slea_train(tmp_path / "run", [stopper])
  assert resumed.resumed_from == 1 and resumed.iterations == 2
  assert experience.library("test_resume").state_dict() == reference_library
  assert _last_row(tmp_path / "run") == _last_row(tmp_path / "reference")
  assert resumed.success_after == reference.success_after
