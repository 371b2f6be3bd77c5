"""The docs stay true to the repository: every path they cite exists, every config file and
`--config.<field>` override they quote names a real file and field (tuple fields given as
tuples), every relative link (and its #anchor) resolves, and the README's library snippet
runs. Fast: no study runs; each config file is loaded once.

The checkers take a document's text and its directory, so the negative cases below can feed
them a broken document without touching the real ones.
"""

from __future__ import annotations

import ast
import functools
import glob
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sera_jax import config_files
from sera_jax.studies import common
from tests import util

ROOT = util.ROOT
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                              for pattern in ("*.md", os.path.join("dev", "*.md"))
                              for p in glob.glob(os.path.join(ROOT, "docs", pattern)))
NOTEBOOKS = sorted(os.path.relpath(p, ROOT)
                   for p in glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))

#: Top-level folders whose paths the docs cite (a cited `sera_jax/...` must exist).
TOP = ("sera_jax", "tests", "configs", "experiments", "docs", "benchmarks", "notebooks")
_PATH = re.compile(r"(?<![\w./:-])((?:" + "|".join(TOP) + r")/[\w./*{},\-]*[\w/*}])(?:::(\w+))?")
_OVERRIDE = re.compile(
    r"--config\.([A-Za-z_][\w.]*)(?:=(\"[^\"]*\"|'[^']*'|\([^)]*\)|[^\s`)]+))?")
_CONFIG_FILE = re.compile(r"--config[= ](configs/[\w/.\-]+\.py)")
_CONFIG_PATH = re.compile(r"(?<![\w/])(configs/[\w/\-]+\.py)")
_BINARY = re.compile(r"experiments[./](\w+)")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")

#: Overrides the docs quote on purpose although they name no field: placeholders of the
#: syntax, and the misspelt / moved fields `robustness.md` shows being refused.
NOT_FIELDS = {"a.b", "a.b.c", "field", "rl.num_stepz", "rl.n_max"}


def _expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`] (one brace group at a time)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",")
            for q in _expand(path[:m.start()] + alt.strip() + path[m.end():])]


def _defines(path: str, name: str) -> bool:
    with open(path) as f:
        return bool(re.search(rf"^\s*(?:def|class) {name}\b|^{name}\b.*=", f.read(), re.M))


def _exists(rel: str) -> bool:
    """`rel` exists (a glob matches), or it is `module.name` of a module that defines name
    (`tests/util.execute_notebook`)."""
    full = os.path.join(ROOT, rel)
    if "*" in rel:
        return bool(glob.glob(full, recursive=True))
    module, _, name = rel.rpartition(".")
    if not os.path.exists(full) and module and os.path.isfile(os.path.join(ROOT, module + ".py")):
        return _defines(os.path.join(ROOT, module + ".py"), name)
    return os.path.exists(full)


def missing_paths(text: str) -> list[str]:
    """Repository paths cited in `text` (relative to the repository root) that do not exist;
    `file.py::test_name` also needs the test in that file."""
    bad = []
    for m in _PATH.finditer(text):
        for rel in _expand(m.group(1).rstrip(".")):
            if not _exists(rel):
                bad.append(rel)
            elif m.group(2) and rel.endswith(".py"):
                if not _defines(os.path.join(ROOT, rel), m.group(2)):
                    bad.append(f"{rel}::{m.group(2)}")
    return bad


@functools.cache
def _config(path: str):
    return config_files.get_config(os.path.join(ROOT, path))


@functools.cache
def _binary_default(name: str) -> str | None:
    """The default `--config` of `experiments/<name>.py` (its last quoted configs/ path)."""
    path = os.path.join(ROOT, "experiments", f"{name}.py")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        found = re.findall(r"\"(configs/[\w/.\-]+\.py)\"", f.read())
    return found[-1] if found else None


def _all_configs() -> list[str]:
    return sorted(os.path.relpath(p, ROOT)
                  for p in glob.glob(os.path.join(ROOT, "configs", "*", "*.py")))


def _lines(text: str) -> Iterator[tuple[str, str | None]]:
    """(logical line, config file of its section so far): in code blocks a line with its
    backslash continuations, in prose a paragraph; the section's config is the last
    `--config=<file>` quoted since the last heading."""
    section_config, buf, fenced = None, "", False
    for raw in text.splitlines() + [""]:
        if raw.startswith("```"):
            fenced = not fenced
        elif raw.startswith("#") and not fenced:
            section_config = None
        buf += raw.rstrip("\\") + " "
        if (fenced and raw.rstrip().endswith("\\")) or (not fenced and raw.strip()
                                                        and not raw.startswith("```")):
            continue
        yield buf, section_config
        found = _CONFIG_FILE.findall(buf)
        section_config = found[-1] if found else section_config
        buf = ""


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "\"'" else value


