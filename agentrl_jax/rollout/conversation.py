"""How the rollout frames a conversation in tokens: the chunk each observation becomes.

The rollout never re-renders a conversation. Each turn it appends one observation chunk, the
sampler appends the action ids as drawn, and the next chunk is appended after them, so the ids the
learner scores are exactly the ids that were sampled (TITO). A `Conversation` says what a chunk
holds; two formats exist:

  * `ObsActConversation`, the framing of the shipped SentencePiece tokenizer and the tiny
    policies trained from scratch: `<|obs|> text <|act|>` every turn, no stop token of its own.
  * `ChatConversation`, a pretrained chat model's own template (`hf_tokenizer.ChatTemplate`):
    turn 0 is the template's opening, a system message holding the env's rules, the observation
    as a user message and the assistant's generation prompt; turn k > 0 is whatever the template
    writes after an assistant message, then the user message and the generation prompt. The
    template's end token is the sampler's stop token; an action cut at `max_action_tokens`
    before it is closed by the next chunk (which then opens with the end token), so every
    conversation reads as the template renders it. Optional example exchanges (an expert's
    turns of another episode, `expert_exchanges`) sit between the system message and the first
    observation: a chat model that lists or describes instead of answering sees the reply format
    once (few-shot prompting), and they are part of the prompt, never of what is trained on.

`ChatConversation`'s ids for a whole conversation equal the file's own template
(`transformers` `apply_chat_template`) with the sampled assistant ids in place
(tests/rollout/test_conversation.py).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from agentrl_jax.models import hf_tokenizer


class Conversation(Protocol):
  """A token framing of observations around sampled actions (append-only)."""

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """Tokens that end an action; the runner adds them to its sampling's stop tokens."""

  def observation(self, text: str, *, turn: int, instructions: str,
                  last_token: int | None) -> list[int]:
    """The chunk appended for turn `turn`'s observation.

    Args:
      text: the observation.
      turn: the turn it opens (0 = the episode's first observation).
      instructions: the env's rules (`TextEnv.instructions`; "" when it has none).
      last_token: the conversation's last id so far (the previous action's last token), or None
        at turn 0.
    """


class ObsActConversation:
  """`<|obs|> text <|act|>` every turn: the shipped tokenizer's framing (instructions unused)."""

  def __init__(self, tokenizer):
    """Args: tokenizer: has `obs_id`, `act_id` and exact `encode` (`models.tokenizer.Tokenizer`).

    Raises:
      ValueError: the tokenizer has no <|obs|>/<|act|> tokens (a chat model's: frame its
        episodes with `ChatConversation`).
    """
    if not (hasattr(tokenizer, "obs_id") and hasattr(tokenizer, "act_id")):
      raise ValueError(f"the <|obs|>/<|act|> framing needs the shipped tokenizer's obs and act "
                       f"tokens, which {type(tokenizer).__name__} lacks; a chat model's episodes "
                       f"are framed by conversation.ChatConversation")
    self._encode = tokenizer.encode
    self._obs_id, self._act_id = tokenizer.obs_id, tokenizer.act_id

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    # The obs/act framing's stops are whatever `SamplingConfig.stop_token_ids` names.
    return ()

  def observation(self, text: str, *, turn: int = 0, instructions: str = "",
                  last_token: int | None = None) -> list[int]:
    del turn, instructions, last_token  # every turn is framed alike
    return [self._obs_id] + self._encode(text) + [self._act_id]


class ChatConversation:
  """A chat template's framing: system (the env's rules) + user turns, the policy the assistant."""

  def __init__(self, tokenizer: hf_tokenizer.TextTokenizer, template: hf_tokenizer.ChatTemplate,
               *, default_system: str | None = None,
               examples: Sequence[tuple[str, str]] = ()):
    """Builds the fixed pieces once.

    Args:
      tokenizer: exact `encode` and `piece_id` (e.g. `gguf.tokenizer(path)`).
      template: the model's message framing.
      default_system: the system message the model's own template inserts when a conversation
        has none (`gguf.Chat.default_system`); used for envs without instructions, so the
        conversation is the one the model was tuned on.
      examples: (observation, reply) exchanges written as user/assistant messages after the
        system message of every episode (`expert_exchanges`); () for none.
    Raises:
      ValueError: a template token is not a single token of `tokenizer`, or an example's reply
        is empty.
    """
    for k, (_, reply) in enumerate(examples):
      if not reply.strip():
        raise ValueError(f"example exchange {k} has an empty reply")
    self._tok = tokenizer
    self._template = template
    self._default_system = default_system
    self.examples = tuple((str(obs), str(reply)) for obs, reply in examples)
    self._begin = template.begin(tokenizer)
    self._prompt = template.generation_prompt(tokenizer)
    self._after = template.after_assistant(tokenizer)
    self._end_id = template.end_id(tokenizer)

  def with_examples(self, examples: Sequence[tuple[str, str]]) -> "ChatConversation":
    """This framing with `examples` before every episode's first observation."""
    return ChatConversation(self._tok, self._template, default_system=self._default_system,
                            examples=examples)

  @property
  def end_id(self) -> int:
    """The token that ends a message (an assistant's: the sampler's stop token)."""
    return self._end_id

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    return (self._end_id,)

  def observation(self, text: str, *, turn: int, instructions: str = "",
                  last_token: int | None = None) -> list[int]:
    user = self._template.message(self._tok, "user", text) + self._prompt
    if turn == 0:
      system = instructions or self._default_system
      opening = self._begin + (self._template.message(self._tok, "system", system) if system else [])
      for obs, reply in self.examples:
        opening += (self._template.message(self._tok, "user", obs)
                    + self._template.message(self._tok, "assistant", reply))
      return opening + user
    # An action cut before its end token is closed here, so the assistant message is complete.
    close = [] if last_token == self._end_id else [self._end_id]
    return close + self._after + user


def expert_exchanges(env, *, seed: int, turns: int) -> list[tuple[str, str]]:
  """The first `turns` (observation, expert action) pairs of `env`'s episode `seed`.

  An example of the task played well, for `ChatConversation(examples=...)`: the env's own
  observations (first board, then feedback and board) with the moves its scripted expert makes.
  Fewer pairs when the episode ends sooner.

  Raises:
    ValueError: `turns` < 1.
  """
  if turns < 1:
    raise ValueError(f"expert_exchanges: turns must be >= 1, got {turns}")
  exchanges = []
  observation = env.reset(seed)
  for _ in range(turns):
    action = env.expert_action()
    exchanges.append((observation, action))
    result = env.step(action)
    if result.done:
      break
    observation = result.observation
  return exchanges


def transcript(conversation: Conversation, observations: Sequence[str],
               actions: Sequence[Sequence[int]], *, instructions: str = "") -> list[int]:
  """Ids of a whole conversation: observation chunks with `actions[k]` after chunk k.

  What the rollout writes for one trajectory (`len(actions)` is `len(observations)` or one
  fewer), for tests and for scoring a recorded episode again.
  """
  ids: list[int] = []
  for turn, text in enumerate(observations):
    ids += conversation.observation(text, turn=turn, instructions=instructions,
                                    last_token=ids[-1] if ids else None)
    if turn < len(actions):
      ids += list(actions[turn])
  return ids
