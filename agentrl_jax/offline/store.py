"""A trajectory store: rollouts on disk as TensorFlow-Datasets array_record datasets.

Every offline and batch-online method (DRIFT, Iterative GRPO) logs what a policy did and trains
on it later. One write is one dataset, tagged by the policy version that produced it:

    store = TrajectoryStore("/tmp/run/trajectories")
    store.write(traj, seeds=seeds, policy_version=3)   # -> policy_000003/part_0000
    batch, seeds = store.read(3)                       # the same Trajectories, exactly

Each record is one trajectory (one row of the batch) with its episode seed, its row index and the
policy version. Records are built with a `GeneratorBasedBuilder` and
`download_and_prepare(file_format="array_record")`, and read back with `tfds.data_source`
(random access, no TensorFlow; `as_dataset` would need TensorFlow and is never used).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any, Sequence

import jax
import numpy as np
import tensorflow_datasets as tfds

from agentrl_jax import extra_keys
from agentrl_jax import types

DATASET_NAME = "agentrl_trajectories"

# Fields of `types.Trajectories` stored per row, with their dtypes; the row's slice of a [B, L]
# or [B, N] field is a 1-D tensor, a [B] field a scalar.
_TOKEN_FIELDS = {"tokens": np.int32, "action_mask": np.bool_, "turn_of_token": np.int32,
                 "sample_logprob": np.float32}
_TURN_FIELDS = {"turn_mask": np.bool_, "reward": np.float32, "done": np.bool_,
                "obs_hash": np.int32, "action_valid": np.bool_, "env_error": np.bool_,
                "turn_start": np.int32, "turn_end": np.int32}
_ROW_FIELDS = {"group_id": np.int32, "outcome": np.float32, "success": np.bool_}


def _features() -> tfds.features.FeaturesDict:
  spec: dict[str, Any] = {}
  for name, dtype in {**_TOKEN_FIELDS, **_TURN_FIELDS}.items():
    spec[name] = tfds.features.Tensor(shape=(None,), dtype=dtype)
  for name, dtype in _ROW_FIELDS.items():
    spec[name] = tfds.features.Scalar(dtype=dtype)
  spec.update({
      "seed": tfds.features.Scalar(dtype=np.int64),
      "row": tfds.features.Scalar(dtype=np.int64),
      "policy_version": tfds.features.Scalar(dtype=np.int64),
      # Named sub-outcomes differ between envs; JSON keeps the schema fixed. float32 -> Python
      # float -> JSON repr -> float32 is exact.
      "sub_outcomes": tfds.features.Text(),
  })
  return tfds.features.FeaturesDict(spec)


class AgentrlTrajectories(tfds.core.GeneratorBasedBuilder):
  """Logged multi-turn trajectories of one policy version (one record per episode)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}

  def __init__(self, *, records: Sequence[dict[str, Any]] = (), **kwargs):
    # The records to write travel with the builder: nothing is downloaded, and a builder made
    # only to read (records empty) never generates.
    self._records = list(records)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, description=self.__doc__, features=_features(),
                                 supervised_keys=None)

  def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
    del dl_manager  # Everything is generated from the records.
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for record in self._records:
      yield int(record["row"]), record


def dataset_tag(policy_version: int) -> str:
  return f"policy_{policy_version:06d}"


def _records(traj: types.Trajectories, seeds: Sequence[int], policy_version: int) -> list[dict]:
  host = {name: np.asarray(getattr(traj, name))
          for name in (*_TOKEN_FIELDS, *_TURN_FIELDS, *_ROW_FIELDS)}
  records = []
  for b in range(traj.batch_size):
    record: dict[str, Any] = {name: host[name][b] for name in host}
    record.update(seed=int(seeds[b]), row=b, policy_version=int(policy_version),
                  sub_outcomes=json.dumps({k: float(np.asarray(v)[b])
                                           for k, v in sorted(traj.sub_outcomes.items())}))
    records.append(record)
  return records


