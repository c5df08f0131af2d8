"""Tests of the SentencePiece tokenizer and of the shipped model trained on env text."""

import functools
import os
import pickle
import subprocess
import sys

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from agentrl_jax import envs
from agentrl_jax.models import tokenizer as tokenizer_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TRICKY_TEXTS = [
    "", " ", "  two  spaces  ", "\n", "\n\n", "\r\n", "\t", "trailing\n", " leading",
    "\u2581", "a\u2581b \u2581\u2581", "h\u00e9llo \u65e5\u672c \U0001F642", "e\u0301",
    "\x00\x01\x7f", "\U0010FFFF", "<|obs|>left<|act|>", "<|obs|<|end|>>", "<0x41>", "<unk><s></s><pad>",
    "x" * 5000,
]


@functools.cache
def _shipped():
  return tokenizer_lib.load_tokenizer()


@pytest.fixture
def tok():
  return _shipped()


def _env_texts(name, episodes=20, **kwargs):
  """Observations and action texts of episodes mixing expert, random and invalid actions."""
  env = envs.make(name, **kwargs)
  rng = np.random.default_rng(0)
  texts = []
  for seed in range(episodes):
    texts.append(env.reset(seed))
    done = False
    while not done:
      roll = rng.random()
      if roll < 0.2:
        action = ["jump", "", None, "x" * 10_000, "UP "][rng.integers(5)]
      elif roll < 0.6:
        action = env.expert_action()
      else:
        action = env.action_words[rng.integers(len(env.action_words))]
      result = env.step(action)
      texts.append(result.observation)
      done = result.done
  return texts


def test_fixed_ids_and_markers(tok):
  assert tok.vocab_size == 1024
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 3, 2)
  markers = {tok.obs_id, tok.act_id, tok.end_id}
  assert len(markers) == 3 and not markers & {0, 1, 2, 3}
  assert tok.encode("<|obs|>") == [tok.obs_id]
  assert tok.encode("<|act|>") == [tok.act_id]
  assert tok.encode("<|end|>") == [tok.end_id]
  assert tok.piece_id("<|obs|>") == tok.obs_id


def test_newline_is_one_piece(tok):
  assert tok.encode("\n") == [tok.piece_id("\n")]
  assert tok.pieces(tok.encode("\n\n")) == ["\n", "\n"]


@pytest.mark.parametrize("name", ["frozenlake", "dd_chain"])
def test_every_action_word_is_one_token(tok, name):
  words = envs.make(name).action_words
  ids = [tok.single_token_id(w) for w in words]
  assert len(set(ids)) == len(words)


@pytest.mark.parametrize("letter", ["P", "F", "H", "G"])
def test_board_cells_are_one_token(tok, letter):
  tok.single_token_id(letter)       # First cell of a row.
  tok.single_token_id(" " + letter)  # Any other cell, with its separator.


@pytest.mark.parametrize("size", [3, 4, 5, 6])
def test_board_costs_one_token_per_cell_plus_line_breaks(tok, size):
  # 4x4: 16 cell tokens + 3 line breaks = 19 tokens, 1.19 per cell.
  env = envs.make("frozenlake", size=size, max_turns=4 * size)
  rng = np.random.default_rng(size)
  for seed in range(30):
    env.reset(seed)
    for _ in range(3):
      assert len(tok.encode(env.board_text())) == size * size + size - 1
      if env.step(env.action_words[rng.integers(4)]).done:
        break


def test_observations_are_compact(tok):
  # Measured on 300 default episodes with the shipped model (trained on nine envs' text): first
  # observation 35 tokens, move feedback + board 22, invalid-action feedback quoting junk + board
  # up to 51.
  frozenlake = [len(tok.encode(t)) for t in _env_texts("frozenlake")]
  assert max(frozenlake) <= 56
  dd = [len(tok.encode(t)) for t in _env_texts("dd_chain")]
  assert max(dd) <= 25


