"""Host-side text environments.

Importing this package registers the built-in environments (their modules call
`registry.register` at import); nothing else happens at import time.
"""

from agentrl_jax.envs import base
from agentrl_jax.envs import dd_chain
from agentrl_jax.envs import frozenlake
from agentrl_jax.envs import negotiation
from agentrl_jax.envs import registry
from agentrl_jax.envs import search_qa
from agentrl_jax.envs import sokoban
from agentrl_jax.envs import sql
from agentrl_jax.envs import terminal
from agentrl_jax.envs import textworld_env
from agentrl_jax.envs import textworld_express_env
from agentrl_jax.envs import tool_use
from agentrl_jax.envs import webshop_lite
from agentrl_jax.envs.base import StepResult
from agentrl_jax.envs.base import TextEnv
from agentrl_jax.envs.base import observation_hash
from agentrl_jax.envs.registry import make
from agentrl_jax.envs.registry import names
from agentrl_jax.envs.registry import register

__all__ = [
    "StepResult",
    "TextEnv",
    "base",
    "dd_chain",
    "frozenlake",
    "make",
    "names",
    "negotiation",
    "observation_hash",
    "register",
    "registry",
    "search_qa",
    "sokoban",
    "sql",
    "terminal",
    "textworld_env",
    "textworld_express_env",
    "tool_use",
    "webshop_lite",
]
