"""HF tokenizer.json wrapper and the Qwen2 / Llama 3 chat templates, built append-only (TITO)."""

import re

import pytest

tokenizers = pytest.importorskip("tokenizers")

from agentrl_jax.models import hf_tokenizer  # noqa: E402

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]
CORPUS = ["You are on a 4x4 frozen lake.", "move left", "move right", "user assistant system",
          "F P F F\nH F F G", "the board is\n\nF F"] * 20


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  """A small byte-level BPE (the family of Qwen2's and Llama 3's tokenizers) with their specials."""
  model = tokenizers.Tokenizer(tokenizers.models.BPE())
  model.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  model.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=300, special_tokens=SPECIALS,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  model.train_from_iterator(CORPUS, trainer)
  path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
  model.save(str(path))
  return hf_tokenizer.HFTokenizer(str(path.parent))


MESSAGES = [("system", "You are on a 4x4 frozen lake."), ("user", "F P F F\nH F F G"),
            ("assistant", "move right"), ("user", "the board is\n\nF F")]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_conversation_ids_equal_encoding_the_rendered_text(tok, family):
  template = hf_tokenizer.template_for(family)
  ids = template.conversation(tok, MESSAGES)
  text = hf_tokenizer.render_text(template, MESSAGES)
  assert ids == tok.encode(text)
  assert tok.decode(ids) == text


def test_rendered_text_hand_cases():
  msgs = [("user", "hi"), ("assistant", "yo")]
  assert hf_tokenizer.render_text(hf_tokenizer.QWEN2, msgs, add_generation_prompt=False) == (
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n")
  assert hf_tokenizer.render_text(hf_tokenizer.LLAMA3, msgs[:1], add_generation_prompt=True) == (
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_append_only_keeps_every_prefix_and_the_sampled_ids(tok, family):
  template = hf_tokenizer.template_for(family)
  prefixes = [template.conversation(tok, MESSAGES[:k]) for k in range(len(MESSAGES) + 1)]
  for short, long in zip(prefixes, prefixes[1:]):
    assert long[:len(short)] == short
  # The sampled ids of the assistant turn: a non-canonical split ("mo" + "ve" + ...) that
  # re-encoding the text would never produce. They must appear verbatim.
  sampled = [i for piece in ("mo", "ve", " ", "right") for i in tok.encode(piece)]
  sampled.append(template.end_id(tok))
  ids = template.conversation(tok, MESSAGES, assistant_ids={2: sampled})
  head = template.conversation(tok, MESSAGES[:2]) + template.generation_prompt(tok)
  assert ids[:len(head)] == head
  assert ids[len(head):len(head) + len(sampled)] == sampled
  tail = template.after_assistant(tok) + template.message(tok, *MESSAGES[3])
  assert ids[len(head) + len(sampled):] == tail


def test_errors_name_the_problem(tok, tmp_path):
  with pytest.raises(ValueError, match="does not exist"):
    hf_tokenizer.HFTokenizer(str(tmp_path / "missing.json"))
  with pytest.raises(ValueError, match="no chat template for model_type 'gpt2'"):
    hf_tokenizer.template_for("gpt2")
  with pytest.raises(ValueError, match="must end with the end token"):
    hf_tokenizer.QWEN2.conversation(tok, MESSAGES, assistant_ids={2: tok.encode("move right")})
  with pytest.raises(ValueError, match=re.escape("no token '<|nope|>'")):
    tok.piece_id("<|nope|>")
