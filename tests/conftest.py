"""Test-wide setup: 8 fake CPU devices so every sharding path runs on one host."""

import os

# Must precede the first `import jax` anywhere in the test session.
# A loaded 2-core machine can stall one of 8 fake devices past XLA's 40 s collective timeout.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_cpu_collective_call_terminate_timeout_seconds=900")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
