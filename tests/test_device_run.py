"""The device command's CPU rehearsal (issue 40): an image-like virtualenv (jax 0.11.2 and
the image's other versions, no sera_jax install) plus the carried wheels runs
`benchmarks/device_run.sh --smoke` end to end and writes every file. Slow (it builds the
virtualenv once, ≈ 3 min, then ≈ 90 s); needs Python 3.12 and the package index."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_device_rehearsal_passes(tmp_path):
    subprocess.run(["make", "-s", "device-wheels", "PYTHON=python3"], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=600)
    wheels = os.listdir(os.path.join(ROOT, "device_wheels"))
    size = sum(os.path.getsize(os.path.join(ROOT, "device_wheels", w)) for w in wheels)
    assert len(wheels) == 6 and size <= 20 * 2**20
    keep = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    proc = subprocess.run(["bash", "benchmarks/device_rehearsal.sh"], cwd=ROOT, text=True,
                          capture_output=True, timeout=1500,
                          env={**env, "REHEARSAL_KEEP": str(keep)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(keep)) == ["accelerator.json", "accelerator.md", "device.json",
                                        "log.txt", "maze.json", "maze.md"]
    log = (keep / "log.txt").read_text()
    assert "FAILED" not in log and "TIMEOUT" not in log and "maze_summary: ok" in log
