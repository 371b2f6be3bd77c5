"""Every number of the README's results table comes from a committed results file.

* `results/alignment/recompute.py` rebuilds docs/results_alignment.md's measured tables from
  `results/alignment/digits/` and every line matches the page.
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
from collections.abc import Callable
from typing import Any

import pytest

from tests import util

ROOT = util.ROOT
ALIGNMENT = os.path.join(ROOT, "results", "alignment")
DEVICE = os.path.join(ROOT, "results", "device", "2026-12-04_h200")
MAZE_READ = os.path.join(ROOT, "results", "maze", "maze_cpu_read")

#: README rows (by the start of their first cell) whose data is not committed yet.
UNTRACED = {
    "Maze, 9×9": "the 2 Dec long-horizon run (configs/maze/cpu.py, 8 seeds) and its blind "
                 "control are not committed; only docs/results_maze.md's prose holds them",
    "Math, SmolLM2-135M": "the one-seed, 4-step math run's outputs are not committed",
    "Allocation lab": "the 64-seed lab run's outputs (configs/allocation_lab/cpu.py) are not "
                      "committed",
    "Speed vs PyTorch": "measured at 7813cdc, before the 2 Dec refactor; no results file: to "
                        "be re-measured at HEAD (issue 39 item 1)",
}


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
]


def _curve_cell(comparison: str, k: str, step: int) -> str:
    pts = maze_read()["table"]["curves"]["differences"][comparison]["eval"]["points"][k]
    p = next(p for p in pts if p["step"] == step)
    return (f"{_pp(p['mean'], 2)} [{_pp(p['lo'], 2)}, {_pp(p['hi'], 2)}]").replace("-", "−")


def maze_read_page_rows() -> set[str]:
    """Every table row the read-the-maze section may print: the report's own markdown of the
    committed comparison.json, and the over-training table derived from its curves."""
    from sera_jax.studies.maze.tables import comparison_markdown

    rows = set(comparison_markdown(maze_read()["table"]).splitlines())
    steps = [s for s in maze_read()["table"]["curves"]["steps"] if s > 0]
    rows.add("| step | " + " | ".join(str(s) for s in steps) + " |")
    for label, comparison, k in (("pass@1", "sera − uniform", "1"),
                                 ("pass@64", "sera − uniform", "64"),
                                 ("uniform − null, pass@1", "uniform − null", "1")):
        rows.add(f"| {label} | " + " | ".join(_curve_cell(comparison, k, s) for s in steps)
                 + " |")
    return rows


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


#: README rows (by the start of their first cell) whose numbers are derived from the data.
TRACED: dict[str, tuple[str, list[Derivation]]] = {
    "Gradient alignment, digits": ("results/alignment/digits", ALIGNMENT_ROW),
    "Maze, 17×17": ("results/device/2026-12-04_h200", MAZE17_ROW),
    "Maze that must be read": ("results/maze/maze_cpu_read", MAZE_READ_ROW),
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
