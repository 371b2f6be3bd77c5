"""The lr-matched arm (`--stage=matched`): is SERA more than a smaller step?

SERA at the config's lr moves held-out pass@1 by some gain over the SFT start; uniform at a
smaller lr moves it less. The matched arm is uniform at the lr whose pass@1 gain equals
SERA's, chosen by `MATCH_RULE` (`matched_lr`) from the frontier's results
(`results/frontier.json`), written to the pre-registration (`lr_matched`) before the arm
runs, then run with the matched seeds from the shared SFT start in `matched/lr<lr>/`, and
compared with SERA (the workdir's runs at the config's lr, same seeds, same evaluation keys)
on the pre-registered endpoint: SERA − matched uniform on held-out pass@k (the primary's k
and window), seed-level t interval and the two-level bootstrap over seeds and prompts.

Gains are window means (the last `window` evaluation points, as every frontier point) of
held-out pass@1 minus the SFT start's over the same points (same keys).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax.records import read_json, write_json
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired.curves import curve_records, window_bootstrap
from sera_jax.studies.paired.prereg import (
    check_preregistration,
    preregistration_path,
    read_preregistration,
)
from sera_jax.studies.paired.spec import MATCH_RULE, eval_steps, is_exploratory, matched_spec
from sera_jax.studies.paired.stages import run_plan
from sera_jax.studies.paired.tables import exploratory_banner, prereg_lines
from sera_jax.studies.paired.validity import require_readable


def matched_lr(points: Sequence[tuple[float, float]], target: float) -> dict[str, Any]:
    """`MATCH_RULE` on (lr, uniform gain) points (any order) and SERA's gain `target`:
    {"lr": float | None, "segment": [lr_lo, lr_hi] the crossing lies in, "reason"}."""
    pts = sorted((float(lr), float(g)) for lr, g in points)
    if not pts or any(lr <= 0 for lr, _ in pts):
        raise ValueError(f"need frontier points with lr > 0; got {pts}")
    if not target > 0:
        return {"lr": None, "segment": None,
                "reason": f"SERA's pass@1 gain {target:+.4f} is not positive: only lr -> 0 "
                          "(the SFT start itself) matches it"}
    lr1, g1 = pts[0]
    if g1 >= target:  # the first segment, linear in lr from (0, 0)
        return {"lr": lr1 * target / g1, "segment": [0.0, lr1], "reason": "crossing"}
    for (a, ga), (b, gb) in zip(pts, pts[1:]):
        if (ga - target) * (gb - target) <= 0 and ga != gb:
            t = (target - ga) / (gb - ga)
            return {"lr": math.exp(math.log(a) + t * (math.log(b) - math.log(a))),
                    "segment": [a, b], "reason": "crossing"}
    return {"lr": None, "segment": None,
            "reason": f"uniform's gain never reaches SERA's {target:+.4f} on the grid (max "
                      f"{max(g for _, g in pts):+.4f}): no extrapolation"}


def choose_matched_lr(frontier_out: dict[str, Any], method: str, base: str,
                      method_lr: float) -> dict[str, Any]:
    """`matched_lr` on a frontier's output: uniform's gains at every lr, SERA's at
    `method_lr` (gain = the point's pass@1 mean − the SFT start's, `frontier_out["sft"]`)."""
    # The rule reads held-out points: beside the primary's split's when that is another.
    sft = frontier_out.get("sft_eval", frontier_out.get("sft"))
    if not sft:
        raise common.StudyError("the frontier output has no SFT start point: re-run "
                                "--stage=frontier (it records it)")
    start = float(sft["pass@1"])
    lrs = [{**e, "points": e.get("points_eval", e["points"])}
           for e in frontier_out["lrs"].values()]
    gains = [(float(e["lr"]), e["points"][base]["pass@1"]["mean"] - start)
             for e in lrs if base in e["points"]]
    at = [e for e in lrs if float(e["lr"]) == float(method_lr) and method in e["points"]]
    if not at:
        raise common.StudyError(f"the frontier has no {method} point at lr {method_lr:g} (the "
                                f"config's): add {method!r} to frontier.methods and the lr to "
                                "frontier.learning_rates, then run --stage=frontier")
    target = at[0]["points"][method]["pass@1"]["mean"] - start
    choice = matched_lr(gains, target)
    return {**choice, "target_gain": target, "uniform_gains": {f"{lr:g}": g for lr, g in gains},
            "start_pass1": start}


def record_choice(cfg: ml_collections.ConfigDict, choice: dict[str, Any]) -> dict[str, Any]:
    """Write the chosen lr into the pre-registration's `lr_matched` before the arm runs; a
    recorded choice that differs (the frontier changed after it) is refused."""
    path = preregistration_path(cfg)
    saved = read_preregistration(path)
    rec = {k: choice[k] for k in ("lr", "segment", "reason", "target_gain", "uniform_gains",
                                  "start_pass1")}
    if "lr_matched" in saved:
        if saved["lr_matched"] != rec:
            raise common.StudyError(
                f"{path} already records the matched lr {saved['lr_matched']['lr']} from "
                f"other frontier numbers ({saved['lr_matched']}); the rule's choice is fixed "
                "once, before the arm runs: use the recorded one's frontier results")
        return saved["lr_matched"]
    saved["lr_matched"] = rec
    write_json(path, saved)
    logging.info("pre-registered the matched lr %s in %s (commit it)", rec["lr"], path)
    return rec


def matched_config(cfg: ml_collections.ConfigDict, lr: float) -> ml_collections.ConfigDict:
    """`cfg` at `lr` with no null and no A/A arm (the baseline only runs there)."""
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.optimizer.learning_rate = float(lr)
    out.compare.null = False
    out.compare.aa = False
    return out


def matched_endpoint(cfg: ml_collections.ConfigDict, workdir: str, mdir: str,
                     seeds: Sequence[int]) -> dict[str, Any]:
    """SERA (workdir, config lr) − uniform (`mdir`, matched lr): `endpoint_from_curves` of
    the runs' curve records."""
    p, base = cfg.compare.primary, cfg.compare.baseline
    a = {s: r for s in seeds if (r := curve_records(cfg, workdir, p.method, s))}
    b = {s: r for s in seeds if (r := curve_records(cfg, mdir, base, s))}
    return endpoint_from_curves(cfg, a, b, seeds)


