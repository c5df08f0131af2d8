"""The GGUF container parser against the `gguf` package's own reader, on files its writer makes."""

import numpy as np
import pytest

gguf_lib = pytest.importorskip("gguf", reason="needs gguf (hf extra)")

from agentrl_jax.models import gguf_file  # noqa: E402


def _write(path, alignment=None) -> str:
  """A file with a value of every metadata type and tensors of three types."""
  writer = gguf_lib.GGUFWriter(str(path), arch="llama")
  if alignment is not None:
    writer.add_custom_alignment(alignment)
  writer.add_uint8("t.u8", 200)
  writer.add_int8("t.i8", -100)
  writer.add_uint16("t.u16", 60000)
  writer.add_int16("t.i16", -30000)
  writer.add_uint32("t.u32", 4_000_000_000)
  writer.add_int32("t.i32", -2_000_000_000)
  writer.add_float32("t.f32", 0.25)
  writer.add_uint64("t.u64", 2**63 + 5)
  writer.add_int64("t.i64", -(2**62))
  writer.add_float64("t.f64", 1e-300)
  writer.add_bool("t.bool", True)
  writer.add_string("t.str", "héllo ▁wörld")
  writer.add_array("t.ints", [3, -1, 7])
  writer.add_array("t.floats", [0.5, -2.0])
  writer.add_array("t.bools", [True, False, True])
  writer.add_array("t.strings", ["a", "", "Ġthe", "<|im_end|>"])
  rng = np.random.default_rng(0)
  writer.add_tensor("w.f32", rng.normal(size=(3, 5)).astype(np.float32))
  writer.add_tensor("w.f16", rng.normal(size=(7,)).astype(np.float16))
  q8 = gguf_lib.quants.quantize(rng.normal(size=(2, 64)).astype(np.float32),
                                gguf_lib.GGMLQuantizationType.Q8_0)
  writer.add_tensor("w.q8", q8, raw_dtype=gguf_lib.GGMLQuantizationType.Q8_0)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


@pytest.mark.parametrize("alignment, first_read", [(None, 1 << 22), (64, 16)])
def test_metadata_and_tensor_directory_equal_the_gguf_readers(tmp_path, monkeypatch, alignment,
                                                              first_read):
  # A first read of 16 bytes makes the parser read on, four times more each time.
  monkeypatch.setattr(gguf_file, "_FIRST_READ", first_read)
  path = _write(tmp_path / "every_type.gguf", alignment)
  ours, theirs = gguf_file.read(path), gguf_lib.GGUFReader(path)
  want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
  assert ours.metadata == want
  assert ours.metadata["t.u64"] == 2**63 + 5 and ours.metadata["t.bools"] == [True, False, True]
  assert [(t.name, t.shape, t.type_id, t.data_offset) for t in ours.tensors] == [
      (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), t.data_offset)
      for t in theirs.tensors]
  f32 = ours.tensors[0]
  raw = ours.raw(f32, 15 * 4).view(np.float32).reshape(5, 3)
  np.testing.assert_array_equal(raw, theirs.tensors[0].data.reshape(5, 3))


def test_a_cut_header_and_a_wrong_magic_or_version_are_named(tmp_path):
  path = _write(tmp_path / "whole.gguf")
  data = open(path, "rb").read()
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(data[:200])
  with pytest.raises(gguf_file.GGUFTruncatedError, match=r"the file ends at byte 200"):
    gguf_file.read(str(cut))
  bad = tmp_path / "magic.gguf"
  bad.write_bytes(b"GGML" + data[4:])
  with pytest.raises(gguf_file.GGUFFormatError, match=r"starts with b'GGML'"):
    gguf_file.read(str(bad))
  swapped = tmp_path / "big_endian.gguf"
  swapped.write_bytes(data[:4] + (3).to_bytes(4, "big") + data[8:])
  with pytest.raises(gguf_file.GGUFFormatError, match=r"version 50331648 \(a big-endian file\)"):
    gguf_file.read(str(swapped))