def bad_overrides(text: str) -> list[str]:
    """Config files quoted as `--config=<file>` that do not load, and `--config.<field>=v`
    overrides whose field is not in the config they apply to (the line's `--config=`, else
    a config file the line names, else its binary's default, else the section's last
    `--config=`, else any config file), or
    whose value for a tuple field is not a tuple (a comma string is refused by the
    studies)."""
    bad = []
    for line, section_config in _lines(text):
        files = _CONFIG_FILE.findall(line)
        for f in files:
            try:
                _config(f)
            except (FileNotFoundError, config_files.ConfigFileError) as e:
                bad.append(f"--config={f}: {e}")
        binaries = [b for b in _BINARY.findall(line) if _binary_default(b)]
        named = [f for f in _CONFIG_PATH.findall(line) if os.path.isfile(os.path.join(ROOT, f))]
        if files:
            candidates = files[-1:]
        elif named:  # prose naming a config file and one of its fields
            candidates = named
        elif binaries:
            candidates = [_binary_default(binaries[0])]
        elif section_config:
            candidates = [section_config]
        else:
            candidates = _all_configs()
        for m in _OVERRIDE.finditer(line):
            field, value = m.group(1).rstrip("."), (m.group(2) or "").rstrip(",;.")
            if field in NOT_FIELDS:
                continue
            homes = [c for c in candidates if field in common.config_keys(_config(c))]
            if not homes:
                bad.append(f"--config.{field}: no such field in {', '.join(candidates[:3])}"
                           f"{' ...' if len(candidates) > 3 else ''}")
                continue
            default = _config(homes[0])
            for key in field.split("."):
                default = default[key]
            if value and isinstance(default, tuple):
                try:
                    parsed = ast.literal_eval(_unquote(value))
                except (SyntaxError, ValueError):
                    parsed = None
                if not isinstance(parsed, tuple | list):
                    bad.append(f"--config.{field}={value}: a tuple field; write a tuple, e.g. "
                               f"--config.{field}=\"('a', 'b')\"")
    return bad


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but `-` and `_`
    dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors_of(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def broken_links(text: str, base: str) -> list[str]:
    """Relative link targets of `text` (resolved from the directory `base`) that do not
    exist, and `#anchors` that name no heading of their markdown target (`#x` alone: of
    `text` itself)."""
    bad = []
    for m in _LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else None
        if full and not os.path.exists(full):
            bad.append(target)
        elif anchor and full is None and anchor not in _anchors_of(text):
            bad.append(target)
        elif anchor and (full or "").endswith(".md"):
            with open(full) as f:
                if anchor not in _anchors_of(f.read()):
                    bad.append(target)
    return bad


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel)) as f:
        return f.read()


def _notebook_text(rel: str) -> str:
    with open(os.path.join(ROOT, rel)) as f:
        nb = json.load(f)
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("doc", DOCS + NOTEBOOKS)
def test_every_cited_path_exists(doc):
    text = _notebook_text(doc) if doc.endswith(".ipynb") else _read(doc)
    assert missing_paths(text) == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_config_file_and_override_is_real(doc):
    assert bad_overrides(_read(doc)) == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_resolves(doc):
    assert broken_links(_read(doc), os.path.dirname(os.path.join(ROOT, doc))) == []


def test_readme_library_snippet_runs():
    """The README's Python block imports and builds what it says (run in a fresh process:
    it must not depend on anything the test session imported)."""
    (snippet,) = re.findall(r"```python\n(.*?)```", _read("README.md"), flags=re.S)
    snippet += "\nassert callable(sera_step) and method.name == 'sera'\n"
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


# ----------------------------------------------------------------------------- the checks fail


