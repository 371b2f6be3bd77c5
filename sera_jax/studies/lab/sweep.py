"""The allocation lab's lr sweep (`config.sweep`, configs/allocation_lab/lr_sweep.py): the
frontier (pass@1 vs pass@K) of each method over an lr grid with the gate per lr, the
selected lr (admissible, best uniform pass@K) and a θ sensitivity table at it.
"""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from sera_jax.studies import compare
from sera_jax.studies.lab import train
from sera_jax.studies.lab.cells import _final, gate, maze_family_setup, report_cell, run_cell


def _mean_ci(x: np.ndarray, ci: str) -> dict[str, Any]:
    """The mean of per-seed values with its 95 % interval (a paired CI against 0)."""
    return compare.seed_difference(x, np.zeros_like(x), ci)


def run_sweep(config: ml_collections.ConfigDict, runners: dict, cache_dir: str | None = None
              ) -> tuple[list[str], list[dict[str, Any]]]:
    """lr selection and the θ table (`config.sweep`), on the main cell's answer task
    (`sweep.family` 'answers') or the maze family's cell ('maze'), with the main seeds.

    For every lr of `sweep.learning_rates`: `sweep.methods` with the controls; the gate
    (uniform − null pass@1 > 0); each method's frontier point (final held-out pass@1,
    pass@K, K = `sweep.frontier_k`, with CIs). The selected lr is the admissible one where
    uniform's pass@K is best (the baseline tuned on the compared metric); its cell is
    reported in full (`report_cell`). A SERA point lies
    above uniform's frontier when its pass@K exceeds uniform's frontier (linear between
    uniform's points sorted by pass@1, flat beyond them) at its pass@1. Then, at the
    selected lr, SERA − uniform for every θ of `sweep.thetas` (the active fraction too).
    `cache_dir`: `cells.run_cell`'s store of finished arms.
    """
    sw, ci = config.sweep, config.report.ci
    ks = [int(k) for k in config.eval.ks]
    i1, ik = ks.index(1), ks.index(int(sw.frontier_k))
    seeds = [int(s) for s in config.compare.seeds]
    if sw.family == "maze":  # the maze-policy family's cell (its shape, steps, aggregation)
        law, base = "maze", maze_family_setup(config)
    else:
        law, base = config.difficulty, train.setup_from_config(config)
    names = list(sw.methods)
    rows: list[dict[str, Any]] = []
    lines = [f"## lr sweep ({sw.family}): frontier pass@1 vs pass@{sw.frontier_k} "
             "(held-out, %)", "",
             "| lr | gate: uniform − null pass@1 | " + " | ".join(
                 f"{n} pass@1 | {n} pass@{sw.frontier_k}" for n in names) + " |",
             "|---|---|" + "---|---|" * len(names)]
    opt, by_lr = dict(base.optimizer), {}
    for lr in sw.learning_rates:
        setup = base.with_(optimizer=tuple(sorted({**opt, "learning_rate": float(lr)}.items())))
        res = run_cell(names, setup, config.seed, seeds, {law: law}, runners, True,
                       config.rl.allocation.threshold, cache_dir=cache_dir)[law]
        g, by_lr[float(lr)] = gate(res, ks, ci), res
        row = {"lr": float(lr), "admissible": g["admissible"], "gate": g["delta"],
               "per_seed": {}}
        cells = []
        for n in names:
            x, y = _final(res[n], 1, i1), _final(res[n], 1, ik)
            row[n] = (_mean_ci(x, ci), _mean_ci(y, ci))
            row["per_seed"][n] = {"pass@1": np.asarray(x).tolist(),
                                  f"pass@{sw.frontier_k}": np.asarray(y).tolist()}
            cells += [f"{e['mean']:.2f} ± {e['hi'] - e['mean']:.2f}" for e in row[n]]
        rows.append(row)
        lines.append(f"| {lr} | {compare.format_interval(g['delta'])}"
                     f"{'' if g['admissible'] else ' ✗'} | "
                     + " | ".join(cells) + " |")
    ok = [r for r in rows if r["admissible"]]
    lines.append("")
    if not ok:
        lines += ["No lr of the grid is admissible (✗: uniform does not beat the null).", ""]
        return lines, rows
    best = max(ok, key=lambda r: r["uniform"][1]["mean"])
    lines.append(f"Selected lr (admissible, best uniform pass@{sw.frontier_k}): "
                 f"**{best['lr']}**.")
    front = sorted((r["uniform"][0]["mean"], r["uniform"][1]["mean"]) for r in rows)
    for n in (m for m in names if m != "uniform"):
        above = [float(r[n][1]["mean"]) > float(np.interp(r[n][0]["mean"], *zip(*front)))
                 for r in rows]
        lines.append(f"{n}: {sum(above)} of {len(rows)} points above uniform's frontier.")
    lines += ["", *frontier_gap_lines(rows, names, int(sw.frontier_k), seed=int(config.seed))]
    lines += [""] + report_cell(by_lr[best["lr"]], ks, list(config.report.table_ks), "uniform",
                                names, ci, True, best["lr"], f"Selected lr {best['lr']}: ")[0]
    lines += [f"## θ sensitivity at lr {best['lr']} (held-out, points, vs uniform)", "",
              "| θ | active fraction | " + " | ".join(
                  f"Δ pass@{k}" for k in config.report.table_ks) + " |",
              "|---|---|" + "---|" * len(config.report.table_ks)]
    setup = base.with_(optimizer=tuple(sorted({**opt, "learning_rate": best["lr"]}.items())))
    uni = run_cell(["uniform"], setup, config.seed, seeds, {law: law}, runners,
                   cache_dir=cache_dir)[law]
    for th in sw.thetas:
        res = run_cell(["sera"], setup, config.seed, seeds, {law: law}, runners,
                       threshold=float(th), cache_dir=cache_dir)[law]
        act = res["sera"]["steps"][..., train.STEP_METRICS.index("active_frac")].mean()
        cells = [compare.format_interval(compare.seed_difference(
                     _final(res["sera"], 1, ks.index(k)), _final(uni["uniform"], 1, ks.index(k)),
                     ci)) for k in config.report.table_ks]
        lines.append(f"| {th} | {act:.2f} | " + " | ".join(cells) + " |")
    return lines + [""], rows


