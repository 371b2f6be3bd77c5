"""Helpers shared by tests: dotted config overrides and multi-process launches."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_field(config: Any, path: str, value: Any) -> Any:
    """`config.a.b.c = value` for `path="a.b.c"` (as `--config.a.b.c=value` would); returns
    the config."""
    *parents, last = path.split(".")
    target = config
    for key in parents:
        target = target[key]
    target[last] = value
    return config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(commands: Sequence[Sequence[str]], env: Mapping[str, str], timeout: float
           ) -> list[str]:
    """Run the commands concurrently from the repository root (processes of one JAX job);
    every one must exit 0 (else AssertionError with its output). Returns their outputs."""
    procs = [subprocess.Popen(list(cmd), cwd=ROOT, env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd in commands]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
    return outputs


def cpu_job_env(**extra: str) -> dict[str, str]:
    """The environment of one CPU process of a multi-process test job (no forced devices)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu",
               **extra)
    return env





def execute_notebook(name: str, monkeypatch) -> list[dict]:
    """Run `notebooks/<name>` top to bottom in its smoke setting (`SERA_NOTEBOOK_SMOKE=1`)
    from the repository root; returns the code cells' outputs."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SERA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
__all__ = ["ROOT", "cpu_job_env", "execute_notebook", "free_port", "launch", "set_field"]
