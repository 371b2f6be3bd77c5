"""The allocation lab's regime map (`config.regime`): a grid of (P, N0, n_max) shapes ×
difficulty laws, `regime.methods` on the seeds `regime.seeds` (of base seed `config.seed + 1`)
each: per cell the paired Δ of each method vs the baseline (`config.compare.baseline`), vs the
null when `regime.controls`, and the winner (best mean; "tie" lists methods whose paired CI
against it contains 0). Writes `regime.csv` and `regime_map_pass{k}.png`.
"""

from __future__ import annotations

import csv
import os
import textwrap
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from sera_jax.studies import compare
from sera_jax.studies.lab.cells import AA, ARMS, NULL, _final, regime_setup, run_cell


def figure_regime(rows: list[dict[str, Any]], difficulties, shapes, k: int, path: str,
                  subject: str, reference: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.full((len(difficulties), len(shapes)), np.nan)
    text = [["" for _ in shapes] for _ in difficulties]
    for r in rows:
        if r["k"] == k and r["method"] == subject:
            i, j = difficulties.index(r["difficulty"]), shapes.index(tuple(r["shape"]))
            grid[i, j] = r["delta"]
            star = "*" if r["significant"] else " (n.s.)"
            best, _, ties = r["winner"].partition(" ~ ")
            lines = [f"{r['delta']:+.2f}{star}", f"best: {best}"]
            lines += textwrap.wrap("≈ " + ties.replace("/", ", "), 24) if ties else []
            text[i][j] = "\n".join(lines)
    fig, ax = plt.subplots(figsize=(2.4 * len(shapes) + 2, 1.4 * len(difficulties) + 1.6))
    v = np.nanmax(np.abs(grid)) if np.isfinite(grid).any() else 1.0
    im = ax.imshow(grid, cmap="RdBu", vmin=-v, vmax=v, aspect="auto")
    for i in range(len(difficulties)):
        for j in range(len(shapes)):
            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=6.5)
    ax.set_xticks(range(len(shapes)),
                  [f"P={p} N0={n0}\nn_max={nm}" for p, n0, nm in shapes], fontsize=8)
    ax.set_yticks(range(len(difficulties)), difficulties)
    fig.colorbar(im, ax=ax, label=f"Δ pass@{k} {subject} − {reference} (points)")
    ax.set_title(f"regime map: held-out pass@{k}, winner by mean (ties: CI of Δ contains 0)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



def regime_rows(cell_results, shape, ks, k_list, references: Sequence[str], ci: str
                ) -> list[dict]:
    """One row per (difficulty, reference, method, k): Δ of the method vs the reference with
    its CI, and the cell's winner (references absent from the cell are skipped)."""
    rows = []
    for law, results in cell_results.items():
        for k in k_list:
            i = ks.index(k)
            finals = {n: _final(r, 1, i) for n, r in results.items() if n != AA}
            best, ties = compare.winner({n: v for n, v in finals.items() if n != NULL}, ci)
            win = best if not ties else f"{best} ~ {'/'.join(ties)}"
            for ref in (r for r in dict.fromkeys(references) if r in finals):
                for name, vals in finals.items():
                    if name in (ref, NULL):  # null − x is −(x − null)
                        continue
                    p = compare.seed_difference(vals, finals[ref], ci)
                    rows.append(dict(difficulty=law, shape=tuple(shape), reference=ref,
                                     method=name, k=k, mean=float(vals.mean()),
                                     delta=p["mean"], lo=p["lo"], hi=p["hi"],
                                     significant=compare.excludes_zero(p), winner=win))
    return rows


def table_regime(rows, difficulties, shapes, k: int, reference: str, names) -> str:
    """Markdown: one line per (difficulty, shape), Δ vs `reference` of each of `names`."""
    lines = ["| difficulty | P, N0, n_max | " + " | ".join(names) + " | winner |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for law in difficulties:
        for shape in shapes:
            cell = [r for r in rows if r["k"] == k and r["difficulty"] == law
                    and r["shape"] == shape and r["reference"] == reference]
            by = {r["method"]: r for r in cell}
            cells = [compare.format_interval({"mean": by[m]["delta"], "lo": by[m]["lo"],
                                              "hi": by[m]["hi"]}) for m in names]
            lines.append(f"| {law} | {shape} | " + " | ".join(cells)
                         + f" | {cell[0]['winner']} |")
    return "\n".join(lines)


def run_regime(config: ml_collections.ConfigDict, runners: dict, workdir: str
               ) -> tuple[list[str], list[dict[str, Any]]]:
    """Run every cell of the map (`runners`: the study's compiled runners, shared), write
    `regime.csv` and the figures to `workdir`; returns (markdown lines, rows of
    `regime_rows`)."""
    rg, rep = config.regime, config.report
    ks, ci, ref = [int(k) for k in config.eval.ks], rep.ci, config.compare.baseline
    theta = config.rl.allocation.threshold
    rows: list[dict[str, Any]] = []
    shapes = [tuple(int(x) for x in s) for s in rg.shapes]
    laws = {d: d for d in rg.difficulties}
    for shape in shapes:
        cell = run_cell(list(rg.methods), regime_setup(config, shape), config.seed + 1,
                        [int(s) for s in rg.seeds], laws, runners, rg.controls, theta,
                        cache_dir=os.path.join(workdir, ARMS))
        rows += regime_rows(cell, shape, ks, list(rg.ks),
                            [ref, rep.challenge_reference, NULL], ci)
    with open(os.path.join(workdir, "regime.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"## Regime map ({len(rg.seeds)} seeds, {rg.num_steps} steps per cell; "
             "held-out; points)", "",
             "winner: the best mean; '~' lists the methods whose paired CI against it "
             "contains 0.", ""]
    others = [m for m in rg.methods if m != ref]
    new = [m for m in rg.methods if m in rep.challengers]
    for k in rg.ks:
        lines += [f"pass@{k}, Δ vs {ref}:", "",
                  table_regime(rows, list(rg.difficulties), shapes, k, ref, others), ""]
        if rg.controls:
            lines += [f"pass@{k}, Δ vs the null (uniform with shuffled rewards):", "",
                      table_regime(rows, list(rg.difficulties), shapes, k, NULL,
                                   list(rg.methods)), ""]
        if new and rep.challenge_reference in rg.methods:
            lines += [f"pass@{k}, new rules Δ vs {rep.challenge_reference}:", "",
                      table_regime(rows, list(rg.difficulties), shapes, k,
                                   rep.challenge_reference, new), ""]
        figure_regime([r for r in rows if r["reference"] == ref], list(rg.difficulties),
                      shapes, k, os.path.join(workdir, f"regime_map_pass{k}.png"),
                      rg.subject, ref)
    return lines, rows