def endpoint_from_curves(cfg: ml_collections.ConfigDict, a: dict[int, Any],
                         b: dict[int, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """The matched endpoint from {seed: {step: record}} of SERA (`a`) and matched uniform
    (`b`): held-out pass@k over the primary's window, seed-level t
    (`compare.curve_difference`) and the two-level bootstrap (`curves.window_bootstrap`)."""
    p = cfg.compare.primary
    steps = eval_steps(cfg)
    window = min(int(p.window), max(len(steps) - 1, 1))
    both = sorted(s for s in set(a) & set(b) if s in set(seeds) and a[s] and b[s])
    if not both:
        return {"ran": False, "seeds": []}
    n, k = int(cfg.eval.curve_samples), int(p.k)
    ca = np.asarray([[a[s][t]["num_correct"] for t in steps] for s in both])
    cb = np.asarray([[b[s][t]["num_correct"] for t in steps] for s in both])
    d = cmp.curve_difference(ca, cb, n, [1, k], steps, level=float(cfg.compare.level),
                             window=window)
    boot = window_bootstrap(ca, cb, n, k, window, num_resamples=int(cfg.compare.bootstrap),
                            level=float(cfg.compare.level),
                            seed=int(cfg.compare.bootstrap_seed))
    return {"ran": True, "seeds": both, "window_used": window, "estimate": d["window"][str(k)],
            "pass1": d["window"]["1"], "two_level": boot}


def stage_matched(cfg: ml_collections.ConfigDict, workdir: str, mesh=None,
                  seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """Choose the matched lr from `results/frontier.json`, pre-register it, run the arm
    (restricted to `seeds` when given) and write `results/matched.{json,md}`."""
    path = os.path.join(workdir, "results", "frontier.json")
    if not os.path.exists(path):
        raise common.StudyError(f"--stage=matched reads {path}: run --stage=frontier first")
    exploratory = is_exploratory(cfg)
    prereg = ({"found": False, "exploratory": True} if exploratory
              else check_preregistration(cfg, "frontier"))
    validity = require_readable(cfg, os.path.join(workdir, "sft"), "--stage=matched")
    spec = matched_spec(cfg)
    choice = choose_matched_lr(read_json(path), spec["method"], spec["baseline"],
                               spec["method_lr"])
    # An exploratory run has no pre-registration to fix the choice in: it is only reported.
    recorded = choice if exploratory else record_choice(cfg, choice)
    out: dict[str, Any] = {"rule": MATCH_RULE, **spec, "choice": recorded,
                           "preregistration": prereg, "validity": validity,
                           **({"exploratory": True} if exploratory else {})}
    if recorded["lr"] is not None:
        lr = float(recorded["lr"])
        mcfg = matched_config(cfg, lr)
        mdir = os.path.join(workdir, "matched", f"lr{lr:.6g}")
        only = None if seeds is None else {int(s) for s in seeds}
        sft_dir = os.path.join(workdir, "sft")
        run_plan(mcfg, mdir, [(spec["baseline"], spec["seeds"])], mesh, only=only,
                 sft_dir=sft_dir)
        run_plan(cfg, workdir, [(spec["method"], spec["seeds"])], mesh, only=only,
                 sft_dir=sft_dir)  # SERA at the config's lr: the comparison's own runs
        out["dir"] = os.path.relpath(mdir, workdir)
        out["result"] = matched_endpoint(mcfg, workdir, mdir, spec["seeds"])
    results = os.path.join(workdir, "results")
    os.makedirs(results, exist_ok=True)
    write_json(os.path.join(results, "matched.json"), out)
    with open(os.path.join(results, "matched.md"), "w") as f:
        f.write(matched_markdown(out))
    return out


def matched_markdown(out: dict[str, Any]) -> str:
    """The rule, the chosen lr with its inputs, and the endpoint with both intervals."""
    c = out["choice"]
    gains = ", ".join(f"{lr}: {100 * g:+.2f}" for lr, g in c["uniform_gains"].items())
    lines = [exploratory_banner(), ""] if out.get("exploratory") else []
    lines += [f"lr-matched arm. Rule: {out['rule']}.", "",
             f"Uniform's pass@1 gain over the SFT start by lr (pp): {gains}; {out['method']}'s "
             f"at lr {out['method_lr']:g}: {100 * c['target_gain']:+.2f} pp.",
             "Matched lr: " + (f"{c['lr']:.4g} (between {c['segment'][0]:g} and "
                               f"{c['segment'][1]:g})" if c["lr"] is not None
                               else f"none -- {c['reason']}") + "."]
    r = out.get("result")
    if r and r.get("ran"):
        e, b, e1 = r["estimate"], r["two_level"], r["pass1"]
        k = out["endpoint"]["k"]
        band = ("" if e["lo"] is None else
                f" [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}] (seed-level t)")
        lines += ["", f"**{out['endpoint']['comparison']}** on held-out pass@{k}, mean of the "
                  f"last {r['window_used']} points, {len(r['seeds'])} seeds: "
                  f"{100 * e['mean']:+.2f}{band}; two-level bootstrap (seeds and prompts) "
                  f"[{100 * b['lo']:+.2f}, {100 * b['hi']:+.2f}]. Pass@1 difference (the match "
                  f"check): {100 * e1['mean']:+.2f} pp."]
    v = out.get("validity")
    if v:
        lines += ["", f"Task validity: {v['line']}" + (" -- override." if v.get("override")
                                                      else ".")]
    lines += prereg_lines(out.get("preregistration"))
    return "\n".join(lines) + "\n"


__all__ = ["choose_matched_lr", "endpoint_from_curves", "matched_config", "matched_endpoint",
           "matched_lr", "matched_markdown", "record_choice", "stage_matched"]