@pytest.mark.parametrize("text, check, expected", [
    ("see `sera_jax/no_such_module.py`", missing_paths, ["sera_jax/no_such_module.py"]),
    ("configs `configs/math/{cpu,gone}.py`", missing_paths, ["configs/math/gone.py"]),
    ("`tests/test_docs.py::test_no_such_test`", missing_paths,
     ["tests/test_docs.py::test_no_such_test"]),
    ("`experiments/allocation_demo.synthetic_success_probs`", missing_paths,
     ["experiments/allocation_demo.synthetic_success_probs"]),
    ("python -m experiments.maze --config=configs/maze/gone.py", bad_overrides,
     ["--config=configs/maze/gone.py: "]),
    ("python -m experiments.gradient_alignment --config.measure.methods=\"('sera',)\"",
     bad_overrides, ["--config.measure.methods: no such field"]),
    ("python -m experiments.math_rl --config=configs/math/cpu.py "
     "--config.compare.methods=sera,uniform", bad_overrides,
     ["--config.compare.methods=sera,uniform: a tuple field"]),
    ("[spec](docs/NO_SUCH.md)", functools.partial(broken_links, base=ROOT),
     ["docs/NO_SUCH.md"]),
    ("[spec](docs/SPEC.md#no-such-heading)", functools.partial(broken_links, base=ROOT),
     ["docs/SPEC.md#no-such-heading"]),

    ("# Title\n[below](#no-such-section)", functools.partial(broken_links, base=ROOT),
     ["#no-such-section"]),
])
def test_a_broken_reference_is_reported(text, check, expected):
    found = check(text)
    assert len(found) == len(expected) and all(f.startswith(e) for f, e in zip(found, expected))


@pytest.mark.parametrize("text, check", [
    ("see `sera_jax/methods.py` and `configs/math/{cpu,qwen3_4b_polaris}.py`", missing_paths),
    ("`tests/test_docs.py::test_a_broken_reference_is_reported`", missing_paths),
    ("python -m experiments.math_rl --config=configs/math/cpu.py "
     "--config.compare.methods=\"('sera', 'uniform')\"", bad_overrides),
    ("[spec](docs/SPEC.md#1-setting-maximum-likelihood-rl-maxrl)",
     functools.partial(broken_links, base=ROOT)),

    ("## A section\n[above](#a-section)", functools.partial(broken_links, base=ROOT)),
])
def test_a_sound_reference_passes(text, check):
    assert check(text) == []


# ----------------------------------------------------------------------------- the binaries

BINARIES = sorted(os.path.basename(p)[:-3]
                  for p in glob.glob(os.path.join(ROOT, "experiments", "*.py"))
                  if not p.endswith("__init__.py"))
_FLAG = re.compile(r"(?<![\w.])--([a-z_]+)(?=[=\s]|$)")


def binary_commands(name: str) -> list[str]:
    """The `python -m experiments.<name>` commands of a binary's docstring (continuations
    joined)."""
    doc = ast.get_docstring(ast.parse(_read(f"experiments/{name}.py"))) or ""
    lines, buf = [], ""
    for raw in doc.splitlines():
        buf += raw.strip().rstrip("\\") + " "
        if raw.rstrip().endswith("\\"):
            continue
        if buf.lstrip().startswith("python -m experiments."):
            lines.append(buf.strip())
        buf = ""
    return lines


def bad_flags(command: str) -> list[str]:
    """`--flags` of a binary command that its module does not define (nor `--config*` /
    `--workdir`, which `common.binary` defines), and `--stage=` values not among the
    study's stages."""
    name = _BINARY.search(command).group(1)
    source = _read(f"experiments/{name}.py")
    defined = set(re.findall(r"flags\.DEFINE_\w+\(\s*\"(\w+)\"", source)) | {"config", "workdir"}
    bad = [f"--{f}" for f in _FLAG.findall(command.split("#")[0]) if f not in defined]
    stage = re.search(r"--stage=(\w+)", command)
    if stage and "study.STAGES" in source:
        from sera_jax.studies.paired.spec import STAGES

        if stage.group(1) not in STAGES:
            bad.append(f"--stage={stage.group(1)}")
    return bad


@pytest.mark.parametrize("name", BINARIES)
def test_every_command_in_a_binary_docstring_is_real(name):
    """Each command a binary's docstring shows names real flags and stages, config files that
    load and overrides of real fields (`tests/studies/paired/test_cli.py` runs the maze
    smoke commands; the others are sized for a study, not a test)."""
    commands = binary_commands(name)
    assert commands, f"experiments/{name}.py shows no command"
    for command in commands:
        assert bad_flags(command) == [], command
        assert bad_overrides(command) == [], command
        assert missing_paths(command) == [], command


def test_a_wrong_flag_in_a_binary_command_is_reported():
    assert bad_flags("python -m experiments.maze --config=configs/maze/tiny.py --stepz=3 "
                     "--stage=compile") == ["--stepz", "--stage=compile"]
    assert bad_flags("python -m experiments.maze --stage=rl --seeds=0") == []
