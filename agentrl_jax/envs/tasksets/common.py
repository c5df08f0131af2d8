"""Task sets as TensorFlow-Datasets builders, read back without TensorFlow.

A task set freezes the tasks a data-driven env (sql, search_qa, tool_use) would otherwise draw
from its generator by seed: each record is `{"seed": int64, "task": JSON text}`, the JSON being
exactly the env's `make_task(seed)` dict. Train seeds are 0..num_train-1; test seeds start at
`TEST_SEED_OFFSET`, so held-out tasks never share a seed with training tasks.

Build (array_record needs no TensorFlow; `as_dataset` would, so it is never used):

    builder = sql_tasks.AgentrlSqlTasks(config="tiny", data_dir=path)
    builder.download_and_prepare(file_format="array_record")

Read: `tfds.data_source("agentrl_sql_tasks/tiny", data_dir=path, split="test")`, or through
`TaskSource`, which the envs use when given `data_dir`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any, Callable

import numpy as np
import tensorflow_datasets as tfds

TEST_SEED_OFFSET = 1_000_000
# The builder modules; importing one registers its dataset name with TFDS.
BUILDER_MODULES = ("sql_tasks", "search_qa_tasks", "tool_use_tasks")


@dataclasses.dataclass
class TaskSetConfig(tfds.core.BuilderConfig):
  """Sizes of the splits.

  Attributes:
    num_train: tasks in the train split.
    num_test: tasks in the test split.
  """

  num_train: int = 2000
  num_test: int = 200


CONFIGS = (
    TaskSetConfig(name="default", description="2000 train / 200 test tasks", num_train=2000,
                  num_test=200),
    TaskSetConfig(name="tiny", description="8 train / 4 test tasks, for tests", num_train=8,
                  num_test=4),
)


def features() -> tfds.features.FeaturesDict:
  """The record layout shared by every task set."""
  return tfds.features.FeaturesDict({
      "seed": tfds.features.Scalar(dtype=np.int64),
      "task": tfds.features.Text(),
  })


class TaskSetBuilder(tfds.core.GeneratorBasedBuilder):
  """Base builder: subclasses set `make_task` (seed -> JSON-able dict) and a docstring."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = list(CONFIGS)
  make_task: Callable[[int], dict[str, Any]]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=self.__doc__, features=features(),
                                 supervised_keys=None)

  def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
    del dl_manager  # Everything is generated; nothing is downloaded.
    config = self.builder_config
    return {
        "train": self._generate_examples(0, config.num_train),
        "test": self._generate_examples(TEST_SEED_OFFSET, config.num_test),
    }

  def _generate_examples(self, first_seed: int, count: int):
    make_task = type(self).make_task
    for seed in range(first_seed, first_seed + count):
      yield seed, {"seed": seed, "task": json.dumps(make_task(seed), sort_keys=True)}


class TaskSource:
  """Random access to a built task set: `task(seed)` is record `seed % len` as a dict."""

  def __init__(self, name: str, data_dir: str, split: str = "train"):
    """Opens `name` (e.g. "agentrl_sql_tasks" or "agentrl_sql_tasks/tiny") under `data_dir`.

    Raises:
      ValueError: if the task set is not built there or the split is empty.
    """
    # Registered by name so `data_source` finds the builder's features and configs.
    for module in BUILDER_MODULES:
      importlib.import_module(f"agentrl_jax.envs.tasksets.{module}")
    try:
      self._source = tfds.data_source(name, data_dir=data_dir, split=split, download=False)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(
          f"cannot read task set {name!r} split {split!r} from {data_dir!r}: {e}; build it with "
          "the builder's download_and_prepare(file_format='array_record')") from e
    if len(self._source) == 0:
      raise ValueError(f"task set {name!r} split {split!r} in {data_dir!r} is empty")
    self.name, self.split = name, split

  def __len__(self) -> int:
    return len(self._source)

  def record(self, index: int) -> dict[str, Any]:
    """Record `index` as `{"seed": int, "task": dict}`."""
    record = self._source[index % len(self._source)]
    task = record["task"]
    if isinstance(task, bytes):
      task = task.decode("utf-8")
    return {"seed": int(record["seed"]), "task": json.loads(task)}

  def task(self, seed: int) -> dict[str, Any]:
    return self.record(seed)["task"]
