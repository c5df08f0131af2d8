"""`agentrl_search_qa_tasks`: frozen multi-hop questions over the synthetic corpus."""

from __future__ import annotations

from agentrl_jax.envs import search_qa
from agentrl_jax.envs.tasksets import common


class AgentrlSearchQaTasks(common.TaskSetBuilder):
  """Multi-hop questions of the `search_qa` env with their answers and evidence documents."""

  make_task = staticmethod(search_qa.make_task)
