"""Maze study regime map: a sweep of prompts per step x N0 (n_max tied to N0) and
optionally θ, each cell a comparison from the shared SFT stage."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ml_collections

from sera_jax import methods as methods_lib
from sera_jax.records import log_timing, write_json
from sera_jax.studies import common
from sera_jax.studies.maze.figures import plot_regime
from sera_jax.studies.maze.report import aggregate
from sera_jax.studies.maze.setup import (
    run_dir,
    validate,
)
from sera_jax.studies.maze.stages import stage_rl
from sera_jax.studies.maze.tables import _ci, _short


def regime_cells(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """(P, N0, n_max) of every cell of the regime map: `regime.prompts_per_step` x
    `regime.rollouts_per_prompt`, `n_max = min(regime.n_max_factor · N0, regime.n_max_cap)`."""
    r = cfg.regime
    ps, ns = (common.nonempty(common.int_list(r[f], f"regime.{f}", 1), f"regime.{f}")
              for f in ("prompts_per_step", "rollouts_per_prompt"))
    return [(p, n, min(int(r.n_max_factor) * n, int(r.n_max_cap))) for p in ps for n in ns]


def cell_config(cfg: ml_collections.ConfigDict, cell: tuple[int, int, int]
                ) -> ml_collections.ConfigDict:
    """`cfg` with one regime cell's batch shape (P, N0, n_max); no null or A/A control."""
    p, n0, n_max = cell
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.prompts_per_step, out.rl.rollouts_per_prompt = p, n0
    out.rl.allocation.n_max = n_max
    out.compare.null = False
    if "aa" in out.compare:
        out.compare.aa = False
    return out


def regime_thresholds(cfg: ml_collections.ConfigDict) -> list[float | None]:
    """The θ axis of the regime map: `regime.thresholds` (absent or () = one value, None:
    every method keeps its preset θ / the config's override)."""
    return common.float_list(cfg.regime.get("thresholds", ()), "regime.thresholds") or [None]


def regime_methods(cfg: ml_collections.ConfigDict) -> list[str]:
    """`regime.methods` (a tuple of names of `sera_jax.methods.METHODS`)."""
    return common.method_names(cfg.regime.methods, "regime.methods")


def regime_seeds(cfg: ml_collections.ConfigDict) -> list[int]:
    """`regime.seeds` (a non-empty tuple of integers >= 0)."""
    return common.nonempty(common.int_list(cfg.regime.seeds, "regime.seeds"), "regime.seeds")


def uses_threshold(method: str) -> bool:
    """Whether `method`'s preset has an active-set threshold θ (the regime's θ axis varies
    it for these methods only; the others' runs are shared by every θ of a cell)."""
    return "threshold" in methods_lib.get_method(method).options


def default_threshold(cfg: ml_collections.ConfigDict, methods: Sequence[str]) -> float | None:
    """The θ every θ-method of `methods` runs with when the regime does not set one (the
    config's override, else their common preset value; None if they differ). A regime θ
    equal to it reuses the θ-free cell's runs."""
    if cfg.rl.allocation.threshold is not None:
        return float(cfg.rl.allocation.threshold)
    presets = {float(methods_lib.get_method(m).options["threshold"])
               for m in methods if uses_threshold(m)}
    return presets.pop() if len(presets) == 1 else None


def arm_config(ccfg: ml_collections.ConfigDict, method: str, theta: float | None
               ) -> ml_collections.ConfigDict:
    """A regime cell's config for one method at θ (`rl.allocation.threshold = θ` for the
    methods that have one, `ccfg` unchanged for the others)."""
    if theta is None or not uses_threshold(method):
        return ccfg
    out = ml_collections.ConfigDict(ccfg.to_dict())
    out.rl.allocation.threshold = float(theta)
    return out


def validate_regime(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """The regime fields, and every cell's config as a comparison; returns the cells."""
    c = common.check
    c("regime" in cfg, "regime", None, "a regime section (configs/maze/regime_map.py)")
    r = cfg.regime
    c(common.positive_int(r.n_max_factor), "regime.n_max_factor", r.n_max_factor,
      "an integer >= 1")
    c(common.positive_int(r.n_max_cap), "regime.n_max_cap", r.n_max_cap, "an integer >= 1")
    cells = regime_cells(cfg)
    methods = regime_methods(cfg)
    seeds = regime_seeds(cfg)
    thetas = regime_thresholds(cfg)
    c(cfg.compare.baseline in methods, "regime.methods", r.methods,
      f"a list with compare.baseline={cfg.compare.baseline!r}")
    c(thetas == [None] or any(uses_threshold(m) for m in methods), "regime.thresholds",
      r.get("thresholds"), "empty: none of regime.methods has an active-set threshold")
    c(all(t is None or 0.0 <= t < 1.0 for t in thetas), "regime.thresholds",
      r.get("thresholds"), "values in [0, 1)")
    for cell in cells:
        for theta in thetas:
            try:
                for m in methods:
                    validate(arm_config(cell_config(cfg, cell), m, theta), [m], seeds)
            except common.StudyError as e:
                at = "" if theta is None else f" θ={theta:g}"
                raise common.StudyError(f"regime cell P={cell[0]} N0={cell[1]} "
                                        f"n_max={cell[2]}{at}: {e}") from None
    return cells


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
    out: dict[str, Any] = {"cells": {}, "methods": methods, "seeds": seeds}
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
    verdicts; of both arms the mixed fraction, the realised κ_min over solvable mazes and the
    budget share on never-solved mazes."""
    lines = ["| P | N0 | n_max | θ | method | Δ pass@1 [95 % CI] | Δ pass@k_max [95 % CI] | "
             "mixed (base / method) | κ_min realised, solvable mazes (base / method) | budget on "
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