@pytest.mark.parametrize("name", ["frozenlake", "dd_chain"])
def test_env_text_round_trips(tok, name):
  for text in _env_texts(name, episodes=10):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert 1 not in ids  # Env text never needs the unknown piece.


@pytest.mark.parametrize("text", TRICKY_TEXTS)
def test_tricky_text_round_trips(tok, text):
  assert tok.decode(tok.encode(text)) == text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_unicode_round_trips(text):
  tok = _shipped()  # Not a fixture: hypothesis reruns the body without re-entering fixtures.
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert all(0 <= i < tok.vocab_size for i in ids)


def test_encode_is_deterministic_and_bos_eos_free(tok):
  text = "moved right\nF P F F"
  assert tok.encode(text) == tok.encode(text)
  assert tok.eos_id not in tok.encode(text) and tok.bos_id not in tok.encode(text)


def test_decode_accepts_arrays_and_drops_padding(tok):
  ids = tok.encode("turn 3 of 16")
  assert tok.decode(np.asarray(ids, dtype=np.int32)) == "turn 3 of 16"
  assert tok.decode(ids + [tok.pad_id] * 3) == "turn 3 of 16"


def test_lookup_errors_are_clear(tok):
  with pytest.raises(ValueError, match="no piece 'zebra'"):
    tok.piece_id("zebra")
  with pytest.raises(ValueError, match=r"'left right' encodes to 2 tokens \['left', '▁right'\]"):
    tok.single_token_id("left right")
  with pytest.raises(ValueError, match="encodes to 0 tokens"):
    tok.single_token_id("")
  with pytest.raises(TypeError, match="str"):
    tok.encode(None)


def test_pickles(tok):
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.encode("reach G") == tok.encode("reach G")


def test_load_missing_or_corrupt_model_names_the_path(tmp_path):
  missing = tmp_path / "nope.model"
  with pytest.raises(FileNotFoundError, match="nope.model"):
    tokenizer_lib.load_tokenizer(missing)
  corrupt = tmp_path / "corrupt.model"
  corrupt.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="corrupt.model"):
    tokenizer_lib.load_tokenizer(corrupt)


def test_training_is_deterministic_and_keeps_the_id_layout(tmp_path):
  texts = _env_texts("frozenlake", episodes=30) + ["left", "down", "right", "up"] * 50
  a = tokenizer_lib.train_tokenizer(texts, tmp_path / "a.model", 300)
  b = tokenizer_lib.train_tokenizer(texts, tmp_path / "b.model", 300)
  assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
  assert (tmp_path / "a.vocab").read_text() == (tmp_path / "b.vocab").read_text()
  assert a.vocab_size == 300 and a.pad_id == 0 and a.eos_id == 3
  assert (a.obs_id, a.act_id, a.end_id) == (b.obs_id, b.act_id, b.end_id)
  assert a.decode(a.encode(texts[0])) == texts[0]


def test_training_rejects_bad_arguments(tmp_path):
  with pytest.raises(ValueError, match="reserved"):
    tokenizer_lib.train_tokenizer(["a b"], tmp_path / "t.model", 100)
  with pytest.raises(ValueError, match=".model"):
    tokenizer_lib.train_tokenizer(["a b"], tmp_path / "t.bin", 512)
  with pytest.raises(ValueError, match="non-empty"):
    tokenizer_lib.train_tokenizer(["", ""], tmp_path / "t.model", 512)


def test_build_script_reproduces_the_shipped_model(tmp_path):
  output = tmp_path / "rebuilt.model"
  env = dict(os.environ, PYTHONPATH=_ROOT)
  run = subprocess.run(
      [sys.executable, os.path.join(_ROOT, "experiments", "build_tokenizer.py"),
       f"--output={output}"], env=env, check=True, capture_output=True, text=True)
  assert "vocab size: 1024" in run.stdout
  shipped = tokenizer_lib.default_model_path()
  with open(shipped, "rb") as f:
    assert output.read_bytes() == f.read(), "rerun experiments/build_tokenizer.py and ship it"
