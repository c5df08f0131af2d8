"""SentencePiece tokenizer: train on environment text, load, encode and decode exactly.

The shipped model (`assets/tokenizer/agentrl_envs.model`, built by `experiments/build_tokenizer.py`
from text the built-in environments produce) is small on purpose: a 1024-piece vocabulary keeps
the tiny policy's embedding small, and every action word and board cell is one token.

Exactness: `decode(encode(text)) == text` for every string. Training keeps text as is (identity
normalisation, no dummy prefix, no whitespace folding) and byte fallback covers characters the
vocabulary lacks. The one character SentencePiece cannot carry through its own encoder is its
whitespace marker U+2581 ("▁"), which it decodes as a space; `Tokenizer.encode` routes that
character through its UTF-8 byte pieces instead.

Fixed ids: pad 0, unk 1, bos 2, eos 3, then the conversation markers "<|obs|>", "<|act|>",
"<|end|>" and the newline piece. `encode` never adds bos/eos; the rollout places markers itself.
"""

from __future__ import annotations

import importlib.resources
import io
import os
from collections.abc import Iterable
from typing import Any

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
OBS_PIECE, ACT_PIECE, END_PIECE = "<|obs|>", "<|act|>", "<|end|>"
# "\n" is a user-defined piece so multi-line observations (boards) spend one token per line
# break instead of a byte-fallback token the model must learn separately from its context.
USER_DEFINED_PIECES = (OBS_PIECE, ACT_PIECE, END_PIECE, "\n")
DEFAULT_MODEL_NAME = "agentrl_envs.model"

_WHITESPACE_MARKER = "\u2581"


def default_model_path() -> str:
  """Path of the tokenizer shipped in `agentrl_jax/assets/tokenizer/`."""
  return str(importlib.resources.files("agentrl_jax") / "assets" / "tokenizer" /
             DEFAULT_MODEL_NAME)


