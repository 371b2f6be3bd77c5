"""Test-wide set-up: 8 virtual CPU devices so sharded code paths run here as on a pod."""

import os

# Must happen before jax is imported anywhere: multi-device code is exercised on CPU.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TensorFlow (tfds) must never grab an accelerator or all host threads in tests.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
