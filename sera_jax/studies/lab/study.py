"""The allocation-lab study: methods × paired seeds, tables with CIs, figures, regime map.

`run(config, workdir)` (the one call of `experiments/allocation_lab.py`):

1. **main cell** -- every method of `config.methods` (names of `sera_jax.methods.METHODS`)
   on `config.num_seeds` paired seeds (`train.seed_keys`) of the `config.difficulty` task:
   held-out and train analytic pass@k over training, per-step diagnostics;
2. **maze cell** (`config.maze_cell`) -- the shape of the maze CPU default (P, N0, n_max,
   steps) on the maze-like difficulty: the lab's prediction for that study;
3. **regime map** (`config.regime`) -- a grid of (P, N0, n_max) shapes × difficulty laws,
   `regime.methods` on `regime.num_seeds` seeds each: per cell the paired Δ of each method
   vs the reference and the winner (best mean; "tie" lists methods whose paired CI against
   it contains 0).

Differences are paired over seeds; the interval is `config.report.ci` ('t': Student t over
seeds, 'bootstrap': percentile bootstrap over seeds; `sera_jax.studies.lab.stats`).

Writes to `workdir`: `summary.md` (also returned), `final.csv` (per method, seed, split, k:
final pass@k), `regime.csv`, `results.npz` (every array), `pass_at_k_training.png`,
`pass_at_k_delta.png`, `regime_map.png`.
"""

from __future__ import annotations

import csv
import os
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax import methods as methods_lib
from sera_jax.studies import common
from sera_jax.studies.lab import stats, train

SPLITS = ("train", "held-out")


def _label(name: str) -> str:
    return methods_lib.get_method(name).label


def run_cell(method_names: Sequence[str], setup: train.Setup, seed: int, num_seeds: int,
             laws: Mapping[str, Any], runners: dict | None = None
             ) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """results[law][method] = `train.Runner` output on the paired seeds of `seed`.

    Tasks are built once per law and shared by every method; `runners` caches compiled
    runners by (method, setup without its length), so a shape seen before (another law,
    another number of steps) is not compiled again.
    """
    runners = {} if runners is None else runners
    keys = train.seed_keys(seed, num_seeds)
    tasks = {law: train.make_tasks(setup, seed, num_seeds, spec) for law, spec in laws.items()}
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {law: {} for law in laws}
    for name in method_names:
        cache_key = (name, setup.with_(num_steps=setup.eval_every))
        if cache_key not in runners:
            runners[cache_key] = train.Runner(methods_lib.get_method(name), cache_key[1])
        for law in laws:
            t0 = time.time()
            out[law][name] = runners[cache_key](keys, tasks[law], setup.num_steps)
            logging.info("lab: %s on %s (%d seeds) in %.1fs", name, law, keys.shape[0],
                         time.time() - t0)
    return out


def _final(res: Mapping[str, np.ndarray], split: int, k_index: int) -> np.ndarray:
    """Per-seed final pass@k (percent)."""
    return 100.0 * res["pass_at_k"][:, -1, split, k_index]


# ----------------------------------------------------------------------------- tables


def table_final(results, ks, table_ks, split: int) -> str:
    idx = [ks.index(k) for k in table_ks]
    head = "| method | " + " | ".join(f"pass@{k}" for k in table_ks) + " |"
    lines = [head, "|---|" + "---|" * len(idx)]
    for name, res in results.items():
        vals = [f"{_final(res, split, i).mean():.2f}" for i in idx]
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def table_paired(results, ks, table_ks, split: int, reference: str, names, ci: str) -> str:
    idx = [ks.index(k) for k in table_ks]
    head = f"| method − {reference} | " + " | ".join(f"Δ pass@{k}" for k in table_ks) + " |"
    lines = [head, "|---|" + "---|" * len(idx)]
    for name in names:
        if name == reference or name not in results:
            continue
        cells = [stats.paired(_final(results[name], split, i),
                              _final(results[reference], split, i), ci).fmt()
                 for i in idx]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_diagnostics(results) -> str:
    cols = ("cosine", "kappa_mean", "kappa_min", "phat_abs_err", "mixed_frac", "active_frac",
            "reward_mean")
    j = [train.STEP_METRICS.index(c) for c in cols]
    lines = ["| method | " + " | ".join(cols) + " | rollouts std |",
             "|---|" + "---|" * (len(cols) + 1)]
    for name, res in results.items():
        s = res["steps"]
        vals = [f"{np.nanmean(s[..., i]):.3f}" for i in j]
        c = res["counts"].astype(np.float64)
        spread = np.where(c > 0, c, np.nan)
        vals.append(f"{np.nanmean(np.nanstd(spread, axis=-1)):.2f}")
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures


