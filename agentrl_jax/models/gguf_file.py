"""The GGUF container: its metadata and tensor directory, parsed without reading tensor data.

GGUF (llama.cpp's format, versions 2 and 3, little-endian) is a header — magic `GGUF`, version,
tensor count, key/value count — then the key/value metadata, then one record per tensor (name,
dimensions with the fastest axis first, type, offset), then the tensor data from the next multiple
of `general.alignment` (32 by default).

`gguf.GGUFReader` builds NumPy views for every part of every field, 6–10 s for SmolLM2's 49,152
tokens and 48,900 merges on 2 shared cores; decoding the metadata straight into Python values takes a
fraction of a second. The tensor data stays on disk (a read-only memory map) until a tensor is
asked for; dequantizing it is the `gguf` package's job (`models/gguf.py`).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_FIRST_READ = 1 << 22  # bytes read for the header at first (SmolLM2's is 1.8 MB)

# Value type id -> (struct format, size) of the scalar types; 8 is a string, 9 an array.
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
          10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
  """The bytes are not a well-formed GGUF file (the message says where they stop making sense)."""


class GGUFTruncatedError(GGUFFormatError):
  """The header runs past the end of the file."""


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
  """One tensor's directory record.

  Attributes:
    name: e.g. "blk.0.attn_q.weight".
    shape: dimensions as GGUF lists them, the fastest-varying (input features) first.
    type_id: the `gguf.GGMLQuantizationType` value.
    data_offset: absolute byte offset of its data in the file.
  """

  name: str
  shape: tuple[int, ...]
  type_id: int
  data_offset: int


class _NeedMore(Exception):
  """The header goes on past the bytes read so far (but not past the file)."""


class _Cursor:
  """Reads little-endian values from the first bytes of a file of `size` bytes."""

  def __init__(self, buffer: memoryview, size: int):
    self.buffer, self.size, self.pos = buffer, size, 0

  def take(self, n: int) -> memoryview:
    if self.pos + n > self.size:
      raise GGUFTruncatedError(f"the file ends at byte {self.size}, but its header needs {n} more "
                            f"bytes at byte {self.pos}")
    if self.pos + n > len(self.buffer):
      raise _NeedMore
    out = self.buffer[self.pos:self.pos + n]
    self.pos += n
    return out

  def scalar(self, type_id: int):
    fmt, size = _SCALARS[type_id]
    return struct.unpack(fmt, self.take(size))[0]

  def string(self) -> str:
    n = self.scalar(10)
    raw = self.take(n)
    try:
      return str(raw, "utf-8")
    except UnicodeDecodeError as e:
      raise GGUFFormatError(f"a string at byte {self.pos - n} is not UTF-8 ({e.reason})") from None

  def value(self, type_id: int) -> Any:
    if type_id in _SCALARS:
      return self.scalar(type_id)
    if type_id == _STRING:
      return self.string()
    if type_id != _ARRAY:
      raise GGUFFormatError(f"unknown value type {type_id} at byte {self.pos - 4}")
    item_type, count = self.scalar(4), self.scalar(10)
    if item_type in _NUMPY:  # numbers: one read, not one struct call per item
      size = _SCALARS[item_type][1]
      values = np.frombuffer(self.take(count * size), _NUMPY[item_type])
      return values.astype(bool).tolist() if item_type == 7 else values.tolist()
    return [self.value(item_type) for _ in range(count)]


@dataclasses.dataclass(frozen=True, slots=True)
class GGUFFile:
  """A parsed GGUF file.

  Attributes:
    path: the file.
    version: the format version (2 or 3).
    metadata: every key with its decoded value (str, int, float, bool, or a list of them).
    tensors: the tensor directory, in file order.
    size: the file's size in bytes.
  """

  path: str
  version: int
  metadata: dict[str, Any]
  tensors: tuple[TensorInfo, ...]
  size: int

  def raw(self, tensor: TensorInfo, n_bytes: int) -> np.ndarray:
    """The tensor's `n_bytes` of data as a read-only uint8 memory map."""
    return np.memmap(self.path, np.uint8, mode="r", offset=tensor.data_offset, shape=(n_bytes,))


def read(path: str) -> GGUFFile:
  """Parses `path`'s header, metadata and tensor directory (no tensor data is read).

  Raises:
    GGUFFormatError: when the magic or version is wrong, or the header runs past the end of the
      file or holds an unknown value type or a repeated tensor name.
  """
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    # The header is small next to the tensors (1.8 MB of SmolLM2's 93): read the file's start,
    # four times more of it each time the header turns out longer.
    chunk = min(size, _FIRST_READ)
    while True:
      f.seek(0)
      try:
        return _parse(path, memoryview(f.read(chunk)), size)
      except _NeedMore:
        chunk = min(size, chunk * 4)


def _parse(path: str, buffer: memoryview, size: int) -> GGUFFile:
  cursor = _Cursor(buffer, size)
  magic = bytes(cursor.take(4))
  if magic != MAGIC:
    raise GGUFFormatError(f"starts with {magic!r}, not {MAGIC!r}")
  version = cursor.scalar(4)
  if version not in VERSIONS:
    swapped = struct.unpack(">I", struct.pack("<I", version))[0]
    order = " (a big-endian file)" if swapped in VERSIONS else ""
    raise GGUFFormatError(f"unsupported GGUF version {version}{order}; supported: {list(VERSIONS)}")
  num_tensors, num_keys = cursor.scalar(10), cursor.scalar(10)
  metadata = {}
  for _ in range(num_keys):
    key = cursor.string()
    metadata[key] = cursor.value(cursor.scalar(4))
  records = []
  for _ in range(num_tensors):
    name = cursor.string()
    dims = tuple(cursor.scalar(10) for _ in range(cursor.scalar(4)))
    records.append((name, dims, cursor.scalar(4), cursor.scalar(10)))
  alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
  start = -(-cursor.pos // alignment) * alignment
  names = [r[0] for r in records]
  if len(set(names)) != len(names):
    repeated = sorted({n for n in names if names.count(n) > 1})
    raise GGUFFormatError(f"tensor names {repeated[:3]} appear more than once")
  tensors = tuple(TensorInfo(name, dims, type_id, start + offset)
                  for name, dims, type_id, offset in records)
  return GGUFFile(path=path, version=version, metadata=metadata, tensors=tensors, size=size)
