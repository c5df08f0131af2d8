"""Tests of the TFDS task sets: build tiny ones, read them back with tfds.data_source."""

import sys

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from agentrl_jax.envs import search_qa  # pylint: disable=g-import-not-at-top
from agentrl_jax.envs import sql
from agentrl_jax.envs import tool_use
from agentrl_jax.envs.tasksets import common
from agentrl_jax.envs.tasksets import search_qa_tasks
from agentrl_jax.envs.tasksets import sql_tasks
from agentrl_jax.envs.tasksets import tool_use_tasks

BUILDERS = [
    (sql_tasks.AgentrlSqlTasks, "agentrl_sql_tasks", sql.make_task, sql.TextToSQL),
    (search_qa_tasks.AgentrlSearchQaTasks, "agentrl_search_qa_tasks", search_qa.make_task,
     search_qa.SearchQA),
    (tool_use_tasks.AgentrlToolUseTasks, "agentrl_tool_use_tasks", tool_use.make_task,
     tool_use.CustomerService),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tasksets"))
  for builder_cls, _, _, _ in BUILDERS:
    builder_cls(config="tiny", data_dir=path).download_and_prepare(file_format="array_record")
  return path


@pytest.mark.parametrize("builder_cls, name, make_task, env_cls", BUILDERS)
def test_records_are_the_generator_tasks(data_dir, builder_cls, name, make_task, env_cls):
  del builder_cls, env_cls
  for split, first, count in (("train", 0, 8), ("test", common.TEST_SEED_OFFSET, 4)):
    source = tfds.data_source(f"{name}/tiny", data_dir=data_dir, split=split)
    assert len(source) == count
    reader = common.TaskSource(f"{name}/tiny", data_dir, split)
    seeds = set()
    for i in range(count):
      record = reader.record(i)
      seeds.add(record["seed"])
      assert record["task"] == make_task(record["seed"])
    assert seeds == set(range(first, first + count))


@pytest.mark.parametrize("builder_cls, name, make_task, env_cls", BUILDERS)
def test_env_plays_tasks_from_the_task_set(data_dir, builder_cls, name, make_task, env_cls):
  del builder_cls, make_task
  env = env_cls(data_dir=data_dir, taskset=f"{name}/tiny", split="test")
  for seed in range(4):
    env.reset(seed)
    assert env.task == common.TaskSource(f"{name}/tiny", data_dir, "test").task(seed)
    while True:
      result = env.step(env.expert_action())
      if result.done:
        break
    assert result.info["success"]


def test_missing_task_set_is_a_clear_error(tmp_path):
  with pytest.raises(ValueError, match="cannot read task set"):
    sql.TextToSQL(data_dir=str(tmp_path), taskset="agentrl_sql_tasks/tiny")


def test_reading_needs_no_tensorflow(data_dir):
  common.TaskSource("agentrl_sql_tasks/tiny", data_dir, "train").task(0)
  assert "tensorflow" not in sys.modules