def frontier_gaps(rows: list[dict[str, Any]], names: list[str], k: int, *, seed: int = 0,
                  num_resamples: int = 2000) -> dict[str, dict[str, Any]]:
    """Every method's frontier against uniform's (`compare.frontier_gap`: pass@k at matched
    pass@1, at 2 levels inside the overlap and averaged over it), from the sweep's per-seed
    final values; the seeds are common across lrs and methods, so resampled jointly."""
    def groups(n: str) -> list[tuple[list[float], list[float]]]:
        return [(r["per_seed"][n]["pass@1"], r["per_seed"][n][f"pass@{k}"]) for r in rows]

    return {n: compare.frontier_gap(groups("uniform"), groups(n), paired=True, seed=seed,
                                    num_resamples=num_resamples)
            for n in names if n != "uniform"}


def frontier_gap_lines(rows: list[dict[str, Any]], names: list[str], k: int, *,
                       seed: int = 0) -> list[str]:
    """The table of `frontier_gaps` (the lab's pass@k values are percent: gaps in points;
    95 % seed-bootstrap CIs)."""
    def cell(e: dict[str, Any]) -> str:
        if e["mean"] is None:
            return "–"
        band = "" if e["lo"] is None else f" [{e['lo']:+.2f}, {e['hi']:+.2f}]"
        return f"{e['mean']:+.2f}{band}"

    out = [f"Frontier gap vs uniform: pass@{k} at matched pass@1 (points; 95 % paired seed "
           "bootstrap), averaged over the overlap of the two frontiers and at two pass@1 "
           "levels inside it:", "",
           "| method | pass@1 overlap | mean over overlap | at level 1 | at level 2 |",
           "|---|---|---|---|---|"]
    for n, g in frontier_gaps(rows, names, k, seed=seed).items():
        if g["overlap"] is None:
            out.append(f"| {n} | none | – | – | – |")
            continue
        lv = [f"{cell(e)} (pass@1 {e['x']:.2f})" for e in g["levels"]]
        out.append(f"| {n} | {g['overlap'][0]:.2f}–{g['overlap'][1]:.2f} | "
                   f"{cell(g['mean'])} | " + " | ".join(lv) + " |")
    return out
