"""Builds the shipped SentencePiece tokenizer from text the registered environments produce.

Plays episodes of every registered env under a mix of expert, random and malformed actions (so
invalid-action feedback is in the corpus), trains a 512-piece model on all observation and action
text, writes it to agentrl_jax/assets/tokenizer/agentrl_envs.model (+ .vocab) and prints the vocab
size and tokens per observation. The corpus and the training are deterministic, so rerunning
reproduces the shipped file byte for byte (tests/models/test_tokenizer.py checks it).

    PYTHONPATH=. python experiments/build_tokenizer.py                  # rebuild the shipped model
    PYTHONPATH=. python experiments/build_tokenizer.py --output=/tmp/t.model

(`PYTHONPATH=.` is not needed once the package is installed with `pip install -e .`.)
Runtime: about 1 s on one CPU core. Expected output: vocab size 512; mean tokens per observation
24.8 for default frozenlake (max 52, reached only when a 16-character junk action is quoted back),
5.5 for default dd_chain; a 4x4 board costs 19 tokens (16 cells + 3 line breaks, 1.19 per cell).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np

from agentrl_jax import envs
from agentrl_jax.models import tokenizer as tokenizer_lib

VOCAB_SIZE = 1024
EPISODES_PER_CONFIG = 300
# Probability that one step plays a malformed action: enough for every feedback message to be
# frequent, small enough that boards dominate the corpus as they dominate real rollouts.
INVALID_PROB = 0.1

# Configs per env beyond its defaults, spanning the sizes experiments use so that their
# numbers and boards are in the corpus. An env missing here is played with its defaults only.
# DD-Chain stops at T = 32: every turn number of a longer chain would claim a merge, and a number
# split in two tokens costs little, while the merges buy shorter FrozenLake feedback lines.
ENV_CONFIGS: dict[str, list[dict[str, Any]]] = {
    "frozenlake": [
        {},
        {"size": 3, "max_turns": 8},
        {"size": 5, "hole_prob": 0.25, "max_turns": 16},
        {"size": 6, "hole_prob": 0.15, "max_turns": 20},
        {"hole_prob": 0.3, "slippery": 0.2},
    ],
    "dd_chain": [
        {},
        {"horizon": 4, "num_decisions": 2},
        {"horizon": 8, "num_decisions": 8},
        {"horizon": 32, "num_decisions": 8},
    ],
}

# The envs whose text the tokenizer is trained on: every env that runs without an optional engine.
# A fixed list, not the registry, keeps the model reproducible wherever the `envs` extra (TextWorld)
# is absent; TextWorld text is English prose the byte fallback and these merges cover.
CORPUS_ENVS = ("dd_chain", "frozenlake", "negotiation", "search_qa", "sokoban", "sql", "terminal",
               "tool_use", "webshop_lite")

_JUNK_WORDS = ("jump", "stay", "wait", "go", "north", "south", "east", "west", "move", "yes",
               "no", "2", "-1", "left right", "up up", "forward", "back", "none", "help", "?")


def random_junk(rng: np.random.Generator) -> Any:
  """A malformed action of the kinds an untrained policy emits."""
  kind = int(rng.integers(6))
  if kind == 0:
    return _JUNK_WORDS[int(rng.integers(len(_JUNK_WORDS)))]
  if kind == 1:
    letters = rng.choice(list("abcdefghijklmnopqrstuvwxyz0123456789 "), size=rng.integers(1, 30))
    return "".join(letters)
  if kind == 2:
    return ["", " ", "\n"][int(rng.integers(3))]
  if kind == 3:
    return "x" * int(rng.integers(17, 400))
  if kind == 4:
    return [None, 5, 1.5][int(rng.integers(3))]
  return "".join(rng.choice(list("!@#$%^&*()[]{}<>.,;:'\""), size=rng.integers(1, 8)))


def choose_action(env: envs.TextEnv, rng: np.random.Generator, expert_prob: float) -> Any:
  """Malformed with probability INVALID_PROB, else the expert's or a uniformly random action."""
  if rng.random() < INVALID_PROB:
    return random_junk(rng)
  if env.action_words is None or rng.random() < expert_prob:
    return env.expert_action()
  return env.action_words[int(rng.integers(len(env.action_words)))]


def play_episode(env: envs.TextEnv, seed: int,
                 rng: np.random.Generator) -> tuple[list[str], list[str]]:
  """Returns (observations, action texts) of one episode."""
  observations = [env.reset(seed)]
  actions = []
  expert_prob = float(rng.random())
  done = False
  while not done:
    action = choose_action(env, rng, expert_prob)
    if isinstance(action, str):
      actions.append(action)
    result = env.step(action)
    observations.append(result.observation)
    done = result.done
  return observations, actions


def collect_corpus(episodes_per_config: int = EPISODES_PER_CONFIG,
                   seed: int = 0) -> dict[str, tuple[list[str], list[str]]]:
  """Plays every registered env and config; returns "name(config)" → (observations, actions).

  The order (names sorted, configs as listed, seeds ascending) and the single Generator make
  the corpus, and so the trained model, reproducible.
  """
  rng = np.random.default_rng(seed)
  corpus = {}
  for name in CORPUS_ENVS:
    for config in ENV_CONFIGS.get(name, [{}]):
      env = envs.make(name, **config)
      observations, actions = [], []
      for episode_seed in range(episodes_per_config):
        obs, acts = play_episode(env, episode_seed, rng)
        observations.extend(obs)
        actions.extend(acts)
      # The canonical words on their own, as the policy emits them after an action marker.
      actions.extend(list(env.action_words or ()) * episodes_per_config)
      label = ", ".join(f"{k}={v}" for k, v in config.items())
      corpus[f"{name}({label})"] = (observations, actions)
  return corpus


def report(tokenizer: tokenizer_lib.Tokenizer,
           corpus: dict[str, tuple[list[str], list[str]]]) -> None:
  print(f"vocab size: {tokenizer.vocab_size}")
  for label, (observations, _) in corpus.items():
    lengths = [len(tokenizer.encode(o)) for o in observations]
    print(f"{label}: {len(observations)} observations, tokens per observation "
          f"mean {statistics.fmean(lengths):.1f}, max {max(lengths)}")
  board_cost = {}
  for size in (3, 4, 5, 6):
    env = envs.make("frozenlake", size=size, max_turns=4 * size)
    env.reset(0)
    board_cost[size] = len(tokenizer.encode(env.board_text())) / size**2
  print("frozenlake board tokens per cell (incl. separators): " +
        ", ".join(f"{s}x{s}: {c:.2f}" for s, c in board_cost.items()))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", default=tokenizer_lib.default_model_path(),
                      help="where to write the .model file (a .vocab file goes next to it)")
  parser.add_argument("--vocab_size", type=int, default=VOCAB_SIZE)
  parser.add_argument("--episodes_per_config", type=int, default=EPISODES_PER_CONFIG)
  args = parser.parse_args()

  corpus = collect_corpus(args.episodes_per_config)
  texts = [text for observations, actions in corpus.values() for text in observations + actions]
  tokenizer = tokenizer_lib.train_tokenizer(texts, args.output, args.vocab_size)
  print(f"wrote {args.output} from {len(texts)} texts")
  report(tokenizer, corpus)


if __name__ == "__main__":
  main()
