"""Device, versions and memory as JSON (the device command's part 2): jax's devices and
backend, the memory the runtime reports, the versions of the packages sera_jax uses (so a
CPU rehearsal can pin the image's), and `nvidia-smi`'s line where there is one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata

from absl import app, flags

_OUT = flags.DEFINE_string("out", None, "Where to write the JSON.", required=True)

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax",
            "orbax-checkpoint", "chex", "numpy", "ml-dtypes", "scipy", "absl-py", "etils",
            "tensorstore", "safetensors", "tokenizers", "scikit-learn", "matplotlib",
            "pyarrow", "tqdm", "pytest", "sympy", "pyyaml", "protobuf", "ml-collections",
            "gguf", "math-verify", "tensorboardX", "nvidia-cudnn-cu13")


def main(argv: list[str]) -> None:
    del argv
    import jax

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    devices = jax.devices()
    info = {"python": sys.version.split()[0], "backend": jax.default_backend(),
            "devices": [str(d) for d in devices], "device_kind": devices[0].device_kind,
            "memory_stats": devices[0].memory_stats(), "versions": versions}
    if shutil.which("nvidia-smi"):
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    with open(_OUT.value, "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: info[k] for k in ("python", "backend", "device_kind")}),
          {k: v for k, v in versions.items() if k.startswith("jax") or k == "flax"},
          (info["memory_stats"] or {}).get("bytes_limit"))


if __name__ == "__main__":
    app.run(main)
