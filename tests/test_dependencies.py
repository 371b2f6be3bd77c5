"""The core install is slim: the study-only packages are extras, and the library's core
imports without them (what `pip install .` gives someone who only wants the allocator).

The real check is a fresh virtualenv (`python3 -m venv v && v/bin/pip install .`, then
`from sera_jax import methods, objective, history`); this fast test pins the same two facts
without a network: setup.cfg, and an import with those packages made unimportable.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys

from tests import util

#: Packages only some studies need: never in install_requires (import name in brackets).
STUDY_ONLY = {"gguf": "gguf", "math-verify": "math_verify", "scikit-learn": "sklearn",
              "pyarrow": "pyarrow", "matplotlib": "matplotlib"}
#: What a user of the allocator / objective / history imports, and the engine.
CORE_MODULES = ("sera_jax.allocation", "sera_jax.methods", "sera_jax.objective",
                "sera_jax.history", "sera_jax.scaling", "sera_jax.estimators",
                "sera_jax.metrics", "sera_jax.loop", "sera_jax.rl.trainer", "sera_jax.sampling")


def _requirements(value: str) -> set[str]:
    return {re.split(r"[<>=!~ \[]", line.strip())[0].lower()
            for line in value.splitlines() if line.strip()}


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(util.ROOT, "setup.cfg"))
    return cfg


def test_study_only_packages_are_extras():
    cfg = _setup_cfg()
    core = _requirements(cfg["options"]["install_requires"])
    extras = {name: _requirements(v) for name, v in cfg["options.extras_require"].items()}
    assert not core & set(STUDY_ONLY), core & set(STUDY_ONLY)
    for package in STUDY_ONLY:
        assert package in extras["studies"] and package in extras["test"], package
    assert {"scikit-learn", "matplotlib"} <= extras["alignment"]  # `make demo`'s install
    assert "math-verify" in extras["tunix"]  # the tunix example grades with math-verify


def test_core_imports_without_the_study_only_packages():
    blocked = sorted(STUDY_ONLY.values())
    script = (
        "import importlib, importlib.abc, sys\n"
        f"BLOCKED = {blocked!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not installed (blocked by the test)')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for m in {CORE_MODULES!r}:\n"
        "    importlib.import_module(m)\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)\n"
        "assert not leaked, leaked\n"
        "from sera_jax import allocation\n"
        "a = allocation.allocate([0.01, 0.5, 0.9], 24, n_min=2, n_max=16)\n"
        "assert int(a.counts.sum()) == 24 and int(a.counts[0]) > int(a.counts[2])\n")
    env = dict(os.environ, PYTHONPATH=util.ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=util.ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
