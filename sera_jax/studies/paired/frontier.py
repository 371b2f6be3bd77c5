"""Learning-rate frontiers and the lr pilot (`--stage=frontier`, `config.frontier`).

For every lr of `frontier.learning_rates`: the comparison of `frontier.methods` with
`frontier.seeds` and the null control (`frontier.null_seeds`) from the shared SFT stage, in
`frontier/lr<lr>/`. The config's own lr is the comparison itself (`lr_arms`): the workdir's
runs of `frontier.methods` and `compare.methods` with `compare.seeds` and the comparison's
null seeds -- so `frontier.methods = ("uniform",)` draws uniform's frontier and places the
compared methods at the config's lr without running them at every lr. Each method's point is
(pass@1, pass@k) on the primary endpoint's split (`compare.primary.split`: held-out prompts,
or the sealed test split, when the held-out points are kept beside as `points_eval`,
`sft_eval`, `blind_eval`) with k and the window of `compare.primary`: per seed the
mean over the last `window` evaluation points, then the Student t interval over seeds. Each
lr's gate is `curves.null_gate` (baseline − null at held-out pass@1, CI above 0 and mean above
`compare.gate_floor_multiple` × the noise floor).

The lr rule: **the selected lr is the one where the baseline does best on the
primary endpoint's metric among the lrs whose gate passes** — the baseline tuned on the
compared metric, never the lr that makes a comparison look best. With
`frontier.methods = ("uniform",)` this stage is the lr pilot; with uniform and SERA it draws
both frontiers, and SERA's frontier lies above uniform's where, at SERA's pass@1, SERA's
pass@k exceeds uniform's frontier (linear interpolation between uniform's points; outside
their pass@1 range: not comparable).

SFT start and blind control: the SFT start (its held-out curve at the window's points, the
same keys as every run) is uniform's lr -> 0 point: it joins uniform's frontier as a reference
point. SERA's distance above that frontier at its own pass@1 carries a seed-bootstrap CI
(`frontier_distance`: each resample draws every (lr, arm)'s seeds with replacement,
independently, recomputes the mean points and the interpolated distance; the SFT start is one
fixed policy; resamples whose SERA pass@1 falls outside the frontier's pass@1 range are left
out and counted). The blind control's (pass@1, pass@k) is tabled and drawn beside them.
Frontier gap (`gap`): for every method with points at >= 2 lrs, its frontier minus the
baseline's at matched pass@1 over the overlap of their pass@1 ranges and at 2 levels inside
it, with a seed bootstrap paired by seed id and, against `frontier.margin` (optional), the
equivalence test. `frontier.method_seeds` (optional, method -> seeds) gives a method its own
seeds at every lr in place of `frontier.seeds` (at the config's own lr only a frontier method
that is not compared; the compared ones keep `compare.seeds`).
The frontier is pre-registered (`prereg`, section "frontier": metric, window, lr grid and the
rules, and `method_seeds` and the margin with the gap's rule when set) and refuses to run on
a start that does not read its prompts (`validity`); an exploratory config
(`compare.exploratory`) runs without it and its outputs say so.

Outputs: `results/frontier.{json,md,png}`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from sera_jax.records import log_timing, write_json
from sera_jax.studies import compare as cmp
from sera_jax.studies.compare import above_frontier
from sera_jax.studies.paired.figures import plot_frontier
from sera_jax.studies.paired.gap import frontier_gaps, gap_lines
from sera_jax.studies.paired.kinds import get_kind, words
from sera_jax.studies.paired.prereg import check_preregistration
from sera_jax.studies.paired.report import aggregate
from sera_jax.studies.paired.spec import (
    DISTANCE_RULE,
    NULL,
    SELECTION_RULE,
    SPLIT_NAMES,
    all_methods,
    arms,
    frontier_learning_rates,
    frontier_margin,
    frontier_method_seeds,
    frontier_seeds,
    is_config_lr,
    is_exploratory,
    lr_arms,
    lr_config,
    primary_split,
)
from sera_jax.studies.paired.stages import run_plan
from sera_jax.studies.paired.tables import exploratory_banner, prereg_lines
from sera_jax.studies.paired.validity import require_readable


def lr_dir(cfg: ml_collections.ConfigDict, workdir: str, lr: float) -> str:
    """Where the runs at `lr` live: the workdir itself at the config's own lr (the default
    comparison's runs are points of the frontier), else `frontier/lr<lr>`."""
    if is_config_lr(cfg, lr):
        return workdir
    return os.path.join(workdir, "frontier", f"lr{lr:g}")


