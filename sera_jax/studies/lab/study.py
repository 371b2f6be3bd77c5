"""The allocation-lab study: methods × paired seeds, tables with CIs, figures, regime map.

`run(config, workdir)` (the one call of `experiments/allocation_lab.py`):

1. **main cell** -- every method of `config.compare.methods` (names of
   `sera_jax.methods.METHODS`) on the paired seeds `config.compare.seeds` (`train.seed_keys`)
   of the `config.difficulty` answer task: held-out and train analytic pass@k over training,
   per-step diagnostics; with `compare.controls` also the **null** arm (uniform, rewards
   shuffled within each batch) and the **A/A** arm (uniform on another rollout stream),
   every arm − null, the A/A false-positive rate and the **gate** (the lr is admissible only
   if uniform − null pass@1 has its CI above 0);
2. **maze family** (`config.maze_family`) -- the same on the compositional maze-policy task
   (`lab.maze_task`: p exact by DP), with its own lr;
3. **lr sweep** (`config.sweep`, off by default) -- the frontier (pass@1 vs pass@K) of
   each method over an lr grid with the gate per lr, the selected lr (admissible, best
   uniform pass@K) and a θ sensitivity table at it;
4. **maze cell** (`config.maze_cell`) -- the shape of the maze CPU default (P, N0, n_max,
   steps) on the maze-like difficulty;
5. **regime map** (`config.regime`) -- a grid of (P, N0, n_max) shapes × difficulty laws,
   `regime.methods` on the seeds `regime.seeds` (of base seed `config.seed + 1`) each: per
   cell the paired Δ of each method vs the baseline (`config.compare.baseline`), vs the
   null when `regime.controls`, and the winner (best mean; "tie" lists methods whose paired
   CI against it contains 0).

Differences are paired over seeds; the interval is `config.report.ci` ('t': Student t over
seeds, 'bootstrap': percentile bootstrap over seeds; `sera_jax.studies.lab.stats`).

Writes to `workdir`: `summary.md` (also returned), `final.csv` (per method, seed, split, k:
final pass@k), `regime.csv`, `results.npz` (every array), `pass_at_k_training.png`,
`pass_at_k_delta.png`, `regime_map.png`.
"""

from __future__ import annotations

import csv
import functools
import os
import textwrap
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from sera_jax import methods as methods_lib
from sera_jax import optim, validation
from sera_jax.studies import common
from sera_jax.studies.lab import stats, train

SPLITS = ("train", "held-out")
#: Control arms (`run_cell(controls=True)`): the null (uniform with the rewards of each batch
#: shuffled) and the A/A arm (uniform on another rollout stream).
NULL, AA = "null", "uniform_aa"

#: Fields the lab's config moved to the one schema (old dotted path -> new one).
RENAMED = {
    "methods": "compare.methods",
    "num_seeds": "compare.seeds",
    "train.prompts_per_step": "rl.prompts_per_step",
    "train.n0": "rl.rollouts_per_prompt",
    "train.n_min": "rl.allocation.n_min",
    "train.n_max": "rl.allocation.n_max",
    "train.unseen": "rl.allocation.unseen",
    "train.posterior_from_history": "rl.allocation.posterior_from_history",
    "train.num_steps": "rl.num_steps",
    "train.eval_every": "eval.every",
    "train.aggregation": "rl.aggregation",
    **{f"train.{k}": f"rl.optimizer.{k}" for k in ("learning_rate", "b1", "b2", "eps",
                                                    "weight_decay", "grad_clip")},
    "history": "rl.history",
    "report.ks": "eval.ks",
    "report.reference": "compare.baseline",
    "maze_cell.n0": "maze_cell.rollouts_per_prompt",
    "regime.num_seeds": "regime.seeds",
}
common.RENAMED.update(RENAMED)


