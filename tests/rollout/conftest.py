"""Fixtures every rollout test shares: the shipped tokenizer and one tiny policy (compiled once
per session, so the sampler's jitted functions are reused across test files)."""

import pytest

from agentrl_jax.models import tokenizer as tokenizer_lib
from agentrl_jax.models import transformer as tfm


@pytest.fixture(scope="session")
def tok():
  return tokenizer_lib.load_tokenizer()


@pytest.fixture(scope="session")
def model(tok):
  """(config, graphdef, params) of a 2-layer width-32 policy with turn/slot positions and ALiBi."""
  cfg = tfm.tiny(tok.vocab_size, d_model=32, num_heads=4, mlp_dim=64, position="turn_slot",
                 alibi=True, max_turns=16, max_slots=64)
  graphdef, params = tfm.create(cfg, seed=0)
  return cfg, graphdef, params
