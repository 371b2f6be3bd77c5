"""Loading `get_config()` files by path.

Config files live in `configs/`, outside the package, and are loaded by path (as absl's
`config_flags` does), so a paper-scale config can extend its CPU sibling and tests can read
any config without `configs/` being importable.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import ml_collections


def load_module(path: str | os.PathLike) -> ModuleType:
    """Execute the Python file at `path` as a fresh module. Raises FileNotFoundError."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config file at {path}")
    name = "sera_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sibling(file: str, name: str) -> ModuleType:
    """The config module `name` (e.g. 'cpu.py') next to the config file `file`."""
    return load_module(os.path.join(os.path.dirname(os.path.abspath(file)), name))


def get_config(path: str | os.PathLike) -> ml_collections.ConfigDict:
    """`get_config()` of the config file at `path`."""
    return load_module(path).get_config()
