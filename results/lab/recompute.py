"""Rebuild the allocation lab's summary from the committed run and check it against the run's
own summary.md and against docs/results_lab.md:

    python results/lab/recompute.py [results/lab/cpu_default] [docs/results_lab.md]

Reads the run's folder alone (numpy, csv, gzip, json; no study code, no JAX) --
`curves.csv.gz` (every arm's exact pass@k per seed, evaluation and split), `diagnostics.csv.gz`
(per-seed sums of the per-step metrics), `initial_p.csv.gz` (held-out initial p),
`config.json`, `stamp.json` -- and rebuilds every table and number of the study's
`summary.md` with the study's arithmetic (`sera_jax.studies.lab.cells`, `regime` and
`sera_jax.studies.compare`'s `seed_difference` / `winner` / `format_interval`: final pass@k
means, paired Student-t intervals over the 64 seeds, the gate, the A/A count, the regime
winners, the diagnostics means), re-implemented here in numpy. Prints it, then compares it
line by line with (1) the run's `summary.md` and (2) the page's "Measured tables" section
from its first sub-heading on (headings compared without their '#' marks). Exit status 1
when any line differs (a unified diff says which), 0 when all match.

The A/A arm is `aa` (as in the paired studies); the run's files call it by its old name
`uniform_aa`, which `OLD_ARMS` maps to `aa` on reading: the arm column of `curves.csv.gz` and
`diagnostics.csv.gz`, and the run's `summary.md` before it is compared.

`numbers()` returns the same results as plain values (for the checks of the page's and the
README's prose: `tests/test_results_data.py`).
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(ROOT, "results", "lab", "cpu_default")
DOC = os.path.join(ROOT, "docs", "results_lab.md")
#: The page's section the tables live in (its heading starts so); it ends at the next `## `.
SECTION = "## Measured tables"
NULL, AA = "null", "aa"
#: Arm names of files written before the A/A arm was renamed -> the current name.
OLD_ARMS = {"uniform_aa": AA}
SPLITS = ("train", "held-out")
STEP_METRICS = ("cosine", "kappa_mean", "kappa_min", "active_frac", "mixed_frac",
                "reward_mean", "phat_abs_err", "grad_norm", "loss", "generated")
#: t_{0.975, S-1} for the paired Student-t interval (scipy.stats.t.ppf(0.975, 63); the test
#: compares it with scipy).
T975 = {63: 1.998340542520741}


# ----------------------------------------------------------------------------- data


def _gz_rows(path: str) -> list[dict[str, str]]:
    """The rows of a gzipped csv; an `arm` column with its old names mapped (`OLD_ARMS`)."""
    with gzip.open(path, "rt", newline="") as f:
        rows = list(csv.DictReader(io.StringIO(f.read())))
    for r in rows:
        if "arm" in r:
            r["arm"] = OLD_ARMS.get(r["arm"], r["arm"])
    return rows


def renamed_arms(text: str) -> str:
    """`text` with every old arm name (`OLD_ARMS`, as a whole word) replaced by the new one."""
    for old, new in OLD_ARMS.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def load(folder: str = FOLDER) -> dict[str, Any]:
    """The run's files: {'cells': {(cell, law, (P, N0, n_max)): {arm: {'pass_at_k':
    float32[S, E, 2, K], 'steps': [E]}}}, 'ks', 'diag': {(cell, arm, metric): (sum[S],
    count[S])}, 'p0': {family: float32[S, M]}, 'length': int[S, M], 'config', 'stamp',
    'summary'}."""
    rows = _gz_rows(os.path.join(folder, "curves.csv.gz"))
    ks = [int(c.split("@")[1]) for c in rows[0] if c.startswith("pass@")]
    groups: dict[tuple, dict[str, dict[tuple[int, int, int], list[str]]]] = {}
    for r in rows:
        key = (r["cell"], r["law"], (int(r["P"]), int(r["N0"]), int(r["n_max"])))
        arm = groups.setdefault(key, {}).setdefault(r["arm"], {})
        arm[(int(r["seed"]), int(r["step"]), SPLITS.index(r["split"]))] = [
            r[f"pass@{k}"] for k in ks]
    cells: dict[tuple, dict[str, dict[str, Any]]] = {}
    for key, arms in groups.items():
        cells[key] = {}
        for arm, vals in arms.items():  # arms in the study's order (the file's)
            seeds = sorted({s for s, _, _ in vals})
            steps = sorted({e for _, e, _ in vals})
            a = np.empty((len(seeds), len(steps), 2, len(ks)), np.float32)
            for (s, e, sp), v in vals.items():
                a[seeds.index(s), steps.index(e), sp] = np.asarray(v, np.float32)
            cells[key][arm] = {"pass_at_k": a, "steps": steps}
    diag: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}
    acc: dict[tuple[str, str, str], list[tuple[int, float, int]]] = {}
    for r in _gz_rows(os.path.join(folder, "diagnostics.csv.gz")):
        acc.setdefault((r["cell"], r["arm"], r["metric"]), []).append(
            (int(r["seed"]), float(r["sum"]), int(r["count"])))
    for key, v in acc.items():
        v.sort()
        diag[key] = (np.array([x[1] for x in v]), np.array([x[2] for x in v]))
    p0: dict[str, dict[tuple[int, int], str]] = {}
    lengths: dict[tuple[int, int], int] = {}
    for r in _gz_rows(os.path.join(folder, "initial_p.csv.gz")):
        p0.setdefault(r["family"], {})[(int(r["seed"]), int(r["prompt"]))] = r["p0"]
        if r["shortest_path"]:
            lengths[(int(r["seed"]), int(r["prompt"]))] = int(r["shortest_path"])

    def grid(d):
        s = 1 + max(k[0] for k in d)
        m = 1 + max(k[1] for k in d)
        return [[d[(i, j)] for j in range(m)] for i in range(s)]

    out: dict[str, Any] = {"cells": cells, "ks": ks, "diag": diag,
                           "p0": {f: np.asarray(grid(d), np.float32) for f, d in p0.items()},
                           "length": np.asarray(grid(lengths), np.int64)}
    for name in ("config", "stamp"):
        with open(os.path.join(folder, f"{name}.json")) as f:
            out[name] = json.load(f)
    with open(os.path.join(folder, "summary.md")) as f:
        out["summary"] = f.read()
    return out


# ----------------------------------------------------------------------------- statistics


class Paired(NamedTuple):
    """`sera_jax.studies.compare.seed_difference` (method 't'): mean of a − b over seeds,
    95 % t interval; `fmt` as `compare.format_interval`."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def significant(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def fmt(self, digits: int = 2) -> str:
        tag = "" if self.significant else " (n.s.)"
        return (f"{self.mean:+.{digits}f} [{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"
                f"{tag}")


