"""Every number of the README's results table comes from a committed results file.

* `results/alignment/recompute.py` rebuilds docs/results_alignment.md's measured tables from
  `results/alignment/digits/` and every line matches the page.
* `results/lab/recompute.py` rebuilds the allocation lab's summary from
  `results/lab/cpu_default/` (numpy alone) and every line matches the run's own summary.md
  and docs/results_lab.md's "Measured tables"; the numbers of the page's verdict and notes
  are derived here from the same files, as the README rows' are.
* Each row of the README's "Results at a glance" table is either TRACED -- its numbers, in
  the order the README prints them, are derived here from its results folder and rounded as
  printed (a derivation that also checks the claim around its number returns a "claim
  fails" string instead) -- or listed in UNTRACED with the reason its data is not committed.
  A row in neither fails, and so does a listing that names no row: the gap stays visible and
  shrinks as data lands.

Fast: reads a few small files (the per-draw CSV gzip'd); no study runs.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import math
import os
import re
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from tests import util

ROOT = util.ROOT
ALIGNMENT = os.path.join(ROOT, "results", "alignment")
LAB = os.path.join(ROOT, "results", "lab")
DEVICE = os.path.join(ROOT, "results", "device", "2026-12-04_h200")
MAZE_READ = os.path.join(ROOT, "results", "maze", "maze_cpu_read")

#: README rows (by the start of their first cell) whose data is not committed yet.
UNTRACED: dict[str, str] = {}


# ----------------------------------------------------------------------------- the README


def _strip(cell: str) -> str:
    """A README cell without code spans and link targets (paths and anchors are not data)."""
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", cell))


#: A number as the README prints it: sign (+, -, U+2212), thousands commas, decimals,
#: exponent; not a k of pass@k, not part of a name (H200, N0) or of a wider number.
_NUMBER = re.compile(r"(?<![\w@.,])[+\-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
                     r"(?:e[+\-−]?\d+)?(?![\w.])")


def numbers(text: str) -> list[str]:
    return [m.replace("−", "-") for m in _NUMBER.findall(_strip(text))]


def readme_rows() -> dict[str, str]:
    """The README's results table: {first cell: whole row}."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    section = text.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|")][2:]  # header, rule
    assert rows, "the README's results table has no rows"
    return {ln.split("|")[1].strip(): ln for ln in rows}


def test_numbers_are_read_as_printed():
    assert numbers("SERA − uniform +0.192 ± 0.028 at N0 = 4, pass@64 49 % vs 1.1 %") == [
        "+0.192", "0.028", "4", "49", "1.1"]
    assert numbers("17×17 on one H200 (`configs/maze/gpu17.py`, 410 s); lr 1e-4, 2,048, "
                   "(0.93–0.98), [+2.6, +4.0] [x](a.md#b-12) −1.03; κ ≈ 1, then") == [
        "17", "17", "410", "1e-4", "2,048", "0.93", "0.98", "+2.6", "+4.0", "-1.03", "1"]


# ----------------------------------------------------------------------------- machine paths

#: Absolute folders of the machines that made results (workdirs, checkouts, device outputs).
#: (A mention of the pattern itself, `/tmp/...` or `/home/`, names no folder.)
MACHINE_PATH = re.compile(r"(?<![\w.~$])/(?:work|tmp|root|home)/[\w-]")


def committed_texts(*folders: str) -> dict[str, str]:
    """{path: text} of every committed file under `folders`: text files as they are, gzip'd
    ones decompressed, the member names of .npz archives; other binaries (figures) skipped."""
    import subprocess
    import zipfile

    names = subprocess.run(["git", "-C", ROOT, "ls-files", *folders], capture_output=True,
                           text=True, check=True).stdout.split()
    out = {}
    for name in names:
        path = os.path.join(ROOT, name)
        if not os.path.isfile(path):
            continue
        if name.endswith(".npz"):
            with zipfile.ZipFile(path) as z:
                out[name] = "\n".join(z.namelist())
            continue
        raw = gzip.open(path, "rb").read() if name.endswith(".gz") else open(path, "rb").read()
        if b"\0" not in raw:
            out[name] = raw.decode("utf-8", errors="replace")
    return out


def test_no_committed_result_or_doc_names_a_machines_folder():
    """No file under results/ or docs/ holds an absolute path of the machine that made it
    (`/work/...`, `/tmp/...`, `/root/...`, `/home/...`): exports write paths relative to the
    repository or the workdir, the device command writes `$OUT` / `$MAZE_WORKDIR`, and the
    documented commands use workdirs under the repository's ignored `runs/`."""
    texts = committed_texts("results", "docs")
    assert len(texts) > 50 and "results/maze/maze_cpu_read/comparison.json" in texts
    found = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: "
             f"{text[m.start():m.start() + 60].splitlines()[0]}"
             for name, text in texts.items() for m in MACHINE_PATH.finditer(text)]
    assert not found, "\n".join(found[:20])
    assert MACHINE_PATH.search('"path": "/work/runs/x/sft/validity.json"')  # the check bites
    assert not MACHINE_PATH.search("--workdir=runs/x, $OUT/maze.json, ../runs/w, ~/tmp/x, "
                                   "`/tmp/...`")


# ----------------------------------------------------------------------------- the data


