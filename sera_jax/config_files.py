"""Loading `get_config()` files by path.

Config files live in `configs/`, outside the package, and are loaded by path (as absl's
`config_flags` does), so a paper-scale config can extend its CPU sibling and tests can read
any config without `configs/` being importable.

A file that cannot be loaded is one error naming the file (and line) and the fix:
FileNotFoundError for a missing path, `ConfigFileError` (a ValueError) for a file that does
not run (SyntaxError, an exception at import, no `get_config`, `get_config()` raising).
"""

from __future__ import annotations

import importlib.util
import os
import traceback
from types import ModuleType

import ml_collections


class ConfigFileError(ValueError):
    """A config file exists but cannot be run into a config; the message names file:line."""


def _where(error: BaseException, path: str) -> str:
    """`path:line` of the deepest frame of `error` inside the config file (or just `path`)."""
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == path]
    return f"{path}:{lines[-1]}" if lines else path


def load_module(path: str | os.PathLike) -> ModuleType:
    """Execute the Python file at `path` as a fresh module.

    Raises FileNotFoundError (no such file) or ConfigFileError (it does not run), each one
    line naming the file and the fix.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise FileNotFoundError(
            f"no config file at {path} (the path {what}); pass an existing get_config() file, "
            "e.g. --config=configs/maze/cpu.py"
        )
    name = "sera_config_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ConfigFileError(
            f"config file {path}:{e.lineno} has a syntax error: {e.msg}"
            f"{': ' + e.text.strip() if e.text else ''}; fix that line"
        ) from None
    except ConfigFileError:
        raise  # a sibling it loads is broken: that sibling's message is the one to read
    except Exception as e:  # noqa: BLE001 -- any import-time failure is the file's fault
        raise ConfigFileError(
            f"config file {_where(e, path)} failed to load: {type(e).__name__}: {e}; fix the "
            "file (it may import only ml_collections and one sibling config)"
        ) from None
    return module


def sibling(file: str, name: str) -> ModuleType:
    """The config module `name` (e.g. 'cpu.py') next to the config file `file`."""
    return load_module(os.path.join(os.path.dirname(os.path.abspath(file)), name))


def get_config(path: str | os.PathLike) -> ml_collections.ConfigDict:
    """`get_config()` of the config file at `path` (errors as `load_module`, plus
    ConfigFileError when the file has no `get_config` or calling it raises)."""
    module = load_module(path)
    path = os.path.abspath(os.fspath(path))
    if not callable(getattr(module, "get_config", None)):
        raise ConfigFileError(f"config file {path} defines no get_config(); add "
                              "`def get_config() -> ml_collections.ConfigDict`")
    try:
        return module.get_config()
    except ConfigFileError:
        raise
    except Exception as e:  # noqa: BLE001 -- a broken get_config is the file's fault
        raise ConfigFileError(
            f"config file {_where(e, path)}: get_config() raised {type(e).__name__}: {e}; fix "
            "the file"
        ) from None