def _window_values(table: dict[str, Any], arm: str, k: int, window: int,
                   split: str = "eval") -> list[float]:
    """Per seed: pass@k on `split` averaged over the last `window` evaluation points."""
    runs = table["curves"]["per_seed"].get(arm, {})
    return [float(np.mean(r[split]["pass_at_k"][str(k)][-window:])) for r in runs.values()]


def point(table: dict[str, Any], arm: str, k: int, window: int, level: float,
          split: str = "eval") -> dict[str, Any] | None:
    """One arm's frontier point on `split`: {pass@1, pass@k} as `compare.seed_interval`s."""
    x1 = _window_values(table, arm, 1, window, split)
    xk = _window_values(table, arm, k, window, split)
    if not x1:
        return None
    return {"pass@1": cmp.seed_interval(x1, level), f"pass@{k}": cmp.seed_interval(xk, level),
            "seeds": [int(s) for s in table["curves"]["per_seed"][arm]]}


def start_point(table: dict[str, Any], k: int, window: int, split: str = "eval"
                ) -> dict[str, float]:
    """The SFT start's (pass@1, pass@k): its curve on `split` (each point scored with that
    point's keys) averaged over the last `window` points, as every run's point."""
    v = table["curves"]["sft"][split]["pass_at_k"]
    return {"pass@1": float(np.mean(v["1"][-window:])),
            f"pass@{k}": float(np.mean(v[str(k)][-window:]))}


def blind_point(table: dict[str, Any], k: int, split: str = "eval"
                ) -> dict[str, float] | None:
    """The blind control's exact (pass@1, pass@k) on `split`, when the table has it."""
    b = table.get("blind", {}).get("pass_at_k" if split == "eval" else f"{split}_pass_at_k",
                                   {})
    return ({"pass@1": float(b["1"]), f"pass@{k}": float(b[str(k)])}
            if "1" in b and str(k) in b else None)


def lr_points(table: dict[str, Any], arms_: Sequence[str], k: int, window: int, level: float,
              split: str = "eval") -> dict[str, Any]:
    """One lr's `points` on `split` (the primary's) and, when that is not the held-out split,
    the held-out points beside them (`points_eval`)."""
    out = {"points": {arm: p for arm in arms_
                      if (p := point(table, arm, k, window, level, split)) is not None}}
    if split != "eval":
        out["points_eval"] = {arm: p for arm in arms_
                              if (p := point(table, arm, k, window, level)) is not None}
    return out


def start_points(table: dict[str, Any], k: int, window: int, split: str = "eval"
                 ) -> dict[str, Any]:
    """The start's and the blind control's points on `split` (`sft`, `blind`) and, when that
    is not the held-out split, the held-out ones beside them (`sft_eval`, `blind_eval`)."""
    out = {"sft": start_point(table, k, window, split), "blind": blind_point(table, k, split)}
    if split != "eval":
        out.update(sft_eval=start_point(table, k, window), blind_eval=blind_point(table, k))
    return out


