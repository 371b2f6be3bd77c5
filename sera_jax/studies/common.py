"""What every study shares: flag parsing that names the nearest valid key, workdir checks,
method x seed lists, multi-host start-up, and one RL run on the one loop.

A study is a library module with a `run(config, workdir, ...)`; its binary in `experiments/`
is flags plus that one call (`main` below does the common part).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from absl import app, flags

from sera_jax import config_files, loop, validation
from sera_jax import methods as methods_lib
from sera_jax.checkpoint import CheckpointError
from sera_jax.records import append_jsonl, read_json, read_jsonl, write_json


class StudyError(ValueError):
    """A study's input is unusable (bad config value, workdir, missing stage output)."""


# ----------------------------------------------------------------------------- flags


def config_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    """Every dotted field path of `config` (nested ConfigDicts and dict-valued fields)."""
    out = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        out.append(path)
        if isinstance(value, ml_collections.ConfigDict | dict):
            out.extend(config_keys(ml_collections.ConfigDict(value) if isinstance(value, dict)
                                   else value, path + "."))
    return out


#: Config fields that moved when every study took one schema (old dotted path -> new one).
#: Each study adds its own; `unknown_override` and `renamed_fields` name the new home.
RENAMED: dict[str, str] = {}


def renamed_fields(config: ml_collections.ConfigDict) -> None:
    """Raise StudyError naming the new field when `config` (e.g. a user's own config file)
    still has a field under an old name of `RENAMED`."""
    for old in config_keys(config):
        if old in RENAMED:
            raise StudyError(f"config field {old!r} was renamed {RENAMED[old]!r}: set "
                             f"{RENAMED[old]} instead")


def unknown_override(argv: Sequence[str], config: ml_collections.ConfigDict,
                     flag: str = "config") -> str | None:
    """The first `--config.a.b=v` of `argv` whose path is not a field of `config`, with the
    new name of a renamed field (`RENAMED`) or else the nearest valid path, as a one-line
    message; None when every override names a field."""
    keys = config_keys(config)
    known = set(keys)
    for arg in argv:
        if not arg.startswith(f"--{flag}."):
            continue
        path = arg[len(flag) + 3:].split("=", 1)[0]
        moved = next((new + path[len(old):] for old, new in RENAMED.items()
                      if path == old or path.startswith(old + ".")), None)
        if path not in known and moved is not None:
            return f"--{flag}.{path}: this field was renamed; use --{flag}.{moved}"
        if path not in known:
            homes = same_name_fields(path, keys)
            close = homes or difflib.get_close_matches(path, keys, n=1, cutoff=0.6)
            hint = (f"; did you mean {' or '.join(f'--{flag}.{k}' for k in close)}?"
                    if close else "")
            return f"--{flag}.{path}: the config has no field {path!r}{hint}"
    return None


def same_name_fields(path: str, keys: Sequence[str], limit: int = 3) -> list[str]:
    """The fields of `keys` with the last name of `path` (`rl.n_max` -> `rl.allocation.n_max`):
    where a field moved to another block. Spelling similarity (difflib) alone misleads here
    (`rl.n_min` is nearest to `rl.sampling`, `rl.learning_rate` to `sft.learning_rate`), so
    these come first, ranked by how many leading names they share with `path`; the best
    ones, at most `limit`, in `keys` order."""
    parts = path.split(".")
    matches = [k for k in keys if k.split(".")[-1] == parts[-1]]
    if not matches:
        return []

    def shared(key: str) -> int:  # leading names in common (commonprefix works on lists)
        return len(os.path.commonprefix([key.split("."), parts]))

    best = max(map(shared, matches))
    return [k for k in matches if shared(k) == best][:limit]


def _config_path(argv: Sequence[str], default: str, flag: str = "config") -> str:
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{flag}="):
            return arg.split("=", 1)[1]
        if arg == f"--{flag}" and i + 1 < len(argv):
            return argv[i + 1]
    return default


def check_overrides(default_config: str | None, argv: Sequence[str] | None = None,
                    flag: str = "config") -> None:
    """Exit with one line naming the nearest valid key when a `--config.a.b=v` of `argv`
    (default `sys.argv`) names no field of the config file it overrides. Binaries call it
    before defining their flags: `config_flags` already applies overrides to a default
    config at definition time, where a misspelt key is a bare `AttributeError`."""
    argv = list(sys.argv if argv is None else argv)
    path = _config_path(argv, default_config or "", flag).split(":", 1)[0]
    if path:
        try:  # a missing or broken file: one line here, not ml_collections' tracebacks
            config = config_files.get_config(path)
        except (FileNotFoundError, config_files.ConfigFileError) as e:
            sys.exit(f"error: --{flag}: {e}")
        message = unknown_override(argv, config, flag)
        if message:
            sys.exit(f"error: {message}")


def flags_parser(default_config: str | None, flag: str = "config"
                 ) -> Callable[[list[str]], list[str]]:
    """An `app.run(flags_parser=...)` that checks `--config.*` override paths against the
    config file before absl parses them (`check_overrides`) and turns a flag error into one
    line."""

    def parse(argv: list[str]) -> list[str]:
        check_overrides(default_config, argv, flag)
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            sys.exit(f"error: {e}")

    return parse


