"""keep_freed_memory: a freed large buffer is reused without page faults (glibc only)."""

import platform
import subprocess
import sys

import pytest

_PROBE = """
import ctypes, resource, sys
from agentrl_jax.parallel import host_memory
if sys.argv[1] == "keep":
  assert host_memory.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults_of_fresh_buffer():
  # As XLA:CPU takes its per-run temporary buffer: malloc, write, free.
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  buffer = libc.malloc(256 << 20)
  ctypes.memset(buffer, 1, 256 << 20)
  libc.free(buffer)
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_fresh_buffer()  # the first one always faults: the heap has to grow once
print(min(faults_of_fresh_buffer() for _ in range(3)))
"""


def _faults(mode: str) -> int:
  out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                       check=True)
  return int(out.stdout.split()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc",
                    reason="glibc malloc only")
def test_freed_buffer_is_reused_without_page_faults():
  pages = (256 << 20) // 4096
  assert _faults("default") > pages // 2  # glibc's default: mmap'd afresh, faulted in again
  assert _faults("keep") < pages // 100
