"""Renders a report in headless Chromium: the page draws, and the colour legend is on screen.

Skipped, with the reason, when no Chromium binary is installed (`.ci/run` installs Debian's
`chromium` package where it can).
"""

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from agentrl_jax.viewer import report

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_WIDTH, _HEIGHT = 1200, 900


def _browser() -> str | None:
  for name in _BROWSERS:
    path = shutil.which(name)
    if path:
      return path
  return None


def _paeth(a: int, b: int, c: int) -> int:
  p = a + b - c
  pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
  if pa <= pb and pa <= pc:
    return a
  return b if pb <= pc else c


def read_png(path) -> np.ndarray:
  """Decodes an 8-bit RGB or RGBA, non-interlaced PNG into a `[H, W, C]` uint8 array."""
  data = open(path, "rb").read()
  assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
  offset, idat, header = 8, [], None
  while offset < len(data):
    (length,) = struct.unpack(">I", data[offset:offset + 4])
    kind = data[offset + 4:offset + 8]
    body = data[offset + 8:offset + 8 + length]
    if kind == b"IHDR":
      header = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
      idat.append(body)
    offset += 12 + length
  width, height, depth, color_type, _, _, interlace = header
  assert depth == 8 and color_type in (2, 6) and interlace == 0, f"unsupported PNG {header}"
  channels = 3 if color_type == 2 else 4
  raw = zlib.decompress(b"".join(idat))
  stride = width * channels
  out = np.zeros((height, stride), np.uint8)
  previous = np.zeros(stride, np.int64)
  for y in range(height):
    start = y * (stride + 1)
    kind = raw[start]
    line = np.frombuffer(raw, np.uint8, stride, start + 1).astype(np.int64)
    if kind == 0:
      row = line
    elif kind == 2:
      row = (line + previous) % 256
    elif kind in (1, 3, 4):  # These depend on the already decoded left neighbour.
      row = np.zeros(stride, np.int64)
      for x in range(stride):
        left = row[x - channels] if x >= channels else 0
        up = previous[x]
        up_left = previous[x - channels] if x >= channels else 0
        predictor = {1: left, 3: (left + up) // 2, 4: _paeth(left, up, up_left)}[kind]
        row[x] = (line[x] + predictor) % 256
    else:
      raise AssertionError(f"bad PNG filter type {kind} on row {y}")
    out[y] = row
    previous = row
  return out.reshape(height, width, channels)


def test_png_reader_by_hand(tmp_path):
  # A 2x1 RGB image, filter "sub" on the only row: raw bytes (10,20,30) then deltas (5,5,5),
  # so the second pixel is (15,25,35).
  raw = bytes([1, 10, 20, 30, 5, 5, 5])
  def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
  png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0))
         + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
  (tmp_path / "tiny.png").write_bytes(png)
  assert read_png(tmp_path / "tiny.png").tolist() == [[[10, 20, 30], [15, 25, 35]]]


def test_report_renders_in_headless_chromium(tmp_path, tok, traj, advantages):
  browser = _browser()
  if browser is None:
    pytest.skip(f"no Chromium binary on PATH (looked for {', '.join(_BROWSERS)}); "
                "install Debian's `chromium` package to run this test")
  page = tmp_path / "report.html"
  page.write_text(report.render_report(traj, tok, advantages, 4, 3, env_name="frozenlake"),
                  encoding="utf-8")
  screenshot = tmp_path / "screenshot.png"
  # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start.
  command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--screenshot={screenshot}", f"--window-size={_WIDTH},{_HEIGHT}",
             page.as_uri()]
  result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
  assert screenshot.exists(), f"no screenshot; chromium said: {result.stderr[-2000:]}"

  pixels = read_png(screenshot)[..., :3].astype(np.int64)
  assert pixels.shape[:2] == (_HEIGHT, _WIDTH)
  assert pixels.std() > 10, "the screenshot is blank"
  # Each legend swatch is a box of its own colour; random advantages almost surely miss the
  # swatch values exactly, so these colours come from the legend (white, the middle, is skipped).
  largest = max(float(np.abs(a).max()) for a in advantages.values())
  for i in (0, 1, 2, 3, 4, 6, 7, 8, 9, 10):
    value = largest * (2 * i / 10 - 1)
    rgb = [int(c) for c in report.advantage_color(value, largest)[4:-1].split(",")]
    matches = np.all(pixels == rgb, axis=-1).sum()
    assert matches > 200, f"legend colour {rgb} (advantage {value:+.3f}) covers {matches} pixels"