def main(run: Callable[[], Any]) -> None:
    """Call `run()`; a study's input errors (bad config value, workdir, missing file, a
    refused resume) and a stopped non-finite run end with one line and exit status 1."""
    try:
        run()
    except (ValueError, FileNotFoundError, CheckpointError, loop.NonFiniteError) as e:
        sys.exit(f"error: {e}")


def binary(run: Callable[[ml_collections.ConfigDict, str | None], Any], default_config: str,
           ) -> None:
    """The whole main of every study binary: `--config` (default `default_config`, a path
    relative to the repository root) and `--workdir`, overrides checked against the config
    file before absl parses them, the persistent compilation cache under the workdir,
    one-line errors, `result["summary"]` printed when `run(config, workdir)` returns one, and
    last a line saying where the outputs are (`outputs_line`). A binary defines its extra
    flags (absl) before calling this and reads them in `run`."""
    from ml_collections import config_flags

    main_file = getattr(sys.modules.get("__main__"), "__file__", None) or os.getcwd()
    root = os.path.dirname(os.path.dirname(os.path.abspath(main_file)))
    default = os.path.join(root, default_config)
    check_overrides(default)
    config = config_flags.DEFINE_config_file("config", default, "Path to a get_config() file.")
    workdir = flags.DEFINE_string("workdir", None, "Output directory (runs resume in it).")

    def main_fn(argv: list[str]) -> None:
        del argv

        def call() -> None:
            renamed_fields(config.value)
            enable_compilation_cache(workdir.value)
            result = run(config.value, workdir.value)
            if isinstance(result, Mapping) and "summary" in result:
                print(result["summary"])
            if workdir.value and os.path.isdir(workdir.value):
                print(outputs_line(workdir.value))

        main(call)

    run_app(main_fn, default)


def outputs_line(workdir: str) -> str:
    """`outputs in <absolute workdir>: <its entries>` (folders end in '/'; hidden ones, such
    as the compilation cache, are left out): the last line a binary prints, so a run that
    ends with tables still says where its files are."""
    names = sorted(n + ("/" if os.path.isdir(os.path.join(workdir, n)) else "")
                   for n in os.listdir(workdir) if not n.startswith("."))
    return f"outputs in {os.path.abspath(workdir)}: {', '.join(names) or '(nothing)'}"


