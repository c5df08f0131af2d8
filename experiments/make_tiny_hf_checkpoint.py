r"""Writes a tiny random Qwen2 (or Llama) checkpoint directory in the Hugging Face layout.

It stands in for a downloaded checkpoint in tests and in `configs/hf_tiny_qwen2_grpo.gin`:
config.json + model.safetensors, readable by `transformers` and by `agentrl_jax.models.hf`.
The vocabulary defaults to the shipped SentencePiece tokenizer's size (1024 pieces), so that
tokenizer works with it.

  python experiments/make_tiny_hf_checkpoint.py --out=/tmp/tiny_qwen2
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

try:
  import agentrl_jax  # noqa: F401
except ModuleNotFoundError:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from agentrl_jax.models import hf  # noqa: E402
from agentrl_jax.models import tokenizer as tokenizer_lib  # noqa: E402
from agentrl_jax.models import transformer  # noqa: E402


def shipped_vocab_size() -> int:
  """The vocabulary size of the SentencePiece tokenizer shipped with the package (1024)."""
  return tokenizer_lib.load_tokenizer().vocab_size


def tiny_config(model_type: str, vocab_size: int | None = None) -> transformer.TransformerConfig:
  """2 layers, width 64, 4 query heads over 2 kv heads, the family's biases and RoPE."""
  vocab_size = shipped_vocab_size() if vocab_size is None else vocab_size
  common = dict(vocab_size=vocab_size, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                mlp_dim=256, position="rope", tie_embeddings=True)
  if model_type == "qwen2":
    return transformer.TransformerConfig(qkv_bias=True, rope_theta=1_000_000.0, norm_eps=1e-6,
                                         **common)
  if model_type == "llama":
    return transformer.TransformerConfig(qkv_bias=False, rope_theta=500_000.0, norm_eps=1e-5,
                                         rope_scaling_factor=32.0, rope_original_max_position=64,
                                         **common)
  raise ValueError(f"model_type must be 'qwen2' or 'llama', got {model_type!r}")


def write(out: str, model_type: str = "qwen2", vocab_size: int | None = None,
          seed: int = 0) -> transformer.TransformerConfig:
  """Writes the checkpoint to `out` and returns its config."""
  config = tiny_config(model_type, vocab_size)
  _, params = transformer.create(config, seed)
  hf.export(out, config, params, model_type=model_type)
  return config


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="checkpoint directory to write")
  parser.add_argument("--model_type", default="qwen2", choices=["qwen2", "llama"])
  parser.add_argument("--vocab_size", type=int, default=None,
                      help="default: the shipped SentencePiece tokenizer's")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  config = write(args.out, args.model_type, args.vocab_size, args.seed)
  print(f"wrote a {args.model_type} checkpoint ({transformer.num_params(config):,} parameters) "
        f"to {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
