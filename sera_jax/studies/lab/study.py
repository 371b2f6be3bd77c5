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
3. **lr sweep** (`config.sweep`, `lab.sweep`, off by default) -- the frontier (pass@1 vs pass@K) of
   each method over an lr grid with the gate per lr, the selected lr (admissible, best
   uniform pass@K) and a θ sensitivity table at it;
4. **maze cell** (`config.maze_cell`) -- the shape of the maze CPU default (P, N0, n_max,
   steps) on the maze-like difficulty;
5. **regime map** (`config.regime`, `lab.regime`) -- a grid of (P, N0, n_max) shapes ×
   difficulty laws, `regime.methods` on the seeds `regime.seeds` (of base seed
   `config.seed + 1`) each: per cell the paired Δ of each method vs the baseline
   (`config.compare.baseline`), vs the null when `regime.controls`, and the winner (best
   mean; "tie" lists methods whose paired CI against it contains 0).

With `maze_family.window` / `maze_cell.window` = w > 0 that cell also reports the window
endpoint (`cells.report_window`): each seed's held-out pass@k averaged over the last w
evaluation points, per arm, the paired differences of each method − every method listed
before it and − the null, and the gate at the final point (0: the final point only).

Differences are paired over seeds; the interval is `config.report.ci` ('t': Student t over
seeds, 'bootstrap': percentile bootstrap over seeds; `sera_jax.studies.compare.seed_difference`).

