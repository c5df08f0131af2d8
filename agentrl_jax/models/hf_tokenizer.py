"""Hugging Face `tokenizer.json` tokenizers and the Qwen2 / Llama 3 chat templates, append-only.

`HFTokenizer` wraps the `tokenizers` package (extra `hf`) with the same exact, special-token-free
`encode`/`decode` the SentencePiece `models.tokenizer.Tokenizer` offers, so the rollout can use
either. `ChatTemplate` renders a conversation one message at a time: the ids of turn k are
appended to the ids of turns < k and never re-rendered, so the sampled action ids stay in the
sequence exactly as drawn (TITO, docs/methods.md#t1). Each message's ids are its template pieces
(special tokens looked up by id) around `encode(content)`: since every boundary is a special
token, encoding the pieces separately gives the same ids as encoding the whole rendered text.

Templates (the families' published formats, without default system prompts):
  * Qwen2 (ChatML): `<|im_start|>{role}\n{content}<|im_end|>\n`, generation prompt
    `<|im_start|>assistant\n`; the assistant's turn ends with its sampled `<|im_end|>`, after which
    the template appends "\n".
  * Llama 3: `<|begin_of_text|>` once, then `<|start_header_id|>{role}<|end_header_id|>\n\n{content}
    <|eot_id|>`, generation prompt `<|start_header_id|>assistant<|end_header_id|>\n\n`; the
    assistant's turn ends with its sampled `<|eot_id|>`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Protocol


class TextTokenizer(Protocol):
  def encode(self, text: str) -> list[int]: ...
  def piece_id(self, piece: str) -> int: ...


class HFTokenizer:
  """An exact wrapper around a `tokenizer.json` (never adds bos/eos on its own)."""

  def __init__(self, path: str):
    """Loads `path` (a tokenizer.json file, or a directory holding one).

    Raises:
      ValueError: when the file is missing or the `tokenizers` package is not installed.
    """
    try:
      import tokenizers
    except ModuleNotFoundError:
      raise ValueError("HF tokenizers need the `tokenizers` package: pip install 'agentrl_jax[hf]'") from None
    if os.path.isdir(path):
      path = os.path.join(path, "tokenizer.json")
    if not os.path.exists(path):
      raise ValueError(f"tokenizer file {path!r} does not exist")
    self.source = path
    self._tok = tokenizers.Tokenizer.from_file(path)

  @classmethod
  def from_tokenizer(cls, tokenizer, source: str) -> "HFTokenizer":
    """Wraps an already built `tokenizers.Tokenizer` (e.g. one made from GGUF metadata).

    Args:
      tokenizer: the `tokenizers.Tokenizer`, used as is.
      source: where it came from, for error messages.
    """
    wrapper = cls.__new__(cls)
    wrapper.source = source
    wrapper._tok = tokenizer
    return wrapper

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def piece_id(self, piece: str) -> int:
    token_id = self._tok.token_to_id(piece)
    if token_id is None:
      raise ValueError(f"tokenizer {self.source}: no token {piece!r}")
    return token_id


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """One family's message framing; see the module docstring."""

  family: str
  bos: str | None
  header: tuple[str, str, str]  # (open, between role and content, close after content)
  after_turn: str  # text the template adds after a message's closing token

  def begin(self, tok: TextTokenizer) -> list[int]:
    """Ids that open a conversation (Llama 3: <|begin_of_text|>)."""
    return [tok.piece_id(self.bos)] if self.bos else []

  def _open(self, tok: TextTokenizer, role: str) -> list[int]:
    open_piece, sep, _ = self.header
    if self.family == "llama3":
      return [tok.piece_id(open_piece)] + tok.encode(role) + [tok.piece_id(sep)] + tok.encode("\n\n")
    return [tok.piece_id(open_piece)] + tok.encode(role + sep)

  def message(self, tok: TextTokenizer, role: str, content: str) -> list[int]:
    """Ids of one complete message (a user/system/tool turn), closing token and trailer included."""
    if not role or any(c.isspace() for c in role):
      raise ValueError(f"chat role must be a non-empty word, got {role!r}")
    return (self._open(tok, role) + tok.encode(content) + [self.end_id(tok)]
            + tok.encode(self.after_turn))

  def generation_prompt(self, tok: TextTokenizer) -> list[int]:
    """Ids that open the assistant's turn; the sampler continues from here."""
    return self._open(tok, "assistant")

  def end_id(self, tok: TextTokenizer) -> int:
    """The token that ends a message; the sampler's stop token."""
    return tok.piece_id(self.header[2])

  def after_assistant(self, tok: TextTokenizer) -> list[int]:
    """Ids the template appends after the assistant's sampled ids (which end with `end_id`)."""
    return tok.encode(self.after_turn)

  def conversation(self, tok: TextTokenizer, messages: Sequence[tuple[str, str]],
                   assistant_ids: dict[int, Sequence[int]] | None = None) -> list[int]:
    """Ids of a whole conversation built append-only, message by message.

    Args:
      messages: (role, content) pairs.
      assistant_ids: index -> the exact sampled ids of that assistant message (TITO; they must
        end with `end_id`). Assistant messages without recorded ids are encoded from content.
    """
    ids = self.begin(tok)
    for i, (role, content) in enumerate(messages):
      if role == "assistant" and assistant_ids and i in assistant_ids:
        sampled = list(assistant_ids[i])
        if not sampled or sampled[-1] != self.end_id(tok):
          raise ValueError(f"assistant message {i}: sampled ids must end with the end token "
                           f"{self.header[2]!r} (id {self.end_id(tok)}), got {sampled[-3:]}")
        ids += self.generation_prompt(tok) + sampled + self.after_assistant(tok)
      else:
        ids += self.message(tok, role, content)
    return ids


QWEN2 = ChatTemplate(family="qwen2", bos=None, header=("<|im_start|>", "\n", "<|im_end|>"),
                     after_turn="\n")
LLAMA3 = ChatTemplate(family="llama3", bos="<|begin_of_text|>",
                      header=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                      after_turn="")
TEMPLATES = {"qwen2": QWEN2, "llama": LLAMA3}


def template_for(model_type: str) -> ChatTemplate:
  """The chat template of a checkpoint's `model_type` (config.json)."""
  try:
    return TEMPLATES[model_type]
  except KeyError:
    raise ValueError(f"no chat template for model_type {model_type!r}; known: {sorted(TEMPLATES)}") from None


def render_text(template: ChatTemplate, messages: Sequence[tuple[str, str]],
                add_generation_prompt: bool = False) -> str:
  """The template's text of a conversation (what the ids decode to)."""
  open_piece, sep, close = template.header
  parts = [template.bos or ""]
  for role, content in messages:
    if template.family == "llama3":
      parts.append(f"{open_piece}{role}{sep}\n\n{content}{close}{template.after_turn}")
    else:
      parts.append(f"{open_piece}{role}{sep}{content}{close}{template.after_turn}")
  if add_generation_prompt:
    parts.append(f"{open_piece}assistant{sep}\n\n" if template.family == "llama3"
                 else f"{open_piece}assistant{sep}")
  return "".join(parts)