@functools.cache
def _alignment_recompute():
    spec = importlib.util.spec_from_file_location(
        "alignment_recompute", os.path.join(ALIGNMENT, "recompute.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def alignment_cells() -> dict[tuple[str, int, str], dict[str, Any]]:
    rc = _alignment_recompute()
    return {(r["stage"], r["budget"], r["method"]): r for r in rc.table(rc.load())}


@functools.cache
def device() -> dict[str, Any]:
    with gzip.open(os.path.join(DEVICE, "maze.json.gz"), "rt") as f:
        maze = json.load(f)
    with open(os.path.join(DEVICE, "stamp.json")) as f:
        stamp = json.load(f)
    attention = {}
    with open(os.path.join(DEVICE, "attention_adhoc.txt")) as f:
        for ln in f:  # "<impl> <batch> <tokens> compile <s> s fwd+bwd <ms> ms <tflops> TFLOP/s"
            w = ln.split()
            if len(w) > 7 and w[6] == "fwd+bwd":
                attention[(w[0], int(w[2]))] = float(w[7])
    return {"maze": maze, "stamp": stamp, "attention": attention}


def test_alignment_page_tables_are_recomputed_from_the_data():
    _, diff = _alignment_recompute().check()
    assert not diff, "docs/results_alignment.md differs from results/alignment/digits:\n" + (
        "\n".join(diff))


def test_alignment_check_reports_a_changed_line(tmp_path):
    rc = _alignment_recompute()
    with open(rc.DOC) as f:
        page = f.read()
    line = "| initial | 4 | 0.264 | 0.455 | +0.192 ± 0.028 |"
    assert line in page
    bad = tmp_path / "page.md"
    bad.write_text(page.replace(line, line.replace("+0.192", "+0.193")))
    _, diff = rc.check(doc=str(bad))
    assert "+0.193" in "\n".join(diff) and "+0.192" in "\n".join(diff)


# ----------------------------------------------------------------------------- derivations

Derivation = tuple[str, Callable[[], str]]


def given(value: str, reason: str) -> Callable[[], str]:
    """A number the README prints that no committed file holds (`reason` says why): the
    exception, listed where it stands."""
    fn = lambda: value  # noqa: E731
    fn.given = reason
    return fn


def _claim(ok: bool, value: str, what: str) -> str:
    return value if ok else f"claim fails: {what}"


STAGES = ("initial", "partly trained", "well trained")


def _cells(stages=STAGES, method="sera", min_budget=0):
    return [r for (s, b, m), r in sorted(alignment_cells().items())
            if s in stages and m == method and b >= min_budget]


def _best_budget(stage: str, key: Callable[[int], float]) -> int:
    return max(sorted({b for (s, b, _) in alignment_cells() if s == stage}), key=key)


def _initial_gain_budget() -> int:  # SERA's largest gain over uniform at the initial stage
    return _best_budget("initial", lambda b: alignment_cells()[("initial", b, "sera")][
        "diff_vs_uniform"])


def _no_mult_budget() -> int:  # where no-multiplicity beats SERA most at the initial stage
    c = alignment_cells()
    return _best_budget("initial", lambda b: c[("initial", b, "sera_no_multiplicity")]["cosine"]
                        - c[("initial", b, "sera")]["cosine"])


def _ties() -> str:  # at the first two stages, where uniform's κ̄ rounds to 1, SERA ties
    cells = [r for r in _cells(STAGES[:2]) if alignment_cells()[
        (r["stage"], r["budget"], "uniform")]["kappa_mean"] >= 0.95]
    worst = max(abs(r["diff_vs_uniform"]) for r in cells)
    kappa = min(alignment_cells()[(r["stage"], r["budget"], "uniform")]["kappa_mean"]
                for r in cells)
    return _claim(worst < 0.01, f"{kappa:.0f}", f"|SERA − uniform| up to {worst:.3f}")


def _no_mult_large() -> list[float]:  # no-multiplicity's cosine at N0 ≥ 32, first two stages
    return [r["cosine"] for r in _cells(STAGES[:2], "sera_no_multiplicity", 32)]


def _well_trained_gains() -> list[float]:
    return [r["diff_vs_uniform"] for r in _cells(STAGES[2:])]


def _cell(stage: str, budget: int, method: str, field: str) -> float:
    return alignment_cells()[(stage, budget, method)][field]


ALIGNMENT_ROW: list[Derivation] = [
    ("SERA − uniform, initial stage, its best budget",
     lambda: f"{_cell('initial', _initial_gain_budget(), 'sera', 'diff_vs_uniform'):+.3f}"),
    ("its paired se", lambda: f"{_cell('initial', _initial_gain_budget(), 'sera', 'diff_se'):.3f}"),
    ("that budget N0", lambda: f"{_initial_gain_budget()}"),
    ("smallest well-trained gain", lambda: f"{min(_well_trained_gains()):+.2f}"),
    ("largest well-trained gain", lambda: f"{max(_well_trained_gains()):+.2f}"),
    ("uniform's κ̄ at the well-trained stage, min over budgets",
     lambda: f"{min(r['kappa_mean'] for r in _cells(STAGES[2:], 'uniform')):.0f}"),
    ("uniform's κ̄ where SERA ties it, first two stages", _ties),
    ("no-multiplicity cosine at its best initial budget",
     lambda: f"{_cell('initial', _no_mult_budget(), 'sera_no_multiplicity', 'cosine'):.3f}"),
    ("SERA's cosine there", lambda: f"{_cell('initial', _no_mult_budget(), 'sera', 'cosine'):.3f}"),
    ("that budget N0", lambda: f"{_no_mult_budget()}"),
    ("no-multiplicity stays below (ceil of its max at N0 ≥ 32)",
     lambda: f"{math.ceil(max(_no_mult_large()))}"),
    ("no-multiplicity at N0 ≥ 32, first two stages, min", lambda: f"{min(_no_mult_large()):.2f}"),
    ("... max", lambda: f"{max(_no_mult_large()):.2f}"),
    ("paired draws per cell", lambda: f"{_draws()}"),
]


def _draws() -> int:
    ns = {r["n"] for r in alignment_cells().values()}
    assert len(ns) == 1, ns
    return ns.pop()


def _maze() -> dict[str, Any]:
    return device()["maze"]


def _last(arm: str) -> dict[str, Any]:
    return max(_maze()["runs"][f"{arm}/seed0"]["eval"], key=lambda r: r["step"])


def _start(k: str) -> float:  # the SFT start, scored with the last point's keys
    return _maze()["comparison"]["sft"]["pass_at_k"][k]


def _blind(k: str) -> float:
    return _maze()["blind"]["blind_pass_at_k"][k]


def _both_lose_pass64() -> str:
    steps = {_last(a)["step"] for a in ("uniform", "sera")}
    lose = all(_last(a)["pass_at_k"]["64"] < _start("64") for a in ("uniform", "sera"))
    return _claim(lose and len(steps) == 1, f"{steps.pop()}", "a method kept pass@64")


def _rollouts_per_step() -> str:
    per_step = {e["rollouts"] // e["step"] for r in _maze()["runs"].values()
                for e in r["eval"] if e["step"]}
    assert len(per_step) == 1, per_step
    return f"{per_step.pop():,}"


def _median_step_time() -> float:  # every arm's steps after its first (the compile)
    return statistics.median(t["step_time"] for r in _maze()["runs"].values()
                             for t in r["train"] if t["step"] > 1)


def _attention_ratio() -> str:
    a = device()["attention"]
    tokens = {t for (impl, t) in a if impl == "plain"}
    assert len(tokens) == 1, tokens
    t = tokens.pop()
    return f"{a[('plain', t)] / a[('dot_product', t)]:.1f}"


def _attention_tokens() -> str:
    return f"{min(t for (impl, t) in device()['attention'] if impl == 'plain'):,}"


def _sci(x: float) -> str:
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


MAZE17_ROW: list[Derivation] = [
    ("maze size", lambda: f"{_maze()['task']['size']}"),
    ("maze size", lambda: f"{_maze()['task']['size']}"),
    ("wall time of the whole device command, s",
     given("410", "the device tool's wall time; log.txt's last line says +409 s")),
    ("SFT start held-out pass@1, %", lambda: f"{100 * _start('1'):.1f}"),
    ("start / blind at pass@1", lambda: f"{_start('1') / _blind('1'):.0f}"),
    ("SFT start held-out pass@64, %", lambda: f"{100 * _start('64'):.0f}"),
    ("blind control pass@64, %", lambda: f"{100 * _blind('64'):.1f}"),
    ("RL learning rate (stamp: the config at the run's commit)",
     lambda: _sci(device()["stamp"]["config"]["rl"]["learning_rate"])),
    ("null's largest held-out pass@k at its last point, %",
     lambda: f"{100 * max(_last('null')['pass_at_k'].values()):.0f}"),
    ("RL steps by which uniform and SERA both lost pass@64", _both_lose_pass64),
    ("median RL step, s", lambda: f"{_median_step_time():.2f}"),
    ("rollouts per RL step", _rollouts_per_step),
    ("plain / cuDNN attention time", _attention_ratio),
    ("tokens of that timing", _attention_tokens),
]

@functools.cache
def maze_read() -> dict[str, Any]:
    """The read-the-maze default's committed comparison and SFT report."""
    with open(os.path.join(MAZE_READ, "comparison.json")) as f:
        table = json.load(f)
    with open(os.path.join(MAZE_READ, "sft_validity.json")) as f:
        validity = json.load(f)
    return {"table": table, "validity": validity}


def _pp(x: float, digits: int = 1, sign: bool = True) -> str:
    return f"{100 * x:{'+' if sign else ''}.{digits}f}"


def _primary(field: str, two_level: bool = False) -> str:
    p = maze_read()["table"]["curves"]["primary"]
    return _pp((p["two_level"] if two_level else p["estimate"])[field])


def _vs_start(arm: str) -> str:  # held-out pass@64 against the start at the last point
    return _pp(maze_read()["table"]["vs_sft"][arm]["eval"]["64"]["mean"])


def _read_validity(which: str, k: str, digits: int) -> str:
    return _pp(maze_read()["validity"][which][k], digits, sign=False)


def _read_gate(field: str) -> str:
    return _pp(maze_read()["table"]["gate"][field], 2)


MAZE_READ_ROW: list[Derivation] = [
    ("maze size", lambda: f"{maze_read()['validity']['size']}"),
    ("maze size", lambda: f"{maze_read()['validity']['size']}"),
    ("paired seeds",
     lambda: f"{maze_read()['table']['curves']['primary']['estimate']['seeds']}"),
    ("primary: SERA − uniform held-out pass@64, window mean", lambda: _primary("mean")),
    ("its seed-level t CI, low", lambda: _primary("lo")),
    ("... high", lambda: _primary("hi")),
    ("two-level bootstrap, low", lambda: _primary("lo", True)),
    ("... high", lambda: _primary("hi", True)),
    ("uniform − start, held-out pass@64, last point", lambda: _vs_start("uniform")),
    ("SERA − start", lambda: _vs_start("sera")),
    ("SERA − uniform held-out pass@1 over the window", lambda: _pp(
        maze_read()["table"]["curves"]["secondary"]["endpoints"]
        ["sera − uniform | eval | pass@1"]["mean"], 2)),
    ("blind pass@1, %", lambda: _read_validity("blind_pass_at_k", "1", 3)),
    ("blind pass@64, %", lambda: _read_validity("blind_pass_at_k", "64", 1)),
    ("start pass@1, %", lambda: _read_validity("start_pass_at_k", "1", 1)),
    ("start pass@64, %", lambda: _read_validity("start_pass_at_k", "64", 1)),
    ("gate: uniform − null held-out pass@1", lambda: _read_gate("mean")),
    ("its CI, low", lambda: _read_gate("lo")),
    ("... high", lambda: _read_gate("hi")),
    ("A/A false-positive rate, % of cells", lambda: _pp(
        maze_read()["table"]["aa"]["false_positive_rate"], 1, sign=False)),
    ("SERA above uniform's lr frontier at its pass@1, pp", lambda: _frontier_distance("mean")),
    ("its seed-bootstrap CI, low", lambda: _frontier_distance("lo")),
    ("... high", lambda: _frontier_distance("hi")),
    ("the matched lr (the pre-registered rule)", lambda: _sci3(_matched()["choice"]["lr"])),
    ("SERA − uniform at the matched lr, held-out pass@64, window", lambda: _matched_est("mean")),
    ("its seed-level t CI, low", lambda: _matched_est("lo")),
    ("... high", lambda: _matched_est("hi")),
]


def _frontier_distance(field: str) -> str:
    with open(os.path.join(MAZE_READ, "frontier.json")) as f:
        ci = json.load(f)["above_baseline_frontier_ci"]["sera"]
    (entry,) = ci.values()  # SERA has one point: the config's lr
    return _pp(entry[field], 2)


@functools.cache
def _matched() -> dict[str, Any]:
    with open(os.path.join(MAZE_READ, "matched.json")) as f:
        return json.load(f)


def _matched_est(field: str) -> str:
    return _pp(_matched()["result"]["estimate"][field])


def _sci3(x: float) -> str:
    mantissa, exponent = f"{x:.2e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _curve_cell(comparison: str, k: str, step: int) -> str:
    pts = maze_read()["table"]["curves"]["differences"][comparison]["eval"]["points"][k]
    p = next(p for p in pts if p["step"] == step)
    return (f"{_pp(p['mean'], 2)} [{_pp(p['lo'], 2)}, {_pp(p['hi'], 2)}]").replace("-", "−")


def maze_read_page_rows() -> set[str]:
    """Every table row the read-the-maze section may print: the report's own markdown of the
    committed comparison.json, and the over-training table derived from its curves."""
    from sera_jax.studies.paired.tables import comparison_markdown

    rows = set(comparison_markdown(maze_read()["table"]).splitlines())
    steps = [s for s in maze_read()["table"]["curves"]["steps"] if s > 0]
    rows.add("| step | " + " | ".join(str(s) for s in steps) + " |")
    for label, comparison, k in (("pass@1", "sera − uniform", "1"),
                                 ("pass@64", "sera − uniform", "64"),
                                 ("uniform − null, pass@1", "uniform − null", "1")):
        rows.add(f"| {label} | " + " | ".join(_curve_cell(comparison, k, s) for s in steps)
                 + " |")
    return rows


def test_maze_read_frontier_table_comes_from_the_data():
    from sera_jax.studies.paired.frontier import frontier_markdown

    with open(os.path.join(MAZE_READ, "frontier.json")) as f:
        allowed = set(frontier_markdown(json.load(f)).splitlines())
    with open(os.path.join(ROOT, "docs", "results_maze.md")) as f:
        page = f.read()
    section = page.split("## Is SERA more than a smaller step?", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|--")]
    assert len(rows) >= 8, "the frontier table is gone"
    missing = [r for r in rows if r not in allowed]
    assert not missing, ("docs/results_maze.md's frontier table differs from "
                         f"results/maze/maze_cpu_read/frontier.json: {missing}")


def test_maze_read_page_tables_come_from_the_data():
    with open(os.path.join(ROOT, "docs", "results_maze.md")) as f:
        page = f.read()
    section = page.split("## The default where the maze must be read", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|--")]
    assert len(rows) >= 12, "the section's tables are gone"
    allowed = maze_read_page_rows()
    missing = [r for r in rows if r not in allowed]
    assert not missing, ("docs/results_maze.md's read-the-maze tables differ from "
                         f"results/maze/maze_cpu_read/comparison.json: {missing}")


# ----------------------------------------------------------------------------- allocation lab


@functools.cache
def _lab_recompute():
    spec = importlib.util.spec_from_file_location(
        "lab_recompute", os.path.join(LAB, "recompute.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _lab_data() -> dict[str, Any]:
    return _lab_recompute().load()


@functools.cache
def lab() -> dict[str, Any]:
    return _lab_recompute().numbers(_lab_data())


def test_lab_summary_and_page_tables_are_recomputed_from_the_data():
    _, run_diff, doc_diff = _lab_recompute().check(data=_lab_data())
    assert not run_diff, "results/lab/cpu_default/summary.md differs from the recomputation:\n" + (
        "\n".join(run_diff))
    assert not doc_diff, "docs/results_lab.md differs from results/lab/cpu_default:\n" + (
        "\n".join(doc_diff))


@pytest.mark.parametrize("run", ["frontiers_answers", "frontiers_maze"])
def test_lab_frontier_tables_are_recomputed_from_the_data(run, tmp_path):
    """Every frontier-gap row of a lab frontier run (and of the page that quotes it) comes
    from its committed per-seed points; a changed value is caught."""
    spec = importlib.util.spec_from_file_location(
        "recompute_frontiers", os.path.join(ROOT, "results", "lab", "recompute_frontiers.py"))
    rf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rf)
    folder, doc = os.path.join(ROOT, "results", "lab", run), os.path.join(ROOT, "docs",
                                                                          "results_lab.md")
    assert rf.main(folder, doc) == 0
    with open(doc) as f:
        page = f.read()
    row = next(line for line in rf.rebuild(folder) if line.startswith("| sera |"))
    bad = tmp_path / "page.md"
    bad.write_text(page.replace(row, row.replace("| sera |", "| sera | 0", 1)))
    assert rf.main(folder, str(bad)) == 1


def test_lab_check_reports_a_changed_line(tmp_path):
    rc = _lab_recompute()
    with open(rc.DOC) as f:
        page = f.read()
    line = "| sera | -1.03 [-1.19, -0.87] | -1.25 [-1.49, -1.01] |"
    assert line in page
    bad = tmp_path / "page.md"
    bad.write_text(page.replace(line, line.replace("-1.03", "-1.04"), 1))
    _, run_diff, doc_diff = rc.check(doc=str(bad), data=_lab_data())
    assert not run_diff and "-1.04" in "\n".join(doc_diff) and "-1.03" in "\n".join(doc_diff)


def test_lab_t_quantile_is_scipys():
    from scipy import stats

    for df, t in _lab_recompute().T975.items():
        assert t == pytest.approx(stats.t.ppf(0.975, df), abs=1e-12)


def _lab_section(heading: str) -> str:
    with open(_lab_recompute().DOC) as f:
        text = f.read()
    return text.split("\n" + heading, 1)[1].split("\n## ", 1)[0]


def test_lab_page_opens_with_the_run():
    stamp = _lab_data()["stamp"]
    with open(_lab_recompute().DOC) as f:
        opening = f.read().split("\n\n", 2)[1]
    day = f"{int(stamp['date'][8:10])} {_MONTHS[int(stamp['date'][5:7]) - 1]} {stamp['date'][:4]}"
    assert f"commit {stamp['commit'][:7]} on {day}" in opening, (opening, stamp)


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _lab_ci(family: str, table: str, arm: str, k: int, label: str) -> list[Derivation]:
    """The three numbers of a printed interval 'mean [lo, hi]' (points, 2 decimals)."""
    p = lambda: lab()[family][table][arm][k]  # noqa: E731
    return [(f"{label}: mean", lambda: f"{p().mean:+.2f}"),
            (f"{label}: lo", lambda: f"{p().lo:+.2f}"),
            (f"{label}: hi", lambda: f"{p().hi:+.2f}")]


def _lab_config() -> dict[str, Any]:
    return _lab_data()["config"]


def _lab_gate(family: str, label: str) -> list[Derivation]:
    g = lambda: lab()[family]["gate"]  # noqa: E731
    return [(f"{label}: mean", lambda: _claim(g().lo > 0, f"{g().mean:+.2f}", "gate fails")),
            (f"{label}: lo", lambda: f"{g().lo:+.2f}"),
            (f"{label}: hi", lambda: f"{g().hi:+.2f}")]


def _lab_max_gap(arms: Sequence[str], reference: str) -> float:
    """max |mean final held-out pass@k of an arm − the reference's| over the table ks."""
    f = lab()["main"]["final"]
    return max(abs(f[a][k] - f[reference][k]) for a in arms
               for k in _lab_config()["report"]["table_ks"])


SERA_VARIANTS = ("sera_equalized", "sera_paper_rounding", "inverse_p", "sera_posterior",
                 "sera_sequential")
PEERS = ("knapsack", "hit_utility", "grpo")


def _regime(k: int, reference: str = "uniform", method: str = "sera") -> list[dict[str, Any]]:
    return [r for r in lab()["regime"] if r["k"] == k and r["reference"] == reference
            and r["method"] == method]


def _regime_above_null() -> bool:
    return all(r["paired"].lo > 0 for r in lab()["regime"] if r["reference"] == "null")


def _regime_wins(k: int) -> str:
    rows = _regime(k)
    return f"{sum(r['winner'] == 'uniform' for r in rows)}"


def _regime_ties_are_the_uniform_law() -> str:
    ties = [r for r in _regime(64) if "~" in r["winner"]]
    ok = {r["difficulty"] for r in ties} == {"uniform"} and all(
        set(r["winner"].replace(" ~ ", "/").split("/")) == {"uniform", "sera"} for r in ties)
    return _claim(ok, f"{len(ties)}", "the pass@64 ties are not the uniform law's")


def _regime_range(k: int, fn, untied: bool = False) -> str:
    rows = [r for r in _regime(k) if not (untied and "~" in r["winner"])]
    return f"{fn(r['paired'].mean for r in rows):+.2f}"


def _aa_final_max() -> float:
    return max(abs(lab()[f]["vs_uniform"]["aa"][k].mean) for f in ("main", "maze")
               for k in _lab_config()["report"]["table_ks"])


def _stamp(field: str) -> float:
    return _lab_data()["stamp"][field]


def _aa(family: str) -> tuple[int, int]:
    return lab()[family]["aa"]


def _fmt(x: float, spec: str) -> str:
    return format(x, spec)


LAB_VERDICT: list[Derivation] = [
    ("answer task lr", lambda: f"{_lab_config()['rl']['optimizer']['learning_rate']}"),
    *_lab_gate("main", "answer gate (uniform − null pass@1)"),
    *_lab_ci("main", "vs_null", "uniform", 256, "uniform − null pass@256"),
    ("start held-out pass@256, %", lambda: f"{lab()['main']['start'][256]:.1f}"),
    ("null final held-out pass@256, %", lambda: f"{lab()['main']['final']['null'][256]:.1f}"),
    *_lab_ci("main", "vs_uniform", "sera", 1, "SERA − uniform pass@1"),
    *_lab_ci("main", "vs_uniform", "sera", 64, "SERA − uniform pass@64"),
    *_lab_ci("main", "vs_uniform", "sera", 256, "SERA − uniform pass@256"),
    *_lab_ci("main", "vs_null", "sera", 256, "SERA − null pass@256"),
    ("uniform − null pass@256", lambda: f"{lab()['main']['vs_null']['uniform'][256].mean:+.2f}"),
    ("SERA variants' largest gap to SERA", lambda: f"{_lab_max_gap(SERA_VARIANTS, 'sera'):.2f}"),
    ("peers' largest gap to uniform", lambda: f"{_lab_max_gap(PEERS, 'uniform'):.2f}"),
    ("maze start held-out pass@256, %", lambda: f"{lab()['maze']['start'][256]:.1f}"),
    ("maze uniform final pass@256, %", lambda: f"{lab()['maze']['final']['uniform'][256]:.1f}"),
    ("maze null final pass@256, %", lambda: f"{lab()['maze']['final']['null'][256]:.1f}"),
    ("maze lr", lambda: f"{_lab_config()['maze_family']['learning_rate']}"),
    ("maze SERA − uniform pass@256 (no difference)",
     lambda: _claim(not lab()["maze"]["vs_uniform"]["sera"][256].significant,
                    f"{lab()['maze']['vs_uniform']['sera'][256].mean:+.2f}",
                    "SERA − uniform pass@256 differs from 0 on the maze family")),
    *_lab_ci("maze", "vs_uniform", "sera", 256, "maze SERA − uniform pass@256")[1:],
    ("maze SERA − uniform pass@64 (no difference)",
     lambda: _claim(not lab()["maze"]["vs_uniform"]["sera"][64].significant,
                    f"{lab()['maze']['vs_uniform']['sera'][64].mean:+.2f}",
                    "SERA − uniform pass@64 differs from 0 on the maze family")),
    *_lab_ci("maze", "vs_uniform", "sera", 64, "maze SERA − uniform pass@64")[1:],
    *_lab_ci("maze", "vs_uniform", "sera", 1, "maze SERA − uniform pass@1"),
    ("uniform and SERA − null at maze pass@256 (equal when rounded)",
     lambda: _claim(len({f"{lab()['maze']['vs_null'][a][256].mean:.1f}"
                         for a in ("uniform", "sera")}) == 1,
                    f"{lab()['maze']['vs_null']['sera'][256].mean:.1f}",
                    "uniform and SERA differ from the null by different amounts")),
    *_lab_ci("maze", "vs_uniform", "sera_no_multiplicity", 256,
             "maze no-multiplicity − uniform pass@256"),
    *_lab_ci("maze", "vs_uniform", "sera_no_multiplicity", 1,
             "maze no-multiplicity − uniform pass@1"),
    ("regime laws", lambda: f"{len(_lab_config()['regime']['difficulties'])}"),
    ("regime shapes", lambda: f"{len(_lab_config()['regime']['shapes'])}"),
    ("regime steps", lambda: f"{_lab_config()['regime']['num_steps']}"),
    ("regime lr (the main cell's)", lambda: f"{_lab_config()['rl']['optimizer']['learning_rate']}"),
    ("regime cells where uniform is best at pass@1", lambda: _claim(
        _regime_wins(1) == f"{len(_regime(1))}", _regime_wins(1), "uniform not best everywhere")),
    ("SERA − uniform pass@1, largest", lambda: _regime_range(1, max)),
    ("... smallest", lambda: _regime_range(1, min)),
    ("regime cells where uniform is best at pass@64", lambda: _regime_wins(64)),
    ("pass@64 ties, all under the uniform law", _regime_ties_are_the_uniform_law),
    ("SERA − uniform pass@64 outside the ties, largest",
     lambda: _claim(_regime_above_null(), _regime_range(64, max, True),
                    "an arm is not above the null in some regime cell")),
    ("... smallest", lambda: _regime_range(64, min, True)),
    *_lab_gate("main", "answer gate"),
    *_lab_gate("maze", "maze gate"),
    ("A/A cells flagged, answer task", lambda: f"{_aa('main')[0]}"),
    ("A/A cells, answer task", lambda: f"{_aa('main')[1]}"),
    ("... %", lambda: f"{100 * _aa('main')[0] / _aa('main')[1]:.1f}"),
    ("A/A cells flagged, maze family", lambda: f"{_aa('maze')[0]}"),
    ("A/A cells, maze family", lambda: f"{_aa('maze')[1]}"),
    ("... %", lambda: f"{100 * _aa('maze')[0] / _aa('maze')[1]:.1f}"),
    ("nominal rate, %", given("5", "the CI level's complement (95 % intervals)")),
    ("largest final A/A difference", lambda: f"{_aa_final_max():.2f}"),
    ("wall time of the command, s", lambda: f"{_stamp('wall_time_s'):.0f}"),
    ("... min", lambda: f"{int(round(_stamp('wall_time_s')) // 60)}"),
    ("... s", lambda: f"{int(round(_stamp('wall_time_s')) % 60)}"),
    ("inside the study, s", lambda: f"{_stamp('study_wall_s'):.0f}"),
    ("main cell, s", lambda: f"{_stamp('main_cell_s'):.0f}"),
    ("CPU time, s", lambda: f"{_stamp('cpu_time_s'):.0f}"),
    ("the target, min", lambda: _claim(_stamp("wall_time_s") <= 7 * 60, "7",
                                       "the run took more than 7 minutes")),
    ("nice level", given("19", "the command's nice -n 19 (stamp.json's command)")),
    ("load average during the run, min", lambda: f"{_stamp('load_1min_samples')['min']:.1f}"),
    ("... max", lambda: f"{_stamp('load_1min_samples')['max']:.1f}"),
]

#: Shortest-path bins of the notes (inclusive); together they must cover every L in the data.
L_BINS = ((2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 12))


def _p_by_length(lo: int, hi: int) -> float:
    p, length = lab()["p0"]["maze"], lab()["p0"]["length"]
    assert {int(x) for x in np.unique(length)} == {
        x for a, b in L_BINS for x in range(a, b + 1)}, np.unique(length)
    return 100 * float(p[(length >= lo) & (length <= hi)].mean())


def _bin(lo: int, hi: int, spec: str) -> list[Derivation]:
    out: list[Derivation] = [(f"L bin {lo}-{hi}: low edge", lambda: f"{lo}")]
    if hi != lo:
        out.append((f"L bin {lo}-{hi}: high edge", lambda: f"{hi}"))
    if spec == "≈0":
        out.insert(0, (f"mean p at L {lo}-{hi}, % (≈ 0)",
                       lambda: _claim(_p_by_length(lo, hi) < 0.005, "0", "not ≈ 0")))
    else:
        out.insert(0, (f"mean p at L {lo}-{hi}, %", lambda: format(_p_by_length(lo, hi), spec)))
    return out


def _lab_start(family: str, k: int) -> Derivation:
    return (f"{family} start held-out pass@{k}, %", lambda: f"{lab()[family]['start'][k]:.1f}")


def _maze_p0() -> np.ndarray:
    return lab()["p0"]["maze"]


def _diag(arm: str, column: str) -> Derivation:
    return (f"{arm} {column}", lambda: f"{lab()['diag'][arm][column]:.3f}")


def _regime_vs_null(fn) -> str:
    return f"{fn(r['paired'].mean for r in _regime(1, 'null', 'uniform')):+.2f}"


LAB_NOTES: list[Derivation] = [
    *[_lab_start("main", k) for k in (1, 16, 256, 1024)],
    ("steps", lambda: f"{_lab_config()['rl']['num_steps']}"),
    ("epochs", lambda: f"{_lab_config()['rl']['num_steps'] * _lab_config()['rl']['prompts_per_step'] // _lab_config()['task']['num_train']}"),  # noqa: E501
    ("training prompts", lambda: f"{_lab_config()['task']['num_train']}"),
    ("rollouts per seed and arm", lambda: f"{_lab_config()['rl']['num_steps'] * _lab_config()['rl']['prompts_per_step'] * _lab_config()['rl']['rollouts_per_prompt']:,}"),  # noqa: E501
    *[_lab_start("maze", k) for k in (1, 16, 256, 1024)],
    ("maze initial p, seed 0 mean, %", lambda: f"{100 * _maze_p0()[0].mean():.1f}"),
    ("... over all seeds, %", lambda: f"{100 * _maze_p0().mean():.1f}"),
    ("seed 0's prompts below 1 %, %", lambda: f"{100 * (_maze_p0()[0] < 0.01).mean():.0f}"),
    ("the threshold, %", given("1", "p < 0.01, the study's summary line")),
    *_bin(2, 3, ".0f"), *_bin(4, 5, ".0f"), *_bin(6, 7, ".1f"), *_bin(8, 9, ".1f"),
    *_bin(10, 11, ".2f"), *_bin(12, 12, "≈0"),
    _diag("sera", "kappa_mean"), _diag("sera", "kappa_min"),
    _diag("uniform", "kappa_mean"), _diag("uniform", "kappa_min"),
    ("κ near 1 (its ceiling); SERA's κ lower on average, higher at the minimum", lambda: _claim(
        lab()["diag"]["sera"]["kappa_mean"] < lab()["diag"]["uniform"]["kappa_mean"]
        and lab()["diag"]["sera"]["kappa_min"] > lab()["diag"]["uniform"]["kappa_min"],
        "1", "SERA's κ is not lower on average and higher at the minimum")),
    _diag("sera", "cosine"), _diag("uniform", "cosine"),
    ("regime lr", lambda: f"{_lab_config()['rl']['optimizer']['learning_rate']}"),
    ("regime steps", lambda: f"{_lab_config()['regime']['num_steps']}"),
    ("regime uniform − null pass@1, smallest", lambda: _regime_vs_null(min)),
    ("... largest", lambda: _regime_vs_null(max)),
    *_lab_ci("main", "vs_sera", "sera_posterior", 1, "sera_posterior − SERA pass@1"),
    *_lab_ci("main", "vs_sera", "sera_posterior", 4, "sera_posterior − SERA pass@4"),
    ("sera_sequential − SERA contains 0 at every k",
     lambda: _claim(not any(lab()["main"]["vs_sera"]["sera_sequential"][k].significant
                            for k in _lab_config()["report"]["table_ks"]), "0",
                    "sera_sequential differs from SERA at some k")),
]

LAB_SECTIONS: dict[str, list[Derivation]] = {
    "## The verdict": LAB_VERDICT,
    "## Notes on the measured tables": LAB_NOTES,
}


@pytest.mark.parametrize("heading", sorted(LAB_SECTIONS))
def test_lab_page_numbers_come_from_the_data(heading):
    derivations = LAB_SECTIONS[heading]
    text = _lab_section(heading)
    # `numbers` does not read a number that ends a sentence ("... 1.36."): none may hide so.
    hidden = re.findall(r"(?<![@\w.,])\d+(?:\.\d+)?\.(?=[\s)]|$)", text)
    assert not hidden, f"numbers ending a sentence (unread, unchecked) in {heading!r}: {hidden}"
    printed = numbers(text)
    derived = [fn() for _, fn in derivations]
    report = "\n".join(
        f"  {label}: page {p!r}, data {d!r}{'' if p == d else '   <-- differs'}"
        for (label, _), p, d in zip(derivations, printed, derived))
    assert len(printed) == len(derived), (
        f"docs/results_lab.md {heading!r} prints {len(printed)} numbers {printed}, the "
        f"derivations give {len(derived)} {derived}:\n{report}")
    assert printed == derived, f"docs/results_lab.md {heading!r} vs results/lab:\n{report}"


LAB_ROW: list[Derivation] = [
    ("paired seeds", lambda: f"{len(_lab_config()['compare']['seeds'])}"),
    ("answer SERA − uniform pass@256 (no coverage gain in either family)",
     lambda: _claim(all(lab()[f]["vs_uniform"]["sera"][256].lo <= 0 for f in ("main", "maze")),
                    f"{lab()['main']['vs_uniform']['sera'][256].mean:+.2f}",
                    "SERA gains coverage (pass@256) in a family")),
    *_lab_ci("main", "vs_uniform", "sera", 256, "answer SERA − uniform pass@256")[1:],
    ("answer SERA − uniform pass@1", lambda: f"{lab()['main']['vs_uniform']['sera'][1].mean:+.2f}"),
    ("maze SERA − uniform pass@256 (n.s.)",
     lambda: _claim(not lab()["maze"]["vs_uniform"]["sera"][256].significant,
                    f"{lab()['maze']['vs_uniform']['sera'][256].mean:+.2f}",
                    "the maze family's SERA − uniform pass@256 is significant")),
    *_lab_ci("maze", "vs_uniform", "sera", 256, "maze SERA − uniform pass@256")[1:],
    # The row's last number, the maze family's pass@1 (−1.36), ends a sentence, which
    # `numbers` does not read: test_lab_readme_row_pass_at_1 checks it.
]


def test_lab_readme_row_pass_at_1():
    """The README row's "pass@1 <Δ>" numbers (answer task, then maze family), read whether or
    not a full stop follows them."""
    row = next(r for c, r in readme_rows().items() if c.startswith("Allocation lab"))
    printed = [m.replace("−", "-") for m in re.findall(r"pass@1 ([+\-−]\d+\.\d+)", row)]
    assert printed == [f"{lab()[f]['vs_uniform']['sera'][1].mean:+.2f}"
                       for f in ("main", "maze")], printed


MAZE_LONG = os.path.join(ROOT, "results", "maze", "maze_cpu_long")


@functools.cache
def _maze_long_blind() -> dict[str, Any]:
    with open(os.path.join(MAZE_LONG, "blind.json")) as f:
        return json.load(f)


MAZE_LONG_ROW: list[Derivation] = [
    ("maze size", lambda: f"{_maze_long_blind()['size']}"),
    ("maze size", lambda: f"{_maze_long_blind()['size']}"),
    ("blind control held-out pass@64, % (exact)",
     lambda: f"{100 * _maze_long_blind()['blind_pass_at_k']['64']:.1f}"),
]


# ----------------------------------------------------------------------------- math

MATH = os.path.join(ROOT, "results", "math", "math_smollm2_arith")


@functools.cache
def math_table() -> dict[str, Any]:
    """The math default's committed comparison (configs/math/smollm2_arith.py)."""
    with open(os.path.join(MATH, "comparison.json")) as f:
        return json.load(f)


def _m_pass(arm: str, k: str) -> str:
    t = math_table()
    v = t["sft"]["pass_at_k"][k] if arm == "start" else (
        t["blind"]["pass_at_k"][k] if arm == "blind" else t["methods"][arm]["pass_at_k"][k]["mean"])
    return _pp(v, 1, sign=False)


def _m_primary(field: str, two_level: bool = False) -> str:
    p = math_table()["curves"]["primary"]
    return _pp((p["two_level"] if two_level else p["estimate"])[field])


def _mde(estimate: dict[str, Any]) -> float:
    """The minimal detectable paired difference at 80 % power and 5 % two-sided, from a
    seed-level estimate's sd and seed count (t quantiles; recomputed here, not read)."""
    from scipy import stats

    n = int(estimate["seeds"])
    return ((stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.80, n - 1))
            * float(estimate["sd"]) / math.sqrt(n))


def _m_gate(field: str) -> str:
    return _pp(math_table()["curves"]["gate"][field])


MATH_ROW: list[Derivation] = [
    ("paired seeds", lambda: f"{math_table()['curves']['primary']['estimate']['seeds']}"),
    ("start held-out pass@1, last point's keys, %", lambda: _m_pass("start", "1")),
    ("uniform held-out pass@1, %", lambda: _m_pass("uniform", "1")),
    ("SERA held-out pass@1, %", lambda: _m_pass("sera", "1")),
    ("RL steps", lambda: f"{math_table()['num_steps']}"),
    ("primary: SERA − uniform held-out pass@16, window", lambda: _m_primary("mean")),
    ("its seed-level t CI, low", lambda: _m_primary("lo")),
    ("... high", lambda: _m_primary("hi")),
    ("its MDE at 80 % power: (t_.975 + t_.80, S − 1 df) · sd / √S of the paired seeds",
     lambda: _pp(_mde(math_table()["curves"]["primary"]["estimate"]), sign=False)),
    ("blind pass@1, %", lambda: _m_pass("blind", "1")),
    ("blind pass@16, %", lambda: _m_pass("blind", "16")),
    ("start pass@1, %", lambda: _m_pass("start", "1")),
    ("start pass@16, %", lambda: _m_pass("start", "16")),
    ("gate: uniform − null held-out pass@1, window", lambda: _m_gate("mean")),
    ("null seeds", lambda: f"{len(math_table()['curves']['gate']['seeds'])}"),
    ("its t band, low", lambda: _m_gate("lo")),
    ("... high", lambda: _m_gate("hi")),
    ("A/A cells excluding 0", lambda: f"{math_table()['curves']['aa']['false_positives']}"),
    ("A/A cells", lambda: f"{math_table()['curves']['aa']['cells']}"),
]


def test_math_page_tables_come_from_the_data():
    """Every table row of the math default's section is a row of the report's own markdown
    of the committed comparison.json."""
    from sera_jax.studies.paired.tables import comparison_markdown

    with open(os.path.join(ROOT, "docs", "results_math.md")) as f:
        page = f.read()
    section = page.split("## The paired default", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("|") and not ln.startswith("|--")]
    assert len(rows) >= 10, "the section's tables are gone"
    allowed = set(comparison_markdown(math_table()).splitlines())
    missing = [r for r in rows if r not in allowed]
    assert not missing, ("docs/results_math.md's tables differ from "
                         f"results/math/math_smollm2_arith/comparison.json: {missing}")


# ----------------------------------------------------------------------------- speed

SPEED = os.path.join(ROOT, "results", "speed", "2026-12-04_cpu_head")


@functools.cache
def speed_table(name: str) -> list[dict[str, str]]:
    """The markdown table of a committed benchmark report, as {header: cell} rows."""
    with open(os.path.join(SPEED, name)) as f:
        lines = [ln for ln in f if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip().strip("|").split("|"))))
            for ln in lines[2:]]


def _ratio(cell: str) -> float:
    """The first ratio of a '2.32x / 2.31x' cell."""
    return float(cell.split("x")[0])


def _step(task: str, *variants: str) -> list[float]:
    """sera_jax uniform's step ratio vs PyTorch (wall) for each variant ('' = plain)."""
    rows = {r["side"]: r for r in speed_table(f"rl_step_{task}.md")}
    return [_ratio(rows["sera_jax uniform" + (f" ({v})" if v else "")]
                   ["speed-up vs PyTorch (wall / CPU)"]) for v in variants]


def _span(values: Sequence[float], digits: int, end: int) -> str:
    return f"{sorted(values)[end]:.{digits}f}"


def _alloc() -> list[float]:
    return [_ratio(r["speed-up (wall / cpu)"]) for r in speed_table("allocation.md")
            if int(r["P"].replace(",", "")) >= 65536]


SPEED_ROW: list[Derivation] = [
    ("maze plain", lambda: f"{_step('maze', '')[0]:.2f}"),
    ("maze shared variants, low", lambda: _span(_step("maze", "shared", "packed_shared"), 2, 0)),
    ("... high", lambda: _span(_step("maze", "shared", "packed_shared"), 2, -1)),
    ("math plain", lambda: f"{_step('math', '')[0]:.2f}"),
    ("math shared variants, low", lambda: _span(_step("math", "shared", "packed_shared"), 2, 0)),
    ("... high", lambda: _span(_step("math", "shared", "packed_shared"), 2, -1)),
    ("allocator wall speed-up at P >= 65,536, low", lambda: _span(_alloc(), 1, 0)),
    ("... high", lambda: _span(_alloc(), 1, -1)),
    ("the P threshold", given("65,536", "the sizes _alloc reads (allocation.md's P column)")),
    ("sampler speed-up, low", lambda: _span(
        [_ratio(r["speed-up"]) for r in speed_table("sampler.md")], 2, 0)),
    ("... high", lambda: _span([_ratio(r["speed-up"]) for r in speed_table("sampler.md")], 2, -1)),
]


def _frontier_config(task: str) -> dict[str, Any]:
    with open(os.path.join(ROOT, "results", "lab", f"frontiers_{task}", "config.json")) as f:
        return json.load(f)


@functools.cache
def _frontier_gaps(task: str) -> dict[str, tuple[str, str, str]]:
    """{method: (mean, lo, hi)} of the frontier-gap table of a committed lab frontier
    summary (its numbers are checked against sweep.json.gz by recompute_frontiers)."""
    with open(os.path.join(ROOT, "results", "lab", f"frontiers_{task}", "summary.md")) as f:
        text = f.read()
    table = text.split("Frontier gap vs uniform", 1)[1].split("\n\n", 2)[1]
    out = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        m = re.match(r"([+\-]\d+\.\d+) \[([+\-]\d+\.\d+), ([+\-]\d+\.\d+)\]", cells[2])
        out[cells[0]] = m.groups()
    return out


def _frontier_lrs() -> list[int]:
    return [len(_frontier_config(t)["sweep"]["learning_rates"]) for t in ("answers", "maze")]


def _gap(task: str, method: str, i: int) -> str:
    return _frontier_gaps(task)[method][i]


def _peers_contain_zero() -> bool:
    return all(float(_gap(t, m, 1)) <= 0 <= float(_gap(t, m, 2))
               for t in ("answers", "maze") for m in ("vip", "gdro", "pilot_commit"))


FRONTIER_ROW: list[Derivation] = [
    ("methods", lambda: f"{len(_frontier_config('answers')['sweep']['methods'])}"),
    ("lrs, fewest", lambda: f"{min(_frontier_lrs())}"),
    ("lrs, most", lambda: f"{max(_frontier_lrs())}"),
    ("paired seeds", lambda: f"{len(_frontier_config('answers')['compare']['seeds'])}"),
    *[(f"{t} SERA gap {w}", (lambda t=t, i=i: _gap(t, "sera", i)))
      for t in ("answers", "maze") for i, w in enumerate(("mean", "lo", "hi"))],
    ("the 2026 allocators (a year, not data): every gap interval contains 0",
     lambda: _claim(_peers_contain_zero(), "2026", "a 2026 allocator's gap excludes 0")),
    *[(f"maze hit_utility gap {w}", (lambda i=i: _gap("maze", "hit_utility", i)))
      for i, w in enumerate(("mean", "lo", "hi"))],
    *[(f"maze GRPO gap {w}", (lambda i=i: _gap("maze", "grpo", i)))
      for i, w in enumerate(("mean", "lo", "hi"))],
]


#: README rows (by the start of their first cell) whose numbers are derived from the data.
TRACED: dict[str, tuple[str, list[Derivation]]] = {
    "Gradient alignment, digits": ("results/alignment/digits", ALIGNMENT_ROW),
    "Maze, 17×17": ("results/device/2026-12-04_h200", MAZE17_ROW),
    "Maze that must be read": ("results/maze/maze_cpu_read", MAZE_READ_ROW),
    "Maze, 9×9": ("results/maze/maze_cpu_long", MAZE_LONG_ROW),
    "Math, SmolLM2-135M": ("results/math/math_smollm2_arith", MATH_ROW),


    "Allocation lab": ("results/lab/cpu_default", LAB_ROW),
    "Learning-rate frontiers": ("results/lab/frontiers_{answers,maze}", FRONTIER_ROW),
    "Speed vs PyTorch": ("results/speed/2026-12-04_cpu_head", SPEED_ROW),
}


def _key(first_cell: str) -> str | None:
    keys = [k for k in (*TRACED, *UNTRACED) if first_cell.startswith(k)]
    assert len(keys) <= 1, (first_cell, keys)
    return keys[0] if keys else None


def test_every_results_row_is_traced_or_listed():
    rows = readme_rows()
    missing = [c for c in rows if _key(c) is None]
    assert not missing, ("README results rows neither traced to a results file (TRACED) nor "
                         f"listed as untraced with a reason (UNTRACED): {missing}")
    stale = [k for k in (*TRACED, *UNTRACED) if not any(c.startswith(k) for c in rows)]
    assert not stale, f"TRACED/UNTRACED name rows the README no longer has: {stale}"
    assert not set(TRACED) & set(UNTRACED)


@pytest.mark.parametrize("key", sorted(TRACED))
def test_readme_row_numbers_come_from_the_data(key):
    folder, derivations = TRACED[key]
    row = next(r for c, r in readme_rows().items() if c.startswith(key))
    printed = numbers(row)
    derived = [fn() for _, fn in derivations]
    report = "\n".join(
        f"  {label}: README {p!r}, data {d!r}{'' if p == d else '   <-- differs'}"
        f"{' (given: ' + fn.given + ')' if hasattr(fn, 'given') else ''}"
        for (label, fn), p, d in zip(derivations, printed, derived))
    assert len(printed) == len(derived), (
        f"the README's {key!r} row prints {len(printed)} numbers {printed}, the derivations "
        f"from {folder} give {len(derived)} {derived}:\n{report}")
    assert printed == derived, f"the README's {key!r} row vs {folder}:\n{report}"


# ----------------------------------------------------------------------------- tunix


def test_tunix_page_table_comes_from_the_records():
    """docs/tunix.md's measured real-model table is derived from the committed records."""
    with open(os.path.join(ROOT, "results", "tunix", "smollm2_math", "records.json")) as f:
        records = json.load(f)
    with open(os.path.join(ROOT, "docs", "tunix.md")) as f:
        page = f.read()
    for name, label in (("uniform", "uniform"), ("sera", "SERA")):
        r = records[name]
        reward = [x["reward_mean"] for x in r]
        length = [x["length_mean"] for x in r]
        row = (f"| {label} | {statistics.fmean(reward[:5]):.3f} | "
               f"{statistics.fmean(reward[-5:]):.3f} | {statistics.fmean(reward):.3f} | "
               f"{statistics.fmean(length[:5]):.1f} → {statistics.fmean(length[-5:]):.1f} | "
               f"{sum(x['dapo/generated_rollouts'] for x in r)} / "
               f"{sum(x['dapo/generated_tokens'] for x in r):,} |")
        assert row in page, f"docs/tunix.md lacks the row derived from the records: {row}"
        assert all(sum(x["counts"]) == 16 for x in r)  # the budget P x N0 every step
