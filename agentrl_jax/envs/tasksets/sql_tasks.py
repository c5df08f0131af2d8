"""`agentrl_sql_tasks`: frozen Text-to-SQL tasks (schema, db_seed, question, gold_sql, tier)."""

from __future__ import annotations

from agentrl_jax.envs import sql
from agentrl_jax.envs.tasksets import common


class AgentrlSqlTasks(common.TaskSetBuilder):
  """Text-to-SQL tasks of the `sql` env: generated databases, template questions, gold SQL."""

  make_task = staticmethod(sql.make_task)
