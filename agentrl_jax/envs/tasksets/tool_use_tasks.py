"""`agentrl_tool_use_tasks`: frozen customer-service scenarios (orders, request, policy)."""

from __future__ import annotations

from agentrl_jax.envs import tool_use
from agentrl_jax.envs.tasksets import common


class AgentrlToolUseTasks(common.TaskSetBuilder):
  """Customer-service scenarios of the `tool_use` env: the user's orders and request."""

  make_task = staticmethod(tool_use.make_task)