def paired(a: np.ndarray, b: np.ndarray) -> Paired:
    """`compare.seed_difference`: mean(d) ± t_{0.975, S−1} · sd(d, ddof 1)/√S, d = a − b."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    n = d.size
    half = T975[n - 1] * d.std(ddof=1) / np.sqrt(n)
    return Paired(float(d.mean()), float(d.mean() - half), float(d.mean() + half), n)


def final(res: dict[str, Any], split: int, k_index: int) -> np.ndarray:
    """Per-seed final pass@k (percent), float32 as the study computes it."""
    return 100.0 * res["pass_at_k"][:, -1, split, k_index]


def winner(samples: dict[str, np.ndarray]) -> tuple[str, list[str]]:
    """`compare.winner`: the best mean, and the arms whose paired interval against it
    contains 0."""
    names = list(samples)
    best = max(names, key=lambda n: float(np.mean(samples[n])))
    return best, [n for n in names if n != best
                  and not paired(samples[best], samples[n]).significant]


# ----------------------------------------------------------------------------- tables


def table_final(results, ks, table_ks, split: int) -> str:
    idx = [ks.index(k) for k in table_ks]
    lines = ["| method | " + " | ".join(f"pass@{k}" for k in table_ks) + " |",
             "|---|" + "---|" * len(idx)]
    for name, res in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{final(res, split, i).mean():.2f}"
                                                  for i in idx) + " |")
    return "\n".join(lines)


def table_paired(results, ks, table_ks, split: int, reference: str, names) -> str:
    idx = [ks.index(k) for k in table_ks]
    lines = [f"| method − {reference} | " + " | ".join(f"Δ pass@{k}" for k in table_ks) + " |",
             "|---|" + "---|" * len(idx)]
    for name in names:
        if name == reference or name not in results:
            continue
        lines.append(f"| {name} | " + " | ".join(
            paired(final(results[name], split, i), final(results[reference], split, i)).fmt()
            for i in idx) + " |")
    return "\n".join(lines)


DIAG_COLUMNS = ("cosine", "kappa_mean", "kappa_min", "phat_abs_err", "mixed_frac",
                "active_frac", "reward_mean")


def diagnostic(data, cell: str, arm: str, metric: str) -> float:
    """The pooled mean over seeds and steps (np.nanmean of the study's [S, T] array)."""
    s, c = data["diag"][(cell, arm, metric)]
    return float(s.sum() / c.sum())


def table_diagnostics(data, cell: str, arms: Sequence[str]) -> str:
    lines = ["| method | " + " | ".join(DIAG_COLUMNS) + " | rollouts std |",
             "|---|" + "---|" * (len(DIAG_COLUMNS) + 1)]
    for name in arms:
        vals = [f"{diagnostic(data, cell, name, c):.3f}" for c in DIAG_COLUMNS]
        vals.append(f"{diagnostic(data, cell, name, 'rollouts_std'):.2f}")
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def gate(results, ks) -> dict[str, Any]:
    i = list(ks).index(1)
    d = paired(final(results["uniform"], 1, i), final(results[NULL], 1, i))
    return {"delta": d, "admissible": bool(d.lo > 0)}


def gate_line(g, lr: float) -> str:
    verdict = ("ADMISSIBLE (uniform beats the null at pass@1)" if g["admissible"] else
               "NOT ADMISSIBLE (uniform does not beat the null at pass@1: the comparison "
               "below measures optimiser noise, not learning)")
    return f"**Gate, lr {lr}:** uniform − null pass@1 = {g['delta'].fmt()} → {verdict}."


def aa_false_positives(results, split: int = 1) -> tuple[int, int]:
    a, b = results[AA]["pass_at_k"], results["uniform"]["pass_at_k"]
    cells = [(e, i) for e in range(1, a.shape[1]) for i in range(a.shape[3])]
    sig = sum(paired(100 * a[:, e, split, i], 100 * b[:, e, split, i]).significant
              for e, i in cells)
    return int(sig), len(cells)


def report_cell(results, ks, table_ks, ref, names, lr, title="") -> list[str]:
    lines = [f"## {title}Final held-out pass@k (%)", "", table_final(results, ks, table_ks, 1),
             "", f"## {title}Paired differences vs {ref} (held-out, points)", "",
             table_paired(results, ks, table_ks, 1, ref, names), ""]
    g = gate(results, ks)
    sig, cells = aa_false_positives(results)
    return lines + [
        f"## {title}Controls: gate, null, A/A (held-out, points)", "",
        "null = uniform with the rewards of each batch shuffled (same lr, budget and "
        f"rollouts); {AA} = uniform on another rollout stream (same task, initial "
        "policy and data order).", "", gate_line(g, lr), "",
        table_paired(results, ks, table_ks, 1, NULL, list(names) + [AA]), "",
        f"A/A: {AA} − uniform has a CI excluding 0 in {sig} of {cells} (k, "
        f"evaluation) cells ({100 * sig / cells:.1f} %; 5 % if the CIs were nominal and "
        "the cells independent).", "",
        table_paired(results, ks, table_ks, 1, "uniform", [AA]), ""]


def regime_rows(data, references) -> list[dict[str, Any]]:
    c = data["config"]
    ks = data["ks"]
    rows = []
    for shape in [tuple(s) for s in c["regime"]["shapes"]]:
        for law in c["regime"]["difficulties"]:
            results = data["cells"][("regime", law, shape)]
            for k in c["regime"]["ks"]:
                i = ks.index(k)
                finals = {n: final(r, 1, i) for n, r in results.items() if n != AA}
                best, ties = winner({n: v for n, v in finals.items() if n != NULL})
                win = best if not ties else f"{best} ~ {'/'.join(ties)}"
                for ref in (r for r in dict.fromkeys(references) if r in finals):
                    for name, vals in finals.items():
                        if name in (ref, NULL):
                            continue
                        p = paired(vals, finals[ref])
                        rows.append(dict(difficulty=law, shape=shape, reference=ref,
                                         method=name, k=k, mean=float(vals.mean()),
                                         paired=p, winner=win))
    return rows


def table_regime(rows, difficulties, shapes, k, reference, names) -> str:
    lines = ["| difficulty | P, N0, n_max | " + " | ".join(names) + " | winner |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for law in difficulties:
        for shape in shapes:
            cell = [r for r in rows if r["k"] == k and r["difficulty"] == law
                    and r["shape"] == shape and r["reference"] == reference]
            by = {r["method"]: r for r in cell}
            lines.append(f"| {law} | {shape} | " + " | ".join(by[m]["paired"].fmt()
                                                             for m in names)
                         + f" | {cell[0]['winner']} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- summary


def _cell(data, name: str) -> dict[str, dict[str, Any]]:
    return next(v for (c, _, _), v in data["cells"].items() if c == name)


def _shape(data, name: str) -> tuple[int, int, int]:
    return next(s for (c, _, s) in data["cells"] if c == name)


def summary(data: dict[str, Any]) -> str:
    """The study's summary.md (`sera_jax.studies.lab.study.run`), rebuilt from the files."""
    c, ks = data["config"], data["ks"]
    rep, ref = c["report"], c["compare"]["baseline"]
    table_ks = list(rep["table_ks"])
    names = list(c["compare"]["methods"])
    seeds = c["compare"]["seeds"]
    t, rl, alloc = c["task"], c["rl"], c["rl"]["allocation"]
    opt = rl["optimizer"]
    main = _cell(data, "main")
    p0 = data["p0"]["answers"]
    theta = alloc["threshold"]
    lines = [f"# Allocation lab: {len(names)} methods × {len(seeds)} paired seeds", ""]
    lines += [
        f"Task: {t['num_train']} train / {t['num_test']} held-out prompts, K = "
        f"{t['num_answers']} answers, d = {t['feature_dim']} + {t['num_skills']} skills, "
        f"≤ {t['max_correct']} correct, scorer {t['scorer']}; difficulty `{c['difficulty']}` "
        f"(held-out initial p: mean {100 * p0.mean():.1f} %, median "
        f"{100 * np.median(p0):.1f} %, < 1 %: {100 * (p0 < 0.01).mean():.0f} % of prompts). "
        f"P = {rl['prompts_per_step']}, N0 = {rl['rollouts_per_prompt']} (B = "
        f"{rl['prompts_per_step'] * rl['rollouts_per_prompt']}), n_min = {alloc['n_min']}, "
        f"n_max = {alloc['n_max']}, {rl['num_steps']} steps "
        f"({rl['num_steps'] // (t['num_train'] // rl['prompts_per_step'])} epochs), "
        f"{ {'adamw': 'AdamW', 'sgd': 'SGD'}[opt['name']]} lr {opt['learning_rate']}, "
        f"clip {opt['grad_clip']}, {rl['aggregation']}; θ = "
        f"{'preset (0.05)' if theta is None else theta}.", "",
        "CIs: 95 %, paired over seeds, "
        f"{'Student t' if rep['ci'] == 't' else 'percentile bootstrap'}"
        "; (n.s.) = the interval contains 0: inconclusive (no margin was set: not "
        "equivalence).", ""]
    lines += report_cell(main, ks, table_ks, ref, names, opt["learning_rate"])
    challengers = [n for n in rep["challengers"] if n in main]
    if challengers and rep["challenge_reference"] in main:
        lines += [f"## New rules vs {rep['challenge_reference']} (held-out, points)", "",
                  table_paired(main, ks, table_ks, 1, rep["challenge_reference"], challengers),
                  ""]
    lines += [f"## Paired differences vs {ref} (train prompts, points)", "",
              table_paired(main, ks, table_ks, 0, ref, names), "",
              "## Per-step diagnostics (mean over seeds and steps)", "",
              "cosine: step gradient vs exact ∇ mean log p of the batch; κ: realised "
              "κ(p, N_q) with the exact p over active prompts (for a two-stage method the "
              "scale given its pilot, `allocation.beyond.conditional_scale`); phat_abs_err: "
              "|p̂ − p| over seen batch prompts.", "", table_diagnostics(data, "main", main), ""]
    mf = c["maze_family"]
    maze = _cell(data, "maze_family")
    m0 = data["p0"]["maze"][0]
    lines += [f"# Maze-policy task family ({len(mf['methods'])} methods × {len(seeds)} "
              "paired seeds)", "",
              f"A next-move softmax shared across {mf['maze_size']}×{mf['maze_size']} mazes "
              f"(`lab.maze_task`), horizon H = {mf['horizon']}, shortest paths "
              f"{mf['min_path']}..{mf['horizon']}; {mf['num_train']} train / {mf['num_test']} "
              f"held-out mazes; p exact by DP (seed 0 held-out initial p: mean "
              f"{100 * m0.mean():.1f} %, < 1 %: {100 * (m0 < 0.01).mean():.0f} % of "
              f"prompts). P = {mf['prompts_per_step']}, N0 = {mf['rollouts_per_prompt']}, "
              f"n_max = {mf['n_max']}, {mf['num_steps']} steps, lr {mf['learning_rate']}, "
              f"{mf['aggregation']}.", ""]
    lines += report_cell(maze, ks, table_ks, ref, list(mf["methods"]), mf["learning_rate"],
                         "Maze family: ")
    rg = c["regime"]
    shapes = [tuple(s) for s in rg["shapes"]]
    rows = regime_rows(data, [ref, rep["challenge_reference"], NULL])
    lines += [f"## Regime map ({len(rg['seeds'])} seeds, {rg['num_steps']} steps per cell; "
              "held-out; points)", "",
              "winner: the best mean; '~' lists the methods whose paired CI against it "
              "contains 0.", ""]
    others = [m for m in rg["methods"] if m != ref]
    new = [m for m in rg["methods"] if m in rep["challengers"]]
    for k in rg["ks"]:
        lines += [f"pass@{k}, Δ vs {ref}:", "",
                  table_regime(rows, rg["difficulties"], shapes, k, ref, others), ""]
        lines += [f"pass@{k}, Δ vs the null (uniform with shuffled rewards):", "",
                  table_regime(rows, rg["difficulties"], shapes, k, NULL, list(rg["methods"])),
                  ""]
        if new and rep["challenge_reference"] in rg["methods"]:
            lines += [f"pass@{k}, new rules Δ vs {rep['challenge_reference']}:", "",
                      table_regime(rows, rg["difficulties"], shapes, k,
                                   rep["challenge_reference"], new), ""]
    st = data["stamp"]
    lines += [f"Wall time: {st['study_wall_s']:.1f} s (main cell {st['main_cell_s']:.1f} s); "
              f"{st['cpus']} CPUs, load average {st['load_at_end']:.1f} at the end.", ""]
    return "\n".join(lines)


def doc_markdown(text: str) -> str:
    """The summary as the page prints it: every heading two levels down."""
    return "\n".join("##" + ln if ln.startswith("#") else ln for ln in text.splitlines())


# ----------------------------------------------------------------------------- numbers


def numbers(data: dict[str, Any]) -> dict[str, Any]:
    """The run's results as values, for the prose checks: {'main', 'maze'}: {'final':
    {arm: {k: mean %}}, 'start': {k: mean % at step 0}, 'vs_uniform' / 'vs_null' /
    'vs_sera' / 'train_vs_uniform': {arm: {k: Paired}} (held-out; train), 'gate': Paired,
    'aa': (sig, cells), 'shape'}, 'regime': rows of `regime_rows`, 'p0': {'answers':
    float32[S, M], 'maze': ..., 'length': int[S, M]}, 'diag': {arm: {column: mean}}."""
    c, ks = data["config"], data["ks"]
    out: dict[str, Any] = {}
    for key, cell in (("main", "main"), ("maze", "maze_family")):
        res = _cell(data, cell)
        idx = {k: ks.index(k) for k in ks}
        out[key] = {
            "final": {a: {k: float(final(r, 1, i).mean()) for k, i in idx.items()}
                      for a, r in res.items()},
            "start": {k: float((100.0 * res["uniform"]["pass_at_k"][:, 0, 1, i]).mean())
                      for k, i in idx.items()},
            "vs_uniform": {a: {k: paired(final(r, 1, i), final(res["uniform"], 1, i))
                               for k, i in idx.items()} for a, r in res.items()},
            "vs_null": {a: {k: paired(final(r, 1, i), final(res[NULL], 1, i))
                            for k, i in idx.items()} for a, r in res.items()},
            "vs_sera": {a: {k: paired(final(r, 1, i), final(res["sera"], 1, i))
                            for k, i in idx.items()} for a, r in res.items()},
            "train_vs_uniform": {a: {k: paired(final(r, 0, i), final(res["uniform"], 0, i))
                                     for k, i in idx.items()} for a, r in res.items()},
            "gate": gate(res, ks)["delta"],
            "aa": aa_false_positives(res),
            "shape": _shape(data, cell),
        }
    out["regime"] = regime_rows(data, [c["compare"]["baseline"], NULL])
    out["p0"] = {**data["p0"], "length": data["length"]}
    main = _cell(data, "main")
    out["diag"] = {a: {m: diagnostic(data, "main", a, m)
                       for m in (*DIAG_COLUMNS, "rollouts_std")} for a in main}
    return out


# ----------------------------------------------------------------------------- checks


def _norm(text: str) -> list[str]:
    """Non-blank lines, headings without their '#' marks."""
    return [ln.lstrip("#").strip() if ln.startswith("#") else ln
            for ln in text.splitlines() if ln.strip()]


def doc_section(doc_text: str) -> str:
    """The page's "Measured tables" section from its first sub-heading on (without its own
    heading and the lines that introduce it)."""
    lines = doc_text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(SECTION)), None)
    if start is None:
        raise ValueError(f"no section starting {SECTION!r}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    first = next((i for i in range(start + 1, end) if lines[i].startswith("#")), end)
    return "\n".join(lines[first:end])


def _diff(a: list[str], b: list[str], name_a: str, name_b: str) -> list[str]:
    return list(difflib.unified_diff(a, b, name_a, name_b, lineterm="", n=0))


def check(folder: str = FOLDER, doc: str = DOC, data: dict[str, Any] | None = None
          ) -> tuple[str, list[str], list[str]]:
    """(regenerated summary, diff run's summary.md -> regenerated, diff page -> regenerated);
    the diffs are empty when every line matches. `data`: `load(folder)` when already read."""
    data = load(folder) if data is None else data
    text = summary(data)
    rel = os.path.relpath(folder, ROOT)
    run_diff = _diff(_norm(renamed_arms(data["summary"])), _norm(text), f"{rel}/summary.md",
                     f"regenerated from {rel}")
    with open(doc) as f:
        page = _norm(doc_section(f.read()))
    doc_diff = _diff(page, _norm(text), os.path.relpath(doc, ROOT), f"regenerated from {rel}")
    return text, run_diff, doc_diff


def main(argv: list[str]) -> int:
    folder = argv[1] if len(argv) > 1 else FOLDER
    doc = argv[2] if len(argv) > 2 else DOC
    text, run_diff, doc_diff = check(folder, doc)
    print(doc_markdown(text))
    stamp = load(folder)["stamp"]
    print(f"data: {folder} (commit {stamp['commit'][:7]}, {stamp['date']}, {stamp['machine']})")
    bad = 0
    for what, diff in (("the run's summary.md", run_diff), (doc, doc_diff)):
        if diff:
            print("\n".join(diff))
            n = sum(ln.startswith("-") and not ln.startswith("---") for ln in diff)
            print(f"{n} line(s) of {what} differ from the data")
            bad += 1
        else:
            print(f"every line of {what} matches the data")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