def frontier_distance(reference: Sequence[tuple[Sequence[float], Sequence[float]]],
                      start: tuple[float, float] | None,
                      target: tuple[Sequence[float], Sequence[float]], *,
                      num_resamples: int = 2000, level: float = 0.95, seed: int = 0
                      ) -> dict[str, Any]:
    """Distance of the target's mean point above a reference frontier, with a seed bootstrap.

    `reference`: per lr, per-seed (pass@1 values, pass@k values) of the baseline; `start`:
    the fixed (pass@1, pass@k) of the SFT start (lr -> 0; None: left out); `target`: the
    method's per-seed (pass@1, pass@k). Estimate: `above_frontier` of the means. Each
    resample draws the seeds of every group with replacement, independently; resamples whose
    target pass@1 lies outside the frontier's range are left out (`defined_share`)."""
    def distance(groups: list[tuple[np.ndarray, np.ndarray]], tgt: tuple) -> float | None:
        ref = [(float(np.mean(x)), float(np.mean(y))) for x, y in groups]
        ref += [start] if start is not None else []
        return above_frontier([(float(np.mean(tgt[0])), float(np.mean(tgt[1])))], ref)[0]

    groups = [(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in reference]
    tgt = (np.asarray(target[0], np.float64), np.asarray(target[1], np.float64))
    est = distance(groups, tgt)
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(int(num_resamples)):
        rs = []
        for x, y in [*groups, tgt]:
            idx = rng.integers(0, x.size, x.size)
            rs.append((x[idx], y[idx]))
        d = distance(rs[:-1], rs[-1])
        if d is not None:
            stats.append(d)
    lo = hi = None
    if len(stats) >= 2 and est is not None:
        lo, hi = (float(q) for q in np.quantile(stats, [(1 - level) / 2, (1 + level) / 2]))
    return {"mean": est, "lo": lo, "hi": hi, "defined_share": len(stats) / int(num_resamples),
            "resamples": int(num_resamples)}


def stage_frontier(cfg: ml_collections.ConfigDict, workdir: str, mesh=None,
                   seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """Run (or resume) every lr's comparison, restricted to `seeds` when given (one process
    per core, like `--stage=rl`), aggregate what has finished and write
    `results/frontier.{json,md,png}` after every lr (partial results survive a kill)."""
    methods = all_methods(cfg)
    all_seeds = frontier_seeds(cfg)
    only = None if seeds is None else {int(s) for s in seeds}
    spec = cfg.compare.primary
    k, window, level = int(spec.k), int(spec.window), float(cfg.compare.level)
    base = cfg.compare.baseline
    sft_dir = os.path.join(workdir, "sft")
    split = primary_split(cfg)
    out: dict[str, Any] = {
        "methods": methods, "seeds": all_seeds, "k": k, "window": window,
        "metric": f"{SPLIT_NAMES[split]} pass@1 and pass@{k}, per seed averaged over the last "
                  f"{window} evaluation points; {100 * level:.0f} % Student t interval over "
                  "seeds",
        "rule": SELECTION_RULE.format(base=base, k=k),
        "distance_rule": DISTANCE_RULE.format(k=k),
        "bootstrap": {"num_resamples": int(cfg.compare.bootstrap), "level": level,
                      "seed": int(cfg.compare.bootstrap_seed)},
        "preregistration": ({"found": False, "exploratory": True} if is_exploratory(cfg)
                            else check_preregistration(cfg, "frontier")),
        "validity": require_readable(cfg, sft_dir, "--stage=frontier"),
        "study": get_kind(cfg).name, "lrs": {}}
    if is_exploratory(cfg):
        out["exploratory"] = True
    if frontier_method_seeds(cfg):
        out["method_seeds"] = frontier_method_seeds(cfg)
    out["margin"] = frontier_margin(cfg)  # the gap's equivalence margin (None: none)
    if split != "eval":  # the points read the primary's split; the held-out ones beside
        out["split"] = split
    for lr in frontier_learning_rates(cfg):
        ccfg = lr_config(cfg, lr)
        cdir = lr_dir(cfg, workdir, lr)
        lr_methods, lr_seeds, lr_per = lr_arms(cfg, lr)
        t0 = time.perf_counter()
        diverged = run_plan(ccfg, cdir, arms(ccfg, lr_methods, lr_seeds, lr_per), mesh,
                            only=only, keep_going=True, sft_dir=sft_dir)
        results_dir = os.path.join(workdir, "frontier", f"lr{lr:g}", "results")
        table = aggregate(ccfg, cdir, lr_methods, lr_seeds, sft_dir=sft_dir, mesh=mesh,
                          plots=False, results_dir=results_dir, method_seeds=lr_per)
        log_timing(workdir, f"frontier/lr{lr:g}", time.perf_counter() - t0)
        pts = lr_points(table, lr_methods + ([NULL] if ccfg.compare.null else []), k, window,
                        level, split)
        out["lrs"][f"{lr:g}"] = {"lr": lr, "dir": os.path.relpath(cdir, workdir),
                                 "methods": lr_methods, "seeds": lr_seeds,
                                 **({"method_seeds": lr_per} if lr_per else {}),
                                 **pts, "gate": table["gate"],
                                 # runs stopped by a non-finite step: left out of the points
                                 **({"diverged": diverged} if diverged else {})}
        if "sft" not in out and table["curves"]["sft"].get(split):
            out.update(start_points(table, k, window, split))
        out.update(summarise(out, base, k))
        write_frontier(out, os.path.join(workdir, "results"))
    return out


def summarise(out: dict[str, Any], base: str, k: int) -> dict[str, Any]:
    """The selected lr (module docstring) and, per other method, its points' distance above
    the baseline's frontier (the SFT start, `out["sft"]`, its lr -> 0 point when present),
    with the seed-bootstrap CI of `frontier_distance` (`out["bootstrap"]` settings), and
    the frontier-to-frontier `gap` (`gap.frontier_gaps`, against `out["margin"]`)."""
    key = f"pass@{k}"
    admissible = {name: e["points"][base][key]["mean"] for name, e in out["lrs"].items()
                  if e["gate"]["passes"] and base in e["points"]}
    selected = max(admissible, key=admissible.get) if admissible else None
    ref = [(e["points"][base]["pass@1"]["mean"], e["points"][base][key]["mean"])
           for e in out["lrs"].values() if base in e["points"]]
    start = (out["sft"]["pass@1"], out["sft"][key]) if out.get("sft") else None
    ref += [start] if start is not None else []
    bases = [e["points"][base] for e in out["lrs"].values() if base in e["points"]]
    per_seed = ([(b["pass@1"]["per_seed"], b[key]["per_seed"]) for b in bases]
                if all("per_seed" in b["pass@1"] for b in bases) else None)
    boot = out.get("bootstrap", {})
    above, ci = {}, {}
    for m in out["methods"]:
        if m == base:
            continue
        names = [n for n, e in out["lrs"].items() if m in e["points"]]
        pts = [(out["lrs"][n]["points"][m]["pass@1"]["mean"],
                out["lrs"][n]["points"][m][key]["mean"]) for n in names]
        above[m] = dict(zip(names, above_frontier(pts, ref), strict=True))
        ci[m] = {n: frontier_distance(per_seed, start, (
            out["lrs"][n]["points"][m]["pass@1"]["per_seed"],
            out["lrs"][n]["points"][m][key]["per_seed"]), **boot)
            for n in names if per_seed is not None
            and "per_seed" in out["lrs"][n]["points"][m]["pass@1"]}
    return {"selected_lr": None if selected is None else out["lrs"][selected]["lr"],
            "admissible": sorted(admissible, key=float), "above_baseline_frontier": above,
            "above_baseline_frontier_ci": ci, "gap": frontier_gaps(out, base, k),
            **({"gap_eval": frontier_gaps(out, base, k, "points_eval", "sft_eval")}
               if any("points_eval" in e for e in out["lrs"].values()) else {})}


def frontier_markdown(out: dict[str, Any]) -> str:
    """One row per (lr, arm): pass@1 and pass@k with CIs; the gate per lr; the selection."""
    k = out["k"]
    key = f"pass@{k}"

    def ci(e: dict[str, Any]) -> str:
        if e["lo"] is None:
            return f"{100 * e['mean']:.2f}"
        return f"{100 * e['mean']:.2f} [{100 * e['lo']:.2f}, {100 * e['hi']:.2f}]"

    lines = [exploratory_banner(), ""] if out.get("exploratory") else []
    lines += [f"Frontier: {out['metric']} (%).", "",
             f"| lr | arm | seeds | pass@1 | {key} | gate (baseline − null, pass@1) |",
             "|---|---|---|---|---|---|"]
    for name, p in (("lr -> 0", out.get("sft")), ("–", out.get("blind"))):
        if p:
            arm = "SFT start" if name == "lr -> 0" else "blind (exact)"
            lines.append(f"| {name} | {arm} | – | {100 * p['pass@1']:.2f} | "
                         f"{100 * p[key]:.2f} | |")
    for name, e in out["lrs"].items():
        for arm, p in e["points"].items():
            lines.append(f"| {name} | {arm} | {p['pass@1']['seeds']} | {ci(p['pass@1'])} | "
                         f"{ci(p[key])} | {e['gate']['outcome'] if arm == NULL else ''} |")
    sel = out.get("selected_lr")
    admissible = ", ".join(out.get("admissible", [])) or "none"
    chosen = "none (no lr passes the gate)" if sel is None else f"{sel:g}"
    if any("points_eval" in e for e in out["lrs"].values()):
        lines += ["", f"Beside them, on the held-out {words(out.get('study')).prompts} (%):",
                  "", f"| lr | arm | seeds | pass@1 | {key} |", "|---|---|---|---|---|"]
        if out.get("sft_eval"):
            p = out["sft_eval"]
            lines.append(f"| lr -> 0 | SFT start | – | {100 * p['pass@1']:.2f} | "
                         f"{100 * p[key]:.2f} |")
        for name, e in out["lrs"].items():
            for arm, p in e.get("points_eval", {}).items():
                lines.append(f"| {name} | {arm} | {p['pass@1']['seeds']} | {ci(p['pass@1'])} "
                             f"| {ci(p[key])} |")
    for name, e in out["lrs"].items():
        if e.get("diverged"):
            runs = ", ".join(f"{d['arm']} seed {d['seed']}" for d in e["diverged"])
            lines += ["", f"lr {name}: diverged (a non-finite step; left out of its points): "
                          f"{runs}."]
    lines += ["", f"Rule: {out['rule']}. Admissible: {admissible}. Selected: {chosen}."]
    lines += validity_lines(out)
    for m, d in out.get("above_baseline_frontier", {}).items():
        cis = out.get("above_baseline_frontier_ci", {}).get(m, {})
        cells = [f"lr {n}: " + ("outside uniform's pass@1 range" if v is None
                                else f"{100 * v:+.2f} pp" + _distance_ci(cis.get(n)))
                 for n, v in d.items()]
        lines.append(f"{m}: {key} above the baseline's frontier at its own pass@1 — "
                     + "; ".join(cells) + ".")
    lines += gap_lines(out) + gap_lines(out, "gap_eval")
    return "\n".join(lines) + "\n"


def _distance_ci(e: dict[str, Any] | None) -> str:
    if not e or e.get("lo") is None:
        return ""
    return (f" [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}] (seed bootstrap, "
            f"{100 * e['defined_share']:.0f} % of resamples inside the range)")


def validity_lines(out: dict[str, Any]) -> list[str]:
    """The validity verdict and the pre-registration under the frontier table."""
    lines = []
    v = out.get("validity")
    if v:
        lines.append(f"Task validity: {v['line']}" + (
            " -- **override** (compare.allow_blind_task=True): an exploration."
            if v.get("override") else "."))
    lines += prereg_lines(out.get("preregistration"))
    return lines


def write_frontier(out: dict[str, Any], results_dir: str) -> None:
    """`frontier.{json,md,png}` of the lrs finished so far."""
    os.makedirs(results_dir, exist_ok=True)
    write_json(os.path.join(results_dir, "frontier.json"), out)
    with open(os.path.join(results_dir, "frontier.md"), "w") as f:
        f.write(frontier_markdown(out))
    plot_frontier(out, os.path.join(results_dir, "frontier.png"))


__all__ = ["above_frontier", "blind_point", "frontier_distance", "frontier_markdown", "lr_dir",
           "lr_points", "point", "stage_frontier", "start_point", "start_points", "summarise",
           "write_frontier"]