class TrajectoryStore:
  """Batches under `root/policy_<version>/part_<k>/`, one TFDS dataset per written batch.

  A policy version may log several batches (parts); `read(version)` returns them all as one batch.
  """

  def __init__(self, root: str | os.PathLike[str]):
    self.root = os.fspath(root)

  def path(self, policy_version: int, part: int = 0) -> str:
    return os.path.join(self.root, dataset_tag(policy_version), f"part_{part:04d}")

  def versions(self) -> list[int]:
    """Policy versions with at least one complete batch on disk, ascending."""
    if not os.path.isdir(self.root):
      return []
    return sorted(int(e[7:]) for e in os.listdir(self.root)
                  if e.startswith("policy_") and e[7:].isdigit() and self.parts(int(e[7:])))

  def parts(self, policy_version: int) -> list[int]:
    """Complete parts written for `policy_version`, ascending (an interrupted write is ignored)."""
    folder = os.path.join(self.root, dataset_tag(policy_version))
    if not os.path.isdir(folder):
      return []
    return sorted(int(e[5:]) for e in os.listdir(folder)
                  if e.startswith("part_") and e[5:].isdigit()
                  and _complete(os.path.join(folder, e)))

  def write(self, traj: types.Trajectories, *, seeds: Sequence[int], policy_version: int,
            part: int = 0) -> str:
    """Writes one batch produced by policy `policy_version`; returns its directory.

    Raises:
      ValueError: the batch carries `extras` (not stored), `seeds` has the wrong length, the
        version or part is negative, or that part already exists.
    """
    traj = jax_free(traj)
    traj.validate()
    if traj.extras:
      raise ValueError(f"TrajectoryStore.write: extras {sorted(traj.extras)} are not stored; "
                       "drop them or recompute them after reading")
    if len(seeds) != traj.batch_size:
      raise ValueError(f"TrajectoryStore.write: {len(seeds)} seeds for {traj.batch_size} trajectories")
    if policy_version < 0 or part < 0:
      raise ValueError(f"TrajectoryStore.write: policy_version and part must be >= 0, got "
                       f"{policy_version}, {part}")
    path = self.path(policy_version, part)
    if _complete(path):
      raise ValueError(f"TrajectoryStore.write: {path} already holds policy version "
                       f"{policy_version} part {part}")
    builder = AgentrlTrajectories(records=_records(traj, seeds, policy_version), data_dir=path)
    # TFDS announces every build on stdout and draws progress bars: one per logged batch would
    # bury the training's own progress line.
    tfds.display_progress_bar(False)
    try:
      with contextlib.redirect_stdout(io.StringIO()):
        builder.download_and_prepare(file_format="array_record")
    finally:
      tfds.display_progress_bar(True)
    return path

  def read(self, policy_version: int, part: int | None = None
           ) -> tuple[types.Trajectories, np.ndarray]:
    """The batch(es) written for `policy_version` and their episode seeds [B].

    One part comes back exactly as written; all parts (`part=None`) are concatenated in order,
    shorter token rows padded as the rollout pads them.

    Raises:
      ValueError: nothing was written for this version (or part).
    """
    parts = self.parts(policy_version) if part is None else [part]
    if not parts or not all(_complete(self.path(policy_version, p)) for p in parts):
      raise ValueError(f"TrajectoryStore.read: no trajectories for policy version "
                       f"{policy_version}{'' if part is None else f' part {part}'} under "
                       f"{self.root} (have versions {self.versions()})")
    batches, seeds = [], []
    for p in parts:
      source = tfds.data_source(DATASET_NAME, data_dir=self.path(policy_version, p),
                                split="train", download=False)
      rows = sorted((source[i] for i in range(len(source))), key=lambda r: int(r["row"]))
      batches.append(rows)
      seeds.extend(int(r["seed"]) for r in rows)
    width = max(len(r["tokens"]) for rows in batches for r in rows)
    return _stack([r for rows in batches for r in rows], width), np.asarray(seeds, np.int64)


def _complete(path: str) -> bool:
  # TFDS writes into an `incomplete.*` folder and renames it to the version when done.
  return os.path.isdir(os.path.join(path, DATASET_NAME, str(AgentrlTrajectories.VERSION)))


def jax_free(traj: types.Trajectories) -> types.Trajectories:
  """The batch as host NumPy arrays (a device batch is fetched once)."""
  return jax.tree.map(np.asarray, jax.device_get(traj))


_TOKEN_PAD = {"tokens": 0, "action_mask": False, "turn_of_token": -1, "sample_logprob": 0.0}


def _stack(rows: list[dict[str, Any]], width: int) -> types.Trajectories:
  fields: dict[str, Any] = {}
  for name, dtype in {**_TOKEN_FIELDS, **_TURN_FIELDS, **_ROW_FIELDS}.items():
    values = [np.asarray(r[name], dtype) for r in rows]
    if name in _TOKEN_FIELDS:
      values = [np.pad(v, (0, width - len(v)), constant_values=_TOKEN_PAD[name]) for v in values]
    fields[name] = np.stack(values).astype(dtype)
  subs = [json.loads(r["sub_outcomes"].decode("utf-8") if isinstance(r["sub_outcomes"], bytes)
                     else r["sub_outcomes"]) for r in rows]
  names = sorted({k for s in subs for k in s})
  fields["sub_outcomes"] = {k: np.asarray([s.get(k, 0.0) for s in subs], np.float32) for k in names}
  return types.Trajectories(**fields)


# Written by the rollout loop under a context-window policy; the learner needs it to score the
# tokens under the sampler's attention masks (rollout/context.py).



def replayable(traj: types.Trajectories) -> types.Trajectories:
  """The batch as the store keeps it: derived extras dropped (recomputed after reading).

  Raises:
    ValueError: the batch was sampled under a context-window policy. Its per-turn context floors
      are not derived data, and without them a replay would score tokens under a different
      attention mask than they were sampled with.
  """
  if extra_keys.FLOOR_KEY in traj.extras:
    raise ValueError("TrajectoryStore: this batch was sampled under a context-window policy "
                     "(extras['context_floor']); the store does not keep floors, so offline "
                     "methods need RolloutConfig.context.policy = 'full'")
  return traj.replace(extras={})
