"""Test-wide setup: 8 fake CPU devices so every sharding path runs on one host."""

import os

# Must precede the first `import jax` anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