def enable_compilation_cache(workdir: str | None) -> None:
    """Persist compiled programs under `<workdir>/.jax_cache`: a resumed or later stage skips
    its compiles (binaries). A cache directory the user already set (JAX_COMPILATION_CACHE_DIR,
    or `jax_compilation_cache_dir`) is kept, with its own settings: one cache shared by runs
    (the test suite's per-session one)."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    if workdir and not (os.path.exists(workdir) and not os.path.isdir(workdir)):
        jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.abspath(workdir),
                                                                    ".jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def run_app(main_fn: Callable, default_config: str | None) -> None:
    """`app.run(main_fn)` with the checking flag parser."""
    app.run(main_fn, flags_parser=flags_parser(default_config))


# ----------------------------------------------------------------------------- inputs


def prepare_workdir(workdir: str | os.PathLike | None) -> str:
    """The absolute workdir, created if needed; StudyError in one line when unusable."""
    if not workdir:
        raise StudyError("--workdir is required: a directory for checkpoints and results")
    path = os.path.abspath(os.fspath(workdir))
    if os.path.exists(path) and not os.path.isdir(path):
        raise StudyError(f"workdir {path} exists and is not a directory; pass a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise StudyError(f"cannot create workdir {path}: {e.strerror}; pass a writable "
                         "directory") from None
    if not os.access(path, os.W_OK):
        raise StudyError(f"workdir {path} is not writable; pass a writable directory")
    return path


def _items(value: Any, what: str, example: str) -> list:
    """`value` (a tuple or list) as a list; StudyError naming `what` for anything else, and
    for a string (the old comma-string form) the tuple to write instead. A `what` starting
    with `--` names a run argument (the binary's list flag), not a config field."""
    if what.startswith("--") and not isinstance(value, tuple | list):
        raise StudyError(f"{what}={value!r} is invalid; pass a list, e.g. {example}")
    if isinstance(value, str):
        raise StudyError(f"{what}={value!r} is a string; write a tuple, e.g. {example}"
                         f" (on the command line: --config.{what}=\"{example}\")")
    if not isinstance(value, tuple | list):
        raise StudyError(f"{what}={value!r} is invalid; allowed: a tuple, e.g. {example}")
    return list(value)


def method_names(value: Any, what: str) -> list[str]:
    """The method names of `value`: a tuple / list of names of `sera_jax.methods.METHODS`
    or of its `Method` presets. StudyError naming `what` when `value` is a string, empty,
    names an unknown method (its new name when it was renamed, else the nearest) or one
    twice, or holds a `Method` that is not its name's preset (a study applies overrides
    from `config.rl.allocation.*`)."""
    names = []
    for m in _items(value, what, "('uniform', 'sera')"):
        if isinstance(m, methods_lib.Method):
            if methods_lib.METHODS.get(m.name) != m:
                raise StudyError(
                    f"{what} has Method {m.name!r}, which is not the preset of that name in "
                    "sera_jax.methods.METHODS; pass a preset (or its name) and set options "
                    "with config.rl.allocation.* / config.rl.estimator")
            m = m.name
        if not isinstance(m, str) or m not in methods_lib.METHODS:
            hint = (f"{what} has {m!r}: one method name per item, e.g. ('uniform', 'sera')"
                    if isinstance(m, str) and "," in m else
                    f"{what}: " + methods_lib.unknown_method_message(m))
            raise StudyError(hint)
        names.append(m)
    if not names:
        raise StudyError(f"{what} is empty; name at least one method, e.g. ('uniform', 'sera')")
    if len(set(names)) != len(names):
        raise StudyError(f"{what}={tuple(names)!r} names a method twice")
    return names


def int_list(value: Any, what: str, minimum: int = 0) -> list[int]:
    """The integers (each >= `minimum`) of a tuple / list `value`. `what` starting with `--`
    is a flag's list (absl `DEFINE_list`: strings of digits). StudyError naming `what`."""
    flag = what.startswith("--")
    items = _items(value, what, "(0, 1, 2)")
    out = []
    for x in items:
        if flag and isinstance(x, str) and x.strip().lstrip("-").isdigit():
            x = int(x)
        if not (validation.is_int(x) and x >= minimum):
            if flag:
                raise StudyError(f"{what}={','.join(map(str, items))!r}: expected a "
                                 f"comma-separated list of integers >= {minimum}")
            raise StudyError(f"config.{what}={value!r} is invalid; allowed: a tuple of "
                             f"integers >= {minimum}, e.g. (0, 1, 2)")
        out.append(x)
    return out


def float_list(value: Any, what: str) -> list[float]:
    """The finite numbers of a tuple / list `value`, as floats; StudyError naming `what`."""
    items = _items(value, what, "(0.05, 0.2)")
    if not all(validation.is_number(x) for x in items):
        raise StudyError(f"config.{what}={value!r} is invalid; allowed: a tuple of finite "
                         "numbers, e.g. (0.05, 0.2)")
    return [float(x) for x in items]


def nonempty(items: list, what: str) -> list:
    """`items`, or StudyError naming `what` (a config field or a `--flag`) when empty."""
    if not items:
        name = what if what.startswith("--") else f"config.{what}"
        raise StudyError(f"{name} is empty; give at least one value")
    return items


def check(cond: bool, field: str, value: Any, allowed: str) -> None:
    """`sera_jax.validation.check` raising StudyError (one line from a study's binary)."""
    validation.check(cond, field, value, allowed, error=StudyError)


#: `sera_jax.validation.is_positive_int` (kept for the studies that call it by this name).
positive_int = validation.is_positive_int


# ----------------------------------------------------------------------------- records


def cached_json(path: str, fingerprint: Mapping[str, Any], compute: Callable[[], dict]
                ) -> dict:
    """`path`'s record when it was computed under `fingerprint`, else `compute()` stored with
    it (a changed model or evaluation setting recomputes instead of reusing a stale file)."""
    fp = loop.canonical(fingerprint)
    if os.path.exists(path):
        cached = read_json(path)
        if cached.get("fingerprint") == fp:
            return cached
    record = {**compute(), "fingerprint": fp}
    write_json(path, record)
    return record


class RolloutCounter:
    """Hooks that add cumulative generated `rollouts` and `tokens` to every train record
    (recounted from the records kept after a resume). Rollouts are the generated ones
    (`generated_rollouts`: with DAPO dynamic sampling every round's, more than the budget B),
    so runs compare at matched generation cost; a record without the field counts B."""

    def __init__(self, run_dir: str, budget: int):
        self.path, self.budget = os.path.join(run_dir, loop.TRAIN_RECORDS), budget
        self.tokens = self.rollouts = 0

    def _generated(self, metrics: Mapping[str, Any]) -> int:
        return int(metrics.get("generated_rollouts", self.budget))

    def on_start(self, step: int, state: Any) -> None:
        records = read_jsonl(self.path)
        self.tokens = sum(r["generated_tokens"] for r in records)
        self.rollouts = sum(self._generated(r) for r in records)

    def record(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        self.tokens += metrics["generated_tokens"]
        self.rollouts += self._generated(metrics)
        return {"rollouts": self.rollouts, "tokens": self.tokens}


def append_eval(run_dir: str, record: Mapping[str, Any]) -> None:
    append_jsonl(os.path.join(run_dir, loop.EVAL_RECORDS), dict(record))


__all__ = ["RolloutCounter", "StudyError", "append_eval", "cached_json", "check", "check_overrides",
           "config_keys", "enable_compilation_cache", "flags_parser", "float_list", "int_list",
           "main", "method_names", "nonempty", "outputs_line", "positive_int",
           "prepare_workdir", "run_app", "same_name_fields", "unknown_override"]
