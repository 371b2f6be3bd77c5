"""Maze study regime map: a sweep of prompts per step x N0 (n_max tied to N0) and
optionally θ, each cell a comparison from the shared SFT stage."""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections

from sera_jax.records import log_timing, write_json
from sera_jax.studies import common
from sera_jax.studies.paired.figures import plot_regime
from sera_jax.studies.paired.report import aggregate
from sera_jax.studies.paired.spec import (
    arm_config,
    cell_config,
    default_threshold,
    is_exploratory,
    regime_cells,
    regime_methods,
    regime_seeds,
    regime_thresholds,
    run_dir,
    uses_threshold,
)
from sera_jax.studies.paired.stages import stage_rl
from sera_jax.studies.paired.tables import _ci, _short, exploratory_banner


def cell_name(cell: tuple[int, int, int], theta: float | None = None) -> str:
    return f"P{cell[0]}_N{cell[1]}_nmax{cell[2]}" + ("" if theta is None else f"_theta{theta:g}")


def stage_regime(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
    """The regime map: per cell (P, N0, n_max) the comparison of `regime.methods` with
    `regime.seeds` in `regime/<cell>/` from the shared SFT stage (the cell of the config's
    own shape runs in the workdir itself, so a finished default comparison is reused), then
    `results/regime_map.{json,md,png}`: SERA − baseline at pass@1 and at the largest k with
    CIs, mixed fraction and κ spread per cell."""
    cells = regime_cells(cfg)
    methods = regime_methods(cfg)
    seeds = regime_seeds(cfg)
    thetas = regime_thresholds(cfg)
    preset_theta = default_threshold(cfg, methods)
    sft_dir = os.path.join(workdir, "sft")
    own = (int(cfg.rl.prompts_per_step), int(cfg.rl.rollouts_per_prompt),
           int(cfg.rl.allocation.n_max))
    out: dict[str, Any] = {"cells": {}, "methods": methods, "seeds": seeds,
                           **({"exploratory": True} if is_exploratory(cfg) else {})}
    for cell, theta in [(cell, theta) for cell in cells for theta in thetas]:
        ccfg = cell_config(cfg, cell)
        # Runs of methods without θ live in the θ-free cell (the workdir itself for the
        # config's own shape) and are linked into each θ cell: one run, every θ.
        base_dir = workdir if cell == own else os.path.join(workdir, "regime", cell_name(cell))
        cdir = (base_dir if theta in (None, preset_theta) else
                os.path.join(workdir, "regime", cell_name(cell, theta)))
        configs = {m: arm_config(ccfg, m, theta) for m in methods}
        t0 = time.perf_counter()
        for seed in seeds:
            for method in methods:
                shared = cdir != base_dir and not uses_threshold(method)
                stage_rl(configs[method], base_dir if shared else cdir, method, seed, mesh,
                         sft_dir=sft_dir)
                if shared:
                    _link_run(base_dir, cdir, method, seed)
        table = aggregate(ccfg, cdir, methods, seeds, sft_dir=sft_dir, mesh=mesh, plots=False,
                          results_dir=os.path.join(cdir, "results"), arm_configs=configs,
                          curve_analysis=False)
        log_timing(workdir, f"regime/{cell_name(cell, theta)}", time.perf_counter() - t0)
        out["cells"][cell_name(cell, theta)] = {
            "P": cell[0], "N0": cell[1], "n_max": cell[2], "theta": theta,
            "paired": table["paired"],
            "diagnostics": {m: {f: e.get(f) for f in ("mixed_fraction", "kappa_true_min",
                                                     "kappa_true_mean", "kappa_believed_min",
                                                     "kappa_true_min_solvable",
                                                     "never_solved_share")}
                            for m, e in table["methods"].items()},
            "pass_at_k": {m: {k: v["mean"] for k, v in e["pass_at_k"].items()}
                          for m, e in table["methods"].items()},
            "seconds": time.perf_counter() - t0}
        # After every cell: partial maps.
        write_regime(out, os.path.join(workdir, "results"), regime_output(cfg))
    return out


def _link_run(src_workdir: str, dst_workdir: str, method: str, seed: int) -> None:
    """`dst/rl/<method>/seed<s>` -> the finished run in `src` (a relative symlink)."""
    src, dst = run_dir(src_workdir, method, seed), run_dir(dst_workdir, method, seed)
    if os.path.lexists(dst):
        if os.path.realpath(dst) != os.path.realpath(src):
            raise common.StudyError(f"{dst} exists and is not the shared run {src}; remove "
                                    "it and run --stage=regime again")
        return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.symlink(os.path.relpath(src, os.path.dirname(dst)), dst)


def regime_output(cfg: ml_collections.ConfigDict) -> str:
    """File stem of a regime sweep's results (`regime.output`, default `regime_map`), so a θ
    sweep in the same workdir does not overwrite the P x N0 map."""
    return str(cfg.regime.get("output", "regime_map") or "regime_map")


def write_regime(out: dict[str, Any], results_dir: str, stem: str = "regime_map") -> None:
    """`<stem>.{json,md,png}` of the cells finished so far."""
    os.makedirs(results_dir, exist_ok=True)
    write_json(os.path.join(results_dir, f"{stem}.json"), out)
    with open(os.path.join(results_dir, f"{stem}.md"), "w") as f:
        f.write(regime_markdown(out))
    plot_regime(out, results_dir, stem)


def regime_markdown(out: dict[str, Any]) -> str:
    """One row per (cell, compared method): pass@1 and pass@k_max differences with CIs and
    verdicts; of both arms the mixed fraction, the realised κ_min over solvable prompts and the
    budget share on never-solved prompts."""
    lines = [exploratory_banner(), ""] if out.get("exploratory") else []
    lines += ["| P | N0 | n_max | θ | method | Δ pass@1 [95 % CI] | Δ pass@k_max [95 % CI] | "
             "mixed (base / method) | κ_min realised, solvable prompts (base / method) | budget on "
             "never-solved (base / method) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in out["cells"].values():
        diag = cell["diagnostics"]
        base = next(m for m in out["methods"] if m not in cell["paired"])
        for arm, p in cell["paired"].items():
            e = p["eval"]
            kmax = list(e)[-1]

            def d(m: str, f: str, diag: dict = diag) -> str:
                v = diag.get(m, {}).get(f)
                return "–" if v is None else f"{v['mean']:.2f}"

            theta = cell.get("theta")
            lines.append(f"| {cell['P']} | {cell['N0']} | {cell['n_max']} | "
                         f"{'preset' if theta is None else f'{theta:g}'} | {arm} | "
                         f"{_ci(e['1'])} {_short(e['1']['verdict'])} | k={kmax}: "
                         f"{_ci(e[kmax])} {_short(e[kmax]['verdict'])} | "
                         f"{d(base, 'mixed_fraction')} / {d(arm, 'mixed_fraction')} | "
                         f"{d(base, 'kappa_true_min_solvable')} / "
                         f"{d(arm, 'kappa_true_min_solvable')} | "
                         f"{d(base, 'never_solved_share')} / {d(arm, 'never_solved_share')} |")
    return "\n".join(lines) + "\n"