def method_for(name: str, threshold: float | None = None) -> methods_lib.Method:
    """The registered method `name`, with θ = `threshold` when it has a dynamic active set
    (`rl.allocation.threshold`; None = the preset's θ)."""
    method = methods_lib.get_method(name)
    if threshold is not None and "threshold" in method.options:
        method = methods_lib.resolve(name, {"threshold": float(threshold)})
    return method


def run_cell(method_names: Sequence[str], setup: train.Setup, seed: int, seeds: Sequence[int],
             laws: Mapping[str, Any], runners: dict | None = None, controls: bool = False,
             threshold: float | None = None) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """results[law][arm] = `train.Runner` output on the paired seeds `seeds` of `seed`.

    Arms: the methods, and with `controls` the null arm `NULL` (uniform, rewards shuffled
    within each batch) and the A/A arm `AA` (uniform on the other rollout stream: same
    task, initial policy and data order). Tasks are built once per law and shared by every
    arm; `runners` caches compiled runners by (method, θ, control, setup without its
    length), so a shape seen before (another law, another length, the A/A stream) is not
    compiled again.
    """
    runners = {} if runners is None else runners
    keys = train.seed_keys(seed, seeds)
    tasks = {law: train.make_tasks(setup, seed, seeds, spec) for law, spec in laws.items()}
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {law: {} for law in laws}
    arms = [(n, n, None, 0) for n in method_names]
    if controls:
        arms += [(NULL, "uniform", "null", 0), (AA, "uniform", None, 1)]
    for arm, name, control, stream in arms:
        method = method_for(name, threshold)
        cache_key = (name, dict(method.options).get("threshold"), control,
                     setup.with_(num_steps=setup.eval_every))
        if cache_key not in runners:
            runners[cache_key] = train.Runner(method, cache_key[3], control)
        for law in laws:
            t0 = time.time()
            out[law][arm] = runners[cache_key](keys, tasks[law], setup.num_steps, stream)
            logging.info("lab: %s on %s (%d seeds) in %.1fs", arm, law, keys.shape[0],
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


# ----------------------------------------------------------------------------- controls


def gate(results, ks: Sequence[int], ci: str) -> dict[str, Any]:
    """The learning-rate gate: the paired Δ uniform − null of final held-out pass@1 (points);
    the lr is admissible only if its CI lies above 0 (uniform learns more than noise)."""
    i = list(ks).index(1)
    d = stats.paired(_final(results["uniform"], 1, i), _final(results[NULL], 1, i), ci)
    return {"delta": d, "admissible": bool(d.lo > 0)}


def gate_line(g: Mapping[str, Any], lr: float) -> str:
    verdict = ("ADMISSIBLE (uniform beats the null at pass@1)" if g["admissible"] else
               "NOT ADMISSIBLE (uniform does not beat the null at pass@1: the comparison "
               "below measures optimiser noise, not learning)")
    return f"**Gate, lr {lr}:** uniform − null pass@1 = {g['delta'].fmt()} → {verdict}."


def aa_false_positives(results, ci: str, split: int = 1) -> tuple[int, int]:
    """(cells whose paired CI of uniform_aa − uniform excludes 0, cells), over every k of
    eval.ks × every evaluation after step 0. The two arms differ only in their rollout key,
    so every such cell is a false positive (the cells are correlated: a rate, not a test)."""
    a, b = results[AA]["pass_at_k"], results["uniform"]["pass_at_k"]
    cells = [(e, i) for e in range(1, a.shape[1]) for i in range(a.shape[3])]
    sig = sum(stats.paired(100 * a[:, e, split, i], 100 * b[:, e, split, i], ci).significant
              for e, i in cells)
    return int(sig), len(cells)


def report_cell(results, ks, table_ks, ref: str, names: Sequence[str], ci: str,
                controls: bool, lr: float, title: str = "") -> tuple[list[str], dict | None]:
    """Markdown lines of one cell (final pass@k of every arm, paired Δ vs `ref`, and with
    `controls` the gate, every arm − null and the A/A false-positive rate) and its gate."""
    lines = [f"## {title}Final held-out pass@k (%)", "", table_final(results, ks, table_ks, 1),
             "", f"## {title}Paired differences vs {ref} (held-out, points)", "",
             table_paired(results, ks, table_ks, 1, ref, names, ci), ""]
    if not controls:
        return lines, None
    g = gate(results, ks, ci)
    sig, cells = aa_false_positives(results, ci)
    lines += [f"## {title}Controls: gate, null, A/A (held-out, points)", "",
              "null = uniform with the rewards of each batch shuffled (same lr, budget and "
              "rollouts); uniform_aa = uniform on another rollout stream (same task, initial "
              "policy and data order).", "", gate_line(g, lr), "",
              table_paired(results, ks, table_ks, 1, NULL, list(names) + [AA], ci), "",
              f"A/A: uniform_aa − uniform has a CI excluding 0 in {sig} of {cells} (k, "
              f"evaluation) cells ({100 * sig / cells:.1f} %; 5 % if the CIs were nominal and "
              "the cells independent).", "",
              table_paired(results, ks, table_ks, 1, "uniform", [AA], ci), ""]
    return lines, {**g, "aa_false_positives": (sig, cells)}


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
            finals = {n: _final(r, 1, i) for n, r in results.items() if n != AA}
            best, ties = stats.winner({n: v for n, v in finals.items() if n != NULL}, ci)
            win = best if not ties else f"{best} ~ {'/'.join(ties)}"
            for ref in (r for r in dict.fromkeys(references) if r in finals):
                for name, vals in finals.items():
                    if name in (ref, NULL):  # null − x is −(x − null)
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


def _mean_ci(x: np.ndarray, ci: str) -> stats.Paired:
    """The mean of per-seed values with its 95 % interval (a paired CI against 0)."""
    return stats.paired(x, np.zeros_like(x), ci)


def run_sweep(config: ml_collections.ConfigDict, runners: dict
              ) -> tuple[list[str], list[dict[str, Any]]]:
    """lr selection and the θ table (`config.sweep`), on the main cell's task and seeds.

    For every lr of `sweep.learning_rates`: `sweep.methods` with the controls; the gate
    (uniform − null pass@1 > 0); each method's frontier point (final held-out pass@1,
    pass@K, K = `sweep.frontier_k`, with CIs). The selected lr is the admissible one where
    uniform's pass@K is best (the baseline tuned on the compared metric); its cell is
    reported in full (`report_cell`). A SERA point lies
    above uniform's frontier when its pass@K exceeds uniform's frontier (linear between
    uniform's points sorted by pass@1, flat beyond them) at its pass@1. Then, at the
    selected lr, SERA − uniform for every θ of `sweep.thetas` (the active fraction too).
    """
    sw, ci = config.sweep, config.report.ci
    ks = [int(k) for k in config.eval.ks]
    i1, ik = ks.index(1), ks.index(int(sw.frontier_k))
    seeds = [int(s) for s in config.compare.seeds]
    law, base = config.difficulty, train.setup_from_config(config)
    names = list(sw.methods)
    rows: list[dict[str, Any]] = []
    lines = [f"## lr sweep: frontier pass@1 vs pass@{sw.frontier_k} (held-out, %)", "",
             "| lr | gate: uniform − null pass@1 | " + " | ".join(
                 f"{n} pass@1 | {n} pass@{sw.frontier_k}" for n in names) + " |",
             "|---|---|" + "---|---|" * len(names)]
    opt, by_lr = dict(base.optimizer), {}
    for lr in sw.learning_rates:
        setup = base.with_(optimizer=tuple(sorted({**opt, "learning_rate": float(lr)}.items())))
        res = run_cell(names, setup, config.seed, seeds, {law: law}, runners, True,
                       config.rl.allocation.threshold)[law]
        g, by_lr[float(lr)] = gate(res, ks, ci), res
        row = {"lr": float(lr), "admissible": g["admissible"], "gate": g["delta"]}
        cells = []
        for n in names:
            row[n] = (_mean_ci(_final(res[n], 1, i1), ci), _mean_ci(_final(res[n], 1, ik), ci))
            cells += [f"{row[n][0].mean:.2f} ± {row[n][0].hi - row[n][0].mean:.2f}",
                      f"{row[n][1].mean:.2f} ± {row[n][1].hi - row[n][1].mean:.2f}"]
        rows.append(row)
        lines.append(f"| {lr} | {g['delta'].fmt()}{'' if g['admissible'] else ' ✗'} | "
                     + " | ".join(cells) + " |")
    ok = [r for r in rows if r["admissible"]]
    lines.append("")
    if not ok:
        lines += ["No lr of the grid is admissible (✗: uniform does not beat the null).", ""]
        return lines, rows
    best = max(ok, key=lambda r: r["uniform"][1].mean)
    lines.append(f"Selected lr (admissible, best uniform pass@{sw.frontier_k}): "
                 f"**{best['lr']}**.")
    front = sorted((r["uniform"][0].mean, r["uniform"][1].mean) for r in rows)
    for n in (m for m in names if m != "uniform"):
        above = [float(r[n][1].mean) > float(np.interp(r[n][0].mean, *zip(*front)))
                 for r in rows]
        lines.append(f"{n}: {sum(above)} of {len(rows)} points above uniform's frontier.")
    lines += [""] + report_cell(by_lr[best["lr"]], ks, list(config.report.table_ks), "uniform",
                                names, ci, True, best["lr"], f"Selected lr {best['lr']}: ")[0]
    lines += [f"## θ sensitivity at lr {best['lr']} (held-out, points, vs uniform)", "",
              "| θ | active fraction | " + " | ".join(
                  f"Δ pass@{k}" for k in config.report.table_ks) + " |",
              "|---|---|" + "---|" * len(config.report.table_ks)]
    setup = base.with_(optimizer=tuple(sorted({**opt, "learning_rate": best["lr"]}.items())))
    uni = run_cell(["uniform"], setup, config.seed, seeds, {law: law}, runners)[law]
    for th in sw.thetas:
        res = run_cell(["sera"], setup, config.seed, seeds, {law: law}, runners,
                       threshold=float(th))[law]
        act = res["sera"]["steps"][..., train.STEP_METRICS.index("active_frac")].mean()
        cells = [stats.paired(_final(res["sera"], 1, ks.index(k)),
                              _final(uni["uniform"], 1, ks.index(k)), ci).fmt()
                 for k in config.report.table_ks]
        lines.append(f"| {th} | {act:.2f} | " + " | ".join(cells) + " |")
    return lines + [""], rows


def _setup(config: ml_collections.ConfigDict, **changes) -> train.Setup:
    return train.setup_from_config(config).with_(**changes)


def _maze_cell_setup(config: ml_collections.ConfigDict) -> train.Setup:
    mc = config.maze_cell
    return _setup(config, prompts_per_step=mc.prompts_per_step, n0=mc.rollouts_per_prompt,
                  n_max=mc.n_max, num_steps=mc.num_steps, eval_every=mc.eval_every)


def _maze_family_setup(config: ml_collections.ConfigDict) -> train.Setup:
    mf = config.maze_family
    return _setup(config, family="maze", maze_size=mf.maze_size, maze_openings=mf.maze_openings,
                  horizon=mf.horizon, min_path=mf.min_path, init_blocked=mf.init_blocked,
                  num_train=mf.num_train, num_test=mf.num_test,
                  prompts_per_step=mf.prompts_per_step, n0=mf.rollouts_per_prompt,
                  n_max=mf.n_max, num_steps=mf.num_steps, eval_every=mf.eval_every,
                  aggregation=mf.aggregation,
                  optimizer=tuple(sorted({**dict(config.rl.optimizer),
                                          "learning_rate": mf.learning_rate}.items())))


def _regime_setup(config: ml_collections.ConfigDict, shape: Sequence[int]) -> train.Setup:
    rg = config.regime
    p, n0, n_max = shape
    return _setup(config, prompts_per_step=p, n0=n0, n_max=n_max, num_steps=rg.num_steps,
                  eval_every=rg.eval_every)


def validate(config: ml_collections.ConfigDict) -> None:
    """Every field `run` reads, checked before any work: StudyError (a ValueError) naming the
    field and what is allowed; a field under its old name names the new one."""
    common.renamed_fields(config)
    c = functools.partial(validation.check, error=common.StudyError)
    ks = list(config.eval.ks)
    c(bool(ks) and all(validation.is_positive_int(k) for k in ks), "eval.ks", config.eval.ks,
      "a tuple of integers >= 1")
    cells = [("compare", config.compare.methods)]
    if config.maze_family.enabled:
        cells.append(("maze_family", config.maze_family.methods))
    if config.sweep.enabled:
        cells.append(("sweep", config.sweep.methods))
    if config.maze_cell.enabled:
        cells.append(("maze_cell", config.maze_cell.methods))
    if config.regime.enabled:
        cells.append(("regime", config.regime.methods))
    for block, names in cells:
        c(isinstance(names, tuple | list) and len(names) >= 1
          and len(set(names)) == len(names), f"{block}.methods", names,
          "a tuple of distinct method names, e.g. ('uniform', 'sera')")
        for name in names:
            try:
                method = methods_lib.get_method(name)
            except ValueError as e:
                raise common.StudyError(f"config.{block}.methods: {e}") from None
            c(not method.dynamic_sampling, f"{block}.methods", name, "methods without DAPO "
              "dynamic sampling: the lab spends one allocation per step, with no resampling")
        c(config.compare.baseline in names, "compare.baseline", config.compare.baseline,
          f"one of {block}.methods={tuple(names)} (differences are paired against it)")
        if config.compare.controls or block == "sweep":
            c("uniform" in names, f"{block}.methods", names, "a tuple holding 'uniform' (the "
              "controls and the lr gate compare uniform with the null arm)")
    c(isinstance(config.compare.controls, bool), "compare.controls", config.compare.controls,
      "True or False (the null and A/A arms beside every comparison)")
    c(isinstance(config.regime.controls, bool), "regime.controls", config.regime.controls,
      "True or False (the null and A/A arms in every regime cell)")
    theta = config.rl.allocation.threshold
    c(theta is None or (validation.is_number(theta) and 0 <= theta <= 1),
      "rl.allocation.threshold", theta, "None (the preset's θ) or a number in [0, 1]")
    if config.compare.controls or config.sweep.enabled:
        c(1 in ks, "eval.ks", config.eval.ks, "a tuple holding 1 (the gate compares pass@1)")
    if config.sweep.enabled:
        sw = config.sweep
        c(len(sw.learning_rates) >= 1 and all(validation.is_number(x) and x >= 0
                                              for x in sw.learning_rates),
          "sweep.learning_rates", sw.learning_rates, "a tuple of numbers >= 0")
        c(all(validation.is_number(x) and 0 <= x <= 1 for x in sw.thetas), "sweep.thetas",
          sw.thetas, "a tuple of numbers in [0, 1]")
        c(sw.frontier_k in ks, "sweep.frontier_k", sw.frontier_k, f"one of eval.ks={tuple(ks)}")
    seed_sets = [("compare.seeds", config.compare.seeds)]
    if config.regime.enabled:
        seed_sets.append(("regime.seeds", config.regime.seeds))
    for field, seeds in seed_sets:
        c(isinstance(seeds, tuple | list) and len(seeds) >= 2 and len(set(seeds)) == len(seeds)
          and all(validation.is_int(s) and s >= 0 for s in seeds), field, seeds,
          "a tuple of >= 2 distinct integers >= 0 (paired CIs over seeds)")
    rep = config.report
    c(rep.ci in ("t", "bootstrap"), "report.ci", rep.ci, "'t' or 'bootstrap'")
    subsets = [("report.table_ks", rep.table_ks), ("report.fig_ks", rep.fig_ks)]
    if config.maze_cell.enabled:
        subsets.append(("maze_cell.table_ks", config.maze_cell.table_ks))
    if config.regime.enabled:
        subsets.append(("regime.ks", config.regime.ks))
    for field, sub in subsets:
        c(set(sub) <= set(ks), field, sub, f"a subset of eval.ks={tuple(ks)}")
    try:  # shapes: whole epochs, bounds, evaluation points, the optimiser block
        train.setup_from_config(config)
        if config.maze_family.enabled:
            _maze_family_setup(config)
        if config.maze_cell.enabled:
            _maze_cell_setup(config)
        for shape in (config.regime.shapes if config.regime.enabled else ()):
            _regime_setup(config, [int(x) for x in shape])
    except ValueError as e:
        raise common.StudyError(str(e)) from None


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Run the study described in the module docstring; returns {'summary', 'main',
    'maze_family', 'maze_cell', 'regime', 'sweep', 'wall_s', 'gate', 'maze_gate'} (a gate:
    {'delta': stats.Paired, 'admissible', 'aa_false_positives'}, None without controls)."""
    t_start = time.time()
    validate(config)
    rep = config.report
    ks, ci, ref = [int(k) for k in config.eval.ks], rep.ci, config.compare.baseline
    names = list(config.compare.methods)
    seeds = [int(s) for s in config.compare.seeds]
    workdir = common.prepare_workdir(workdir)
    setup = train.setup_from_config(config)
    law = config.difficulty
    runners: dict = {}
    controls, theta = bool(config.compare.controls), config.rl.allocation.threshold
    main = run_cell(names, setup, config.seed, seeds, {law: law}, runners, controls,
                    theta)[law]
    t_main = time.time() - t_start

    p0_test = np.asarray(train.make_tasks(setup, config.seed, seeds, law)[1].p0)
    opt = {**optim.DEFAULTS, **dict(setup.optimizer)}
    lines = [f"# Allocation lab: {len(names)} methods × {len(seeds)} paired seeds", ""]
    lines += [
        f"Task: {setup.num_train} train / {setup.num_test} held-out prompts, K = "
        f"{setup.num_answers} answers, d = {setup.feature_dim} + {setup.num_skills} skills, "
        f"≤ {setup.max_correct} correct, scorer {setup.scorer}; difficulty `{law}` (held-out "
        f"initial p: mean {100 * p0_test.mean():.1f} %, median "
        f"{100 * np.median(p0_test):.1f} %, < 1 %: {100 * (p0_test < 0.01).mean():.0f} % of "
        f"prompts). P = {setup.prompts_per_step}, N0 = {setup.n0} (B = {setup.budget}), "
        f"n_min = {setup.n_min}, n_max = {setup.n_max}, {setup.num_steps} steps "
        f"({setup.num_steps // setup.steps_per_epoch} epochs), "
        f"{ {'adamw': 'AdamW', 'sgd': 'SGD'}[opt['name']]} lr {opt['learning_rate']}, "
        f"clip {opt['grad_clip']}, {setup.aggregation}; θ = "
        f"{'preset (0.05)' if theta is None else theta}.",
        "",
        f"CIs: 95 %, paired over seeds, {'Student t' if ci == 't' else 'percentile bootstrap'}"
        "; (n.s.) = the interval contains 0 (no difference).", ""]
    cell_lines, main_gate = report_cell(main, ks, list(rep.table_ks), ref, names, ci,
                                        controls, opt["learning_rate"])
    lines += cell_lines
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
                    "pass_at_k_training.png"), f"{law}, {len(seeds)} seeds, mean ± 1.96 se")
    figure_delta(main, setup, ref, ci, os.path.join(workdir, "pass_at_k_delta.png"))

    maze_family, maze_gate = None, None
    if config.maze_family.enabled:
        mf = config.maze_family
        fs = _maze_family_setup(config)
        maze_family = run_cell(list(mf.methods), fs, config.seed, seeds, {"maze": "maze"},
                               runners, controls, theta)["maze"]
        _, test0, params0 = jax.tree.map(lambda x: x[0],
                                         train.make_tasks(fs, config.seed, seeds[:1]))
        p0 = np.asarray(train.FAMILIES["maze"].success_probs(params0, test0))
        lines += [f"# Maze-policy task family ({len(mf.methods)} methods × {len(seeds)} "
                  "paired seeds)", "",
                  f"A next-move softmax shared across {fs.maze_size}×{fs.maze_size} mazes "
                  f"(`lab.maze_task`), horizon H = {fs.horizon}, shortest paths "
                  f"{fs.min_path}..{fs.horizon}; {fs.num_train} train / {fs.num_test} held-out "
                  f"mazes; p exact by DP (seed 0 held-out initial p: mean "
                  f"{100 * p0.mean():.1f} %, < 1 %: {100 * (p0 < 0.01).mean():.0f} % of "
                  f"prompts). P = {fs.prompts_per_step}, N0 = {fs.n0}, n_max = {fs.n_max}, "
                  f"{fs.num_steps} steps, lr {dict(fs.optimizer)['learning_rate']}, "
                  f"{fs.aggregation}.", ""]
        cell_lines, maze_gate = report_cell(maze_family, ks, list(rep.table_ks), ref,
                                            list(mf.methods), ci, controls,
                                            dict(fs.optimizer)["learning_rate"], "Maze family: ")
        lines += cell_lines

    sweep_rows: list[dict[str, Any]] = []
    if config.sweep.enabled:
        sweep_lines, sweep_rows = run_sweep(config, runners)
        lines += sweep_lines

    maze_cell = None
    if config.maze_cell.enabled:
        mc = config.maze_cell
        ms = _maze_cell_setup(config)
        maze_cell = run_cell(list(mc.methods), ms, config.seed, seeds,
                             {mc.difficulty: mc.difficulty}, runners, controls, theta)
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
                      ""] + ([table_paired(sub, ks, list(mc.table_ks), 1, NULL,
                                           list(mc.methods), ci), ""] if controls else [])

    rows: list[dict[str, Any]] = []
    if config.regime.enabled:
        rg = config.regime
        shapes = [tuple(int(x) for x in s) for s in rg.shapes]
        laws = {d: d for d in rg.difficulties}
        for shape in shapes:
            cell = run_cell(list(rg.methods), _regime_setup(config, shape), config.seed + 1,
                            [int(s) for s in rg.seeds], laws, runners, rg.controls, theta)
            rows += regime_rows(cell, shape, ks, list(rg.ks),
                                [ref, rep.challenge_reference, NULL], ci)
        with open(os.path.join(workdir, "regime.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        lines += [f"## Regime map ({len(rg.seeds)} seeds, {rg.num_steps} steps per cell; "
                  "held-out; points)", "",
                  "winner: the best mean; '~' lists the methods whose paired CI against it "
                  "contains 0.", ""]
        others = [m for m in rg.methods if m != ref]
        new = [m for m in rg.methods if m in rep.challengers]
        for k in rg.ks:
            lines += [f"pass@{k}, Δ vs {ref}:", "",
                      table_regime(rows, list(rg.difficulties), shapes, k, ref, others,
                                   len(rg.seeds)), ""]
            if rg.controls:
                lines += [f"pass@{k}, Δ vs the null (uniform with shuffled rewards):", "",
                          table_regime(rows, list(rg.difficulties), shapes, k, NULL,
                                       list(rg.methods), len(rg.seeds)), ""]
            if new and rep.challenge_reference in rg.methods:
                lines += [f"pass@{k}, new rules Δ vs {rep.challenge_reference}:", "",
                          table_regime(rows, list(rg.difficulties), shapes, k,
                                       rep.challenge_reference, new, len(rg.seeds)), ""]
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
            "maze_family": maze_family, "sweep": sweep_rows, "wall_s": wall,
            "gate": main_gate, "maze_gate": maze_gate}
