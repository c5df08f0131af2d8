"""agentrl_jax: reinforcement learning of multi-turn LLM agents in JAX."""

__version__ = "0.1.0"
