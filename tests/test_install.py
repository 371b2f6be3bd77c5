"""A normal (non-editable) install works outside the repository.

What a Colab cell's `pip install git+...` or `pip install .` does: build a wheel, install it
into a fresh virtualenv, and import the package from a directory that is not the checkout.
CI installs the project in editable mode, which hides a missing package directory (a folder
without `__init__.py` is left out of the wheel), so this test builds the wheel itself.

The fresh virtualenv gets the project's dependencies by path from the test's own interpreter
(a `.pth` line: a plain path, so the editable finder of the dev install is *not* activated)
instead of downloading them again; `sera_jax` itself comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile

import pytest

from tests import util

pytestmark = pytest.mark.slow

_SOURCES = ("sera_jax", "setup.cfg", "pyproject.toml", "README.md")


def _package_modules(root: str) -> list[str]:
    """Every module of the source tree `root/sera_jax` as a dotted name."""
    out = []
    for here, dirs, files in os.walk(os.path.join(root, "sera_jax")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(here, f), root)[:-3].replace(os.sep, ".")
                out.append(rel[: -len(".__init__")] if rel.endswith(".__init__") else rel)
    return sorted(out)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[str, str, str]:
    """(python of a fresh venv with the wheel installed, the wheel's path, the sources)."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    src.mkdir()
    for name in _SOURCES:  # a copy: the build writes build/ and *.egg-info next to the sources
        path = os.path.join(util.ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(dist), str(src)], check=True)
    (wheel,) = [str(dist / f) for f in os.listdir(dist) if f.endswith(".whl")]
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = str(env_dir / "bin" / "python")
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "deps_from_dev_env.pth"), "w") as f:
        f.write("\n".join(p for p in site.getsitepackages() if os.path.isdir(p)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", purelib, wheel], check=True)
    return py, wheel, str(src)


def test_wheel_ships_every_module_of_the_source_tree(installed):
    _, wheel, src = installed
    with zipfile.ZipFile(wheel) as z:
        shipped = {n[:-3].replace("/", ".").removesuffix(".__init__")
                   for n in z.namelist() if n.endswith(".py")}
    missing = sorted(set(_package_modules(src)) - shipped)
    assert not missing, f"modules left out of the wheel (a folder without __init__.py?): {missing}"


def test_every_module_imports_from_the_wheel_outside_the_repo(installed, tmp_path):
    py, _, src = installed
    modules = [m for m in _package_modules(src)
               if not m.startswith("sera_jax.integrations")]  # optional extra (tunix)
    script = ("import importlib, json, sys\n"
              "import sera_jax\n"
              f"mods = {modules!r}\n"
              "bad = {}\n"
              "for m in mods:\n"
              "    try:\n"
              "        importlib.import_module(m)\n"
              "    except Exception as e:\n"
              "        bad[m] = repr(e)\n"
              "print(json.dumps({'file': sera_jax.__file__, 'bad': bad}))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["JAX_PLATFORMS"] = "cpu"
    out = subprocess.run([py, "-c", script], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["file"].startswith(util.ROOT), result["file"]  # not the checkout
    assert "site-packages" in result["file"]
    assert result["bad"] == {}


def test_a_notebook_runs_from_the_wheel(installed, tmp_path):
    """The allocation-lab notebook, executed by a kernel of the fresh venv started outside the
    checkout (as on Colab, where the checkout is a clone named by SERA_JAX_REPO): its setup
    cell finds the installed package, not the sources."""
    py, _, _ = installed
    script = ("import json, os, nbformat\n"
              "from nbclient import NotebookClient\n"
              f"root, cwd = {util.ROOT!r}, {str(tmp_path)!r}\n"
              "nb = nbformat.read(os.path.join(root, 'notebooks', 'allocation_lab.ipynb'), 4)\n"
              "NotebookClient(nb, timeout=600, kernel_name='python3',\n"
              "               resources={'metadata': {'path': cwd}}).execute()\n"
              "outs = [o for c in nb.cells if c.cell_type == 'code'\n"
              "        for o in c.get('outputs', [])]\n"
              "print(json.dumps(outs))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SERA_NOTEBOOK_SMOKE="1", JAX_PLATFORMS="cpu", SERA_JAX_REPO=util.ROOT)
    out = subprocess.run([py, "-c", script], env=env, capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    outputs = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "installed at" in text and "site-packages" in text, text[:500]