Writes to `workdir`: `summary.md` (also returned), `final.csv` (per method, seed, split, k:
final pass@k), `regime.csv`, `results.npz` (every array), `pass_at_k_training.png`,
`pass_at_k_delta.png`, `regime_map_pass{k}.png`, and `arms/`: every finished arm under the
fingerprint of what it depends on (`cells.arm_fingerprint`). A re-run loads the stored arms
instead of training them again (a killed run resumes at its first unfinished arm; a changed
config trains only the arms it changes).
"""

from __future__ import annotations

import csv
import functools
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from sera_jax import methods as methods_lib
from sera_jax import optim, validation
from sera_jax.records import write_json
from sera_jax.studies import common, compare
from sera_jax.studies.lab import train
from sera_jax.studies.lab.cells import (
    AA,
    ARMS,
    NULL,
    _final,
    gate,
    maze_cell_setup,
    maze_family_setup,
    method_for,
    regime_setup,
    report_cell,
    report_window,
    run_cell,
    table_diagnostics,
    table_paired,
)
from sera_jax.studies.lab.regime import run_regime
from sera_jax.studies.lab.sweep import run_sweep

SPLITS = ("train", "held-out")
#: Re-exported from `cells` (the study's vocabulary: arms, the gate, one cell).
__all__ = ["AA", "NULL", "RENAMED", "SPLITS", "gate", "method_for", "run", "run_cell",
           "validate"]

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
        ps = [compare.seed_difference(_final(res, 1, i), _final(results[reference], 1, i), ci)
              for i in range(len(ks))]
        m = np.array([p["mean"] for p in ps])
        ax.plot(ks, m, marker="o", ms=3, label=name,
                lw=2.2 if name == "sera" else 1.1)
        ax.fill_between(ks, [p["lo"] for p in ps], [p["hi"] for p in ps], alpha=0.12)
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
                methods_lib.get_method(name)
            except ValueError as e:
                raise common.StudyError(f"config.{block}.methods: {e}") from None
        c(config.compare.baseline in names, "compare.baseline", config.compare.baseline,
          f"one of {block}.methods={tuple(names)} (differences are paired against it)")
        if config.compare.controls or block == "sweep":
            c("uniform" in names, f"{block}.methods", names, "a tuple holding 'uniform' (the "
              "controls and the lr gate compare uniform with the null arm)")
    cm = config.compare.checked_methods
    c(isinstance(cm, tuple | list) and all(isinstance(n, str) for n in cm),
      "compare.checked_methods", cm, "a tuple of method names (() = checked mode off)")
    c(isinstance(config.compare.controls, bool), "compare.controls", config.compare.controls,
      "True or False (the null and A/A arms beside every comparison)")
    c(isinstance(config.regime.controls, bool), "regime.controls", config.regime.controls,
      "True or False (the null and A/A arms in every regime cell)")
    c(validation.is_positive_int(config.rl.max_rounds), "rl.max_rounds", config.rl.max_rounds,
      "an integer >= 1 (generation rounds per step of a DAPO dynamic-sampling method)")
    theta = config.rl.allocation.threshold
    c(theta is None or (validation.is_number(theta) and 0 <= theta <= 1),
      "rl.allocation.threshold", theta, "None (the preset's θ) or a number in [0, 1]")
    if config.compare.controls or config.sweep.enabled:
        c(1 in ks, "eval.ks", config.eval.ks, "a tuple holding 1 (the gate compares pass@1)")
    c(config.sweep.family in ("answers", "maze"), "sweep.family", config.sweep.family,
      "'answers' (the main cell's task) or 'maze' (the maze family's cell)")
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
    c(rep.ci in compare.SEED_INTERVALS, "report.ci", rep.ci, "'t' or 'bootstrap'")
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
            maze_family_setup(config)
        if config.maze_cell.enabled:
            maze_cell_setup(config)
        for shape in (config.regime.shapes if config.regime.enabled else ()):
            regime_setup(config, [int(x) for x in shape])
    except ValueError as e:
        raise common.StudyError(str(e)) from None
    for block, make in (("maze_family", maze_family_setup), ("maze_cell", maze_cell_setup)):
        if config[block].enabled:
            w, cell_setup = config[block].window, make(config)
            n = cell_setup.num_steps // cell_setup.eval_every
            c(validation.is_int(w) and 0 <= w <= n, f"{block}.window", w,
              f"an integer in [0, {n}] (0: off; else the number of last evaluation points "
              f"averaged, of the {n} after step 0)")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Run the study described in the module docstring; returns {'summary', 'main',
    'maze_family', 'maze_cell', 'regime', 'sweep', 'wall_s', 'gate', 'maze_gate', 'window'}
    (a gate: {'delta': `compare.seed_difference`, 'admissible', 'aa_false_positives'}, None without
    controls; 'window': {'maze_cell' / 'maze_family': `cells.report_window`'s numbers} for
    the cells with a window)."""
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
    checked = tuple(config.compare.checked_methods)  # checked mode on their first step
    arms = os.path.join(workdir, ARMS)  # finished arms: a re-run loads them (resume)
    main = run_cell(names, setup, config.seed, seeds, {law: law}, runners, controls,
                    theta, checked, cache_dir=arms)[law]
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
        "; (n.s.) = the interval contains 0: inconclusive (no margin was set: not "
        "equivalence).", ""]
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

    maze_family, maze_gate, windows = None, None, {}
    if config.maze_family.enabled:
        mf = config.maze_family
        fs = maze_family_setup(config)
        maze_family = run_cell(list(mf.methods), fs, config.seed, seeds, {"maze": "maze"},
                               runners, controls, theta, cache_dir=arms)["maze"]
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
        if mf.window:
            cell_lines, windows["maze_family"] = report_window(
                maze_family, fs.eval_steps, ks, list(rep.table_ks), list(mf.methods), ci,
                int(mf.window), dict(fs.optimizer)["learning_rate"], "Maze family: ")
            lines += cell_lines

    sweep_rows: list[dict[str, Any]] = []
    if config.sweep.enabled:
        sweep_lines, sweep_rows = run_sweep(config, runners, arms)
        lines += sweep_lines
        # The frontier's per-seed points: what `results/lab/recompute_frontiers.py` reads.
        write_json(os.path.join(workdir, "sweep.json"), {
            "family": str(config.sweep.family), "frontier_k": int(config.sweep.frontier_k),
            "methods": list(config.sweep.methods), "seed": int(config.seed),
            "rows": sweep_rows})

    maze_cell = None
    if config.maze_cell.enabled:
        mc = config.maze_cell
        ms = maze_cell_setup(config)
        maze_cell = run_cell(list(mc.methods), ms, config.seed, seeds,
                             {mc.difficulty: mc.difficulty}, runners, controls, theta,
                             cache_dir=arms)
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
        if mc.window:
            cell_lines, windows["maze_cell"] = report_window(
                maze_cell, ms.eval_steps, ks, list(mc.table_ks), list(mc.methods), ci,
                int(mc.window), opt["learning_rate"], "Maze default cell: ")
            lines += cell_lines

    rows: list[dict[str, Any]] = []
    if config.regime.enabled:
        regime_lines, rows = run_regime(config, runners, workdir)
        lines += regime_lines

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
            "gate": main_gate, "maze_gate": maze_gate, "window": windows}