def figure_training(results, setup: train.Setup, fig_ks, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = setup.eval_steps
    fig, axes = plt.subplots(1, len(fig_ks), figsize=(4.2 * len(fig_ks), 3.6), squeeze=False)
    for ax, k in zip(axes[0], fig_ks):
        i = list(setup.ks).index(k)
        for name, res in results.items():
            y = 100 * res["pass_at_k"][:, :, 1, i]
            m = y.mean(0)
            se = y.std(0, ddof=1) / np.sqrt(y.shape[0])
            lw = 2.2 if name in ("uniform", "sera") else 1.1
            ax.plot(steps, m, label=name, lw=lw)
            ax.fill_between(steps, m - 1.96 * se, m + 1.96 * se, alpha=0.12)
        ax.set_title(f"held-out pass@{k}")
        ax.set_xlabel("step")
        ax.set_ylabel("%")
        ax.grid(alpha=0.3)
    axes[0, -1].legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_delta(results, setup: train.Setup, reference: str, ci: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(setup.ks)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, res in results.items():
        if name == reference:
            continue
        ps = [stats.paired(_final(res, 1, i), _final(results[reference], 1, i), ci)
              for i in range(len(ks))]
        m = np.array([p.mean for p in ps])
        ax.plot(ks, m, marker="o", ms=3, label=name,
                lw=2.2 if name == "sera" else 1.1)
        ax.fill_between(ks, [p.lo for p in ps], [p.hi for p in ps], alpha=0.12)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel(f"Δ held-out pass@k vs {reference} (points)")
    ax.set_title(f"final step, paired over seeds, 95% CI ({ci})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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


# ----------------------------------------------------------------------------- the study


def regime_rows(cell_results, shape, ks, k_list, references: Sequence[str], ci: str
                ) -> list[dict]:
    """One row per (difficulty, reference, method, k): Δ of the method vs the reference with
    its CI, and the cell's winner (references absent from the cell are skipped)."""
    rows = []
    for law, results in cell_results.items():
        for k in k_list:
            i = ks.index(k)
            finals = {n: _final(r, 1, i) for n, r in results.items()}
            best, ties = stats.winner(finals, ci)
            win = best if not ties else f"{best} ~ {'/'.join(ties)}"
            for ref in (r for r in dict.fromkeys(references) if r in finals):
                for name, vals in finals.items():
                    if name == ref:
                        continue
                    p = stats.paired(vals, finals[ref], ci)
                    rows.append(dict(difficulty=law, shape=tuple(shape), reference=ref,
                                     method=name, k=k, mean=float(vals.mean()), delta=p.mean,
                                     lo=p.lo, hi=p.hi, significant=bool(p.significant),
                                     winner=win))
    return rows


def table_regime(rows, difficulties, shapes, k: int, reference: str, names, n: int) -> str:
    """Markdown: one line per (difficulty, shape), Δ vs `reference` of each of `names`."""
    lines = ["| difficulty | P, N0, n_max | " + " | ".join(names) + " | winner |",
             "|---|---|" + "---|" * (len(names) + 1)]
    for law in difficulties:
        for shape in shapes:
            cell = [r for r in rows if r["k"] == k and r["difficulty"] == law
                    and r["shape"] == shape and r["reference"] == reference]
            by = {r["method"]: r for r in cell}
            cells = [stats.Paired(by[m]["delta"], by[m]["lo"], by[m]["hi"], n).fmt()
                     for m in names]
            lines.append(f"| {law} | {shape} | " + " | ".join(cells)
                         + f" | {cell[0]['winner']} |")
    return "\n".join(lines)


def _setup(config: ml_collections.ConfigDict, **changes) -> train.Setup:
    return train.setup_from_config(config).with_(**changes)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Run the study described in the module docstring; returns {'summary', 'main',
    'maze_cell', 'regime', 'wall_s'}."""
    t_start = time.time()
    rep = config.report
    ks, ci, ref = [int(k) for k in rep.ks], rep.ci, rep.reference
    names = list(config.methods)
    for n in names + list(config.maze_cell.methods) + list(config.regime.methods) + [ref]:
        methods_lib.get_method(n)  # fail fast on an unknown name, before any work
    workdir = common.prepare_workdir(workdir)
    setup = train.setup_from_config(config)
    law = config.difficulty
    runners: dict = {}
    main = run_cell(names, setup, config.seed, config.num_seeds, {law: law}, runners)[law]
    t_main = time.time() - t_start

    p0_test = np.asarray(train.make_tasks(setup, config.seed, config.num_seeds, law)[1].p0)
    lines = [f"# Allocation lab: {len(names)} methods × {config.num_seeds} paired seeds", ""]
    lines += [
        f"Task: {setup.num_train} train / {setup.num_test} held-out prompts, K = "
        f"{setup.num_answers} answers, d = {setup.feature_dim} + {setup.num_skills} skills, "
        f"≤ {setup.max_correct} correct, scorer {setup.scorer}; difficulty `{law}` (held-out "
        f"initial p: mean {100 * p0_test.mean():.1f} %, median "
        f"{100 * np.median(p0_test):.1f} %, < 1 %: {100 * (p0_test < 0.01).mean():.0f} % of "
        f"prompts). P = {setup.prompts_per_step}, N0 = {setup.n0} (B = {setup.budget}), "
        f"n_min = {setup.n_min}, n_max = {setup.n_max}, {setup.num_steps} steps "
        f"({setup.num_steps // setup.steps_per_epoch} epochs), AdamW lr "
        f"{setup.learning_rate}, clip {setup.grad_clip}, {setup.aggregation}.",
        "",
        f"CIs: 95 %, paired over seeds, {'Student t' if ci == 't' else 'percentile bootstrap'}"
        "; (n.s.) = the interval contains 0 (no difference).", "",
        "## Final held-out pass@k (%)", "", table_final(main, ks, list(rep.table_ks), 1), "",
        f"## Paired differences vs {ref} (held-out, points)", "",
        table_paired(main, ks, list(rep.table_ks), 1, ref, names, ci), "",
    ]
    challengers = [n for n in rep.challengers if n in main]
    if challengers and rep.challenge_reference in main:
        lines += [f"## New rules vs {rep.challenge_reference} (held-out, points)", "",
                  table_paired(main, ks, list(rep.table_ks), 1, rep.challenge_reference,
                               challengers, ci), ""]
    lines += [f"## Paired differences vs {ref} (train prompts, points)", "",
              table_paired(main, ks, list(rep.table_ks), 0, ref, names, ci), "",
              "## Per-step diagnostics (mean over seeds and steps)", "",
              "cosine: step gradient vs exact ∇ mean log p of the batch; κ: realised "
              "κ(p, N_q) with the exact p over active prompts (for a two-stage method the "
              "scale given its pilot, `allocation.beyond.conditional_scale`); phat_abs_err: "
              "|p̂ − p| over seen batch prompts.", "", table_diagnostics(main), ""]
    figure_training(main, setup, list(rep.fig_ks), os.path.join(workdir,
                    "pass_at_k_training.png"), f"{law}, {config.num_seeds} seeds, mean ± 1.96 se")
    figure_delta(main, setup, ref, ci, os.path.join(workdir, "pass_at_k_delta.png"))

    maze_cell = None
    if config.maze_cell.enabled:
        mc = config.maze_cell
        ms = _setup(config, prompts_per_step=mc.prompts_per_step, n0=mc.n0, n_max=mc.n_max,
                    num_steps=mc.num_steps, eval_every=mc.eval_every)
        maze_cell = run_cell(list(mc.methods), ms, config.seed, config.num_seeds,
                             {mc.difficulty: mc.difficulty}, runners)
        maze_cell = maze_cell[mc.difficulty]
        lines += [f"## Maze default cell (P = {ms.prompts_per_step}, N0 = {ms.n0}, n_max = "
                  f"{ms.n_max}, {ms.num_steps} steps, `{mc.difficulty}`)", ""]
        for step_i, step in enumerate(ms.eval_steps):
            if step == 0:
                continue
            sub = {n: dict(r, pass_at_k=r["pass_at_k"][:, : step_i + 1]) for n, r in
                   maze_cell.items()}
            lines += [f"Step {step}:", "",
                      table_paired(sub, ks, list(mc.table_ks), 1, ref, list(mc.methods), ci),
                      ""]

    rows: list[dict[str, Any]] = []
    if config.regime.enabled:
        rg = config.regime
        shapes = [tuple(int(x) for x in s) for s in rg.shapes]
        laws = {d: d for d in rg.difficulties}
        for shape in shapes:
            p, n0, n_max = shape
            rs = _setup(config, prompts_per_step=p, n0=n0, n_max=n_max,
                        num_steps=rg.num_steps, eval_every=rg.eval_every)
            cell = run_cell(list(rg.methods), rs, config.seed + 1, rg.num_seeds, laws, runners)
            rows += regime_rows(cell, shape, ks, list(rg.ks),
                                [ref, rep.challenge_reference], ci)
        with open(os.path.join(workdir, "regime.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        lines += [f"## Regime map ({rg.num_seeds} seeds, {rg.num_steps} steps per cell; "
                  "held-out; points)", "",
                  "winner: the best mean; '~' lists the methods whose paired CI against it "
                  "contains 0.", ""]
        others = [m for m in rg.methods if m != ref]
        new = [m for m in rg.methods if m in rep.challengers]
        for k in rg.ks:
            lines += [f"pass@{k}, Δ vs {ref}:", "",
                      table_regime(rows, list(rg.difficulties), shapes, k, ref, others,
                                   rg.num_seeds), ""]
            if new and rep.challenge_reference in rg.methods:
                lines += [f"pass@{k}, new rules Δ vs {rep.challenge_reference}:", "",
                          table_regime(rows, list(rg.difficulties), shapes, k,
                                       rep.challenge_reference, new, rg.num_seeds), ""]
            figure_regime([r for r in rows if r["reference"] == ref], list(rg.difficulties),
                          shapes, k, os.path.join(workdir, f"regime_map_pass{k}.png"),
                          rg.subject, ref)

    with open(os.path.join(workdir, "final.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "split", "k", "pass_at_k"])
        for name, res in main.items():
            for s in range(res["pass_at_k"].shape[0]):
                for sp, split in enumerate(SPLITS):
                    for i, k in enumerate(ks):
                        w.writerow([name, s, split, k, f"{res['pass_at_k'][s, -1, sp, i]:.6f}"])
    arrays = {f"{n}/{k}": v for n, r in main.items() for k, v in r.items()}
    np.savez_compressed(os.path.join(workdir, "results.npz"), **arrays)
    wall = time.time() - t_start
    lines += [f"Wall time: {wall:.1f} s (main cell {t_main:.1f} s); "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end.", ""]
    summary = "\n".join(lines)
    with open(os.path.join(workdir, "summary.md"), "w") as f:
        f.write(summary)
    return {"summary": summary, "main": main, "maze_cell": maze_cell, "regime": rows,
            "wall_s": wall}