class Tokenizer:
  """An exact, bos/eos-free wrapper around a `SentencePieceProcessor`.

  Build with `load_tokenizer` or `train_tokenizer`. Instances pickle (the processor carries its
  serialized model), so rollout workers can receive one.
  """

  def __init__(self, processor: spm.SentencePieceProcessor, source: str = "<memory>"):
    """Wraps `processor` after checking it has this library's fixed ids and pieces.

    Args:
      processor: a loaded SentencePiece model.
      source: where it came from, quoted in errors.

    Raises:
      ValueError: if the model's special ids or marker pieces differ from the fixed layout.
    """
    self._sp = processor
    self.source = source
    fixed = {"pad": (processor.pad_id(), PAD_ID), "unk": (processor.unk_id(), UNK_ID),
             "bos": (processor.bos_id(), BOS_ID), "eos": (processor.eos_id(), EOS_ID)}
    for label, (got, want) in fixed.items():
      if got != want:
        raise ValueError(f"tokenizer {source}: {label}_id is {got}, expected {want}")
    for piece in USER_DEFINED_PIECES:
      self.piece_id(piece)  # Raises, naming the piece, on a model trained without markers.
    self._marker_ids = [self._byte_id(b) for b in _WHITESPACE_MARKER.encode("utf-8")]

  @property
  def vocab_size(self) -> int:
    return self._sp.vocab_size()

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def bos_id(self) -> int:
    return BOS_ID

  @property
  def obs_id(self) -> int:
    return self.piece_id(OBS_PIECE)

  @property
  def act_id(self) -> int:
    return self.piece_id(ACT_PIECE)

  @property
  def end_id(self) -> int:
    return self.piece_id(END_PIECE)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without bos/eos; `decode` inverts it exactly.

    Args:
      text: any string. The marker strings ("<|obs|>", ...) inside it become their single ids.

    Returns:
      A list of Python ints.
    """
    if not isinstance(text, str):
      raise TypeError(f"encode expects str, got {type(text).__name__}")
    if _WHITESPACE_MARKER not in text:
      return self._sp.encode(text)
    ids: list[int] = []
    for i, part in enumerate(text.split(_WHITESPACE_MARKER)):
      if i:
        ids.extend(self._marker_ids)
      if part:
        ids.extend(self._sp.encode(part))
    return ids

  def decode(self, ids: Iterable[Any]) -> str:
    """Text of `ids` (any iterable of ints, including NumPy/JAX arrays); pad/bos/eos vanish."""
    return self._sp.decode([int(i) for i in ids])

  def pieces(self, ids: Iterable[Any]) -> list[str]:
    """The vocabulary piece of each id, for debugging and error messages."""
    return [self._sp.id_to_piece(int(i)) for i in ids]

  def piece_id(self, piece: str) -> int:
    """Id of the vocabulary piece `piece`.

    Raises:
      ValueError: if `piece` is not in the vocabulary.
    """
    pid = self._sp.piece_to_id(piece)
    # piece_to_id answers unk_id for unknown pieces instead of failing.
    if self._sp.id_to_piece(pid) != piece:
      raise ValueError(f"tokenizer {self.source}: no piece {piece!r} in the vocabulary")
    return pid

  def single_token_id(self, text: str) -> int:
    """Id of `text` when it encodes to exactly one token (action words, board cells).

    Raises:
      ValueError: naming `text` and its pieces when it takes zero or several tokens.
    """
    ids = self.encode(text)
    if len(ids) != 1:
      raise ValueError(
          f"{text!r} encodes to {len(ids)} tokens {self.pieces(ids)}, not exactly one")
    return ids[0]

  def __repr__(self) -> str:
    return f"Tokenizer(source={self.source!r}, vocab_size={self.vocab_size})"

  def _byte_id(self, byte: int) -> int:
    try:
      return self.piece_id(f"<0x{byte:02X}>")
    except ValueError:
      raise ValueError(
          f"tokenizer {self.source}: model lacks byte-fallback pieces; train it with "
          "byte_fallback=True") from None


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Tokenizer:
  """Loads a SentencePiece model; by default the one shipped with the package.

  Args:
    path: a `.model` file, or None for `default_model_path()`.

  Returns:
    The tokenizer.

  Raises:
    FileNotFoundError: if `path` does not exist.
    ValueError: if the file is not a usable SentencePiece model.
  """
  path = default_model_path() if path is None else os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"tokenizer model not found: {path}")
  processor = spm.SentencePieceProcessor()
  try:
    processor.Load(model_file=path)
  except (OSError, RuntimeError) as e:
    raise ValueError(f"cannot load SentencePiece model {path}: {e}") from e
  return Tokenizer(processor, source=path)


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | os.PathLike[str],
    vocab_size: int,
    *,
    model_type: str = "bpe",
    seed: int = 0,
    hard_vocab_limit: bool = True,
) -> Tokenizer:
  """Trains a SentencePiece model on `texts`, writes `model_path` (+ `.vocab`), returns it.

  Training is deterministic: fixed seed, one thread, the input used whole and in order. The
  `.vocab` file lists `id<TAB>piece<TAB>score` with pieces escaped (`repr`-style), since
  SentencePiece's own vocab file breaks on the newline piece.

  Args:
    texts: training strings, each one "sentence" (newlines inside are kept as text).
    model_path: output path ending in `.model`; parent directories are created.
    vocab_size: total pieces including the 4 control ids, the user-defined pieces and the 256
      byte-fallback pieces, so it must exceed 264.
    model_type: "unigram" or "bpe".
    seed: SentencePiece's random seed.
    hard_vocab_limit: False lets a small corpus yield fewer than `vocab_size` pieces.

  Returns:
    The trained tokenizer, loaded from `model_path`.
  """
  model_path = os.fspath(model_path)
  if not model_path.endswith(".model"):
    raise ValueError(f"model_path must end in '.model', got {model_path!r}")
  reserved = 4 + len(USER_DEFINED_PIECES) + 256
  if vocab_size <= reserved:
    raise ValueError(f"vocab_size must exceed the {reserved} reserved pieces, got {vocab_size}")
  sentences = _training_sentences(texts)

  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(sentences),
      model_writer=model,
      vocab_size=vocab_size,
      model_type=model_type,
      hard_vocab_limit=hard_vocab_limit,
      byte_fallback=True,
      character_coverage=1.0,
      normalization_rule_name="identity",
      add_dummy_prefix=False,
      remove_extra_whitespaces=False,
      split_digits=False,
      pad_id=PAD_ID,
      unk_id=UNK_ID,
      bos_id=BOS_ID,
      eos_id=EOS_ID,
      user_defined_symbols=list(USER_DEFINED_PIECES),
      input_sentence_size=0,
      shuffle_input_sentence=False,
      num_threads=1,
      minloglevel=2,
  )

  os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
  with open(model_path, "wb") as f:
    f.write(model.getvalue())
  processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
  _write_vocab(processor, model_path[:-len(".model")] + ".vocab")
  return Tokenizer(processor, source=model_path)


def _training_sentences(texts: Iterable[str]) -> list[str]:
  sentences = []
  for i, text in enumerate(texts):
    if not isinstance(text, str):
      raise TypeError(f"texts[{i}] is {type(text).__name__}, not str")
    if text:
      sentences.append(text)
  if not sentences:
    raise ValueError("train_tokenizer needs at least one non-empty text")
  return sentences


def _write_vocab(processor: spm.SentencePieceProcessor, path: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for i in range(processor.vocab_size()):
      piece = processor.id_to_piece(i).encode("unicode_escape").decode("ascii")
      f.write(f"{i}\t{piece}\t{processor.get_score(i):.6g}\n")


__all__ = [
    "ACT_PIECE",
    "BOS_ID",
    "END_PIECE",
    "EOS_ID",
    "OBS_PIECE",
    "PAD_ID",
    "Tokenizer",
    "UNK_ID",
    "USER_DEFINED_PIECES",
    "default_model_path",
    "load_tokenizer",
    "train_tokenizer",
]
