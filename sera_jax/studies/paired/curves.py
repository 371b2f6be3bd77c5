"""Maze study statistics over the training curve (`comparison.json` → "curves"): paired Δ(t)
with seed-level bands, the one pre-registered primary endpoint, Holm-adjusted secondary
endpoints, the null gate, the A/A false-positive rate, and per-step diagnostics.

The seed is the unit of inference (`sera_jax.studies.compare.seed_interval`): at every
evaluation point t, `Δ_s(t)` = mean over prompts of the per-prompt pass@k difference of two arms
paired on seed s (both scored with t's keys, as the SFT start: common random numbers), and
the 95 % band is Student t over seeds. An endpoint averages `Δ_s(t)` over the last
`compare.primary.window` points first.

* primary: `compare.primary` (method − baseline, split, k, window), fixed in the config and
  recorded in `<workdir>/preregistered.json` before the first RL run (`preregister`); the
  report refuses a config whose primary differs from the recorded one.
* secondary: every other (method − baseline, split, k) window endpoint on the held-out and
  training prompts, Holm-adjusted. The sealed test split (`eval.test_prompts` > 0) is read
  only by the pre-registered primary endpoint (and, as every split, by the A/A rate): it
  adds no secondary endpoint.
* gate: baseline − null at held-out pass@1 over the same window: 95 % CI above 0 *and* mean
  above `compare.gate_floor_multiple` (2) × the evaluation noise floor at pass@1 (SFT, two
  key sets, curve size). A run that does not learn fails it.
* A/A: `aa` − baseline (the baseline again with another RL seed, the same evaluation keys)
  at every k and every point t > 0 on both splits; false-positive rate = share of those
  cells whose 95 % band excludes 0 (the nominal rate is 5 %; cells are correlated).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from sera_jax import loop
from sera_jax.metrics import analytic_pass_at_k
from sera_jax.records import read_json, read_jsonl, write_json
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired.spec import (
    AA,
    NULL,
    eval_splits,
    eval_steps,
    is_exploratory,
    primary_spec,
    run_dir,
)

PREREGISTERED = "preregistered.json"


def preregister(cfg: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Record the primary endpoint (and, for an exploratory run, that it is one) in
    `<workdir>/preregistered.json` before any RL run, or check the config against the record:
    a changed primary, or a workdir made exploratory run as a pre-registered one (or the
    reverse), raises StudyError (analyse the other endpoint as a secondary one)."""
    path = os.path.join(workdir, PREREGISTERED)
    spec = workdir_spec(cfg)
    if os.path.exists(path):
        saved = read_json(path)
        if saved != spec:
            raise common.StudyError(
                f"compare.primary / baseline / gate {spec} differ from those fixed before the "
                f"runs in {path}: {saved}; the primary endpoint cannot change after the run "
                "(read the other endpoint among the secondary ones, or use a new workdir)")
        return saved
    write_json(path, spec)
    return spec


def workdir_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What `preregister` fixes in a workdir: the primary endpoint (when set) and, for an
    exploratory run, `{"exploratory": True}`."""
    spec = primary_spec(cfg) if cfg.compare.get("primary") is not None else {}
    return {**spec, "exploratory": True} if is_exploratory(cfg) else spec


def curve_records(cfg: ml_collections.ConfigDict, workdir: str, arm: str, seed: int
                  ) -> dict[int, dict[str, Any]] | None:
    """{step: curve-size evaluation record} of one run (the noise-key records left out),
    None unless every point is there."""
    n = int(cfg.eval.curve_samples)
    recs = {r["step"]: r for r in read_jsonl(os.path.join(run_dir(workdir, arm, seed),
                                                          loop.EVAL_RECORDS))
            if r["num_samples"] == n and not r.get("final_only") and not r.get("noise_keys")}
    return recs if all(t in recs for t in eval_steps(cfg)) else None


def _counts(recs: Mapping[int, Mapping[str, Any]], steps: Sequence[int], split: str
            ) -> np.ndarray:
    return np.asarray([(recs[t] if split == "eval" else recs[t][split])["num_correct"]
                       for t in steps], np.int64)


def per_step_diagnostics(allocs: Sequence[Mapping[str, Any]],
                         train: Sequence[Mapping[str, Any]],
                         curve: Mapping[int, Mapping[str, Any]], num_train: int, shift: int
                         ) -> list[dict[str, Any]]:
    """One record per RL step t: `ever_solved` (share of the `num_train` training prompts with
    a success in some training rollout of steps ≤ t), `unsolved_share` (share of step t's
    rollouts on prompts with no success in steps < t), believed κ min/mean (κ(p̂, N), seen
    active prompts) and realised κ min/mean (κ(c/n, N) with c/n the training-prompt
    evaluation at the latest point ≤ t − 1), `mixed_fraction`, and from the trainer's
    records `live_row_fraction`, `generated_tokens`, `active_prompts`, `reward_mean`."""
    by_step = {int(r["step"]): r for r in train}
    points = sorted((s, r["train"]) for s, r in curve.items() if "train" in r)
    solved: set[int] = set()
    out = []
    for a in allocs:
        step = int(a["step"])
        ids, counts = np.asarray(a["prompt_ids"]), np.asarray(a["counts"])
        succ = np.asarray(a["successes"])
        unsolved = np.array([q not in solved for q in ids.tolist()])
        rec: dict[str, Any] = {"step": step,
                               "unsolved_share": float(counts[unsolved].sum() / counts.sum())}
        solved |= {q for q, k in zip(ids.tolist(), succ.tolist()) if k > 0}
        rec["ever_solved"] = len(solved) / num_train
        active = counts > 0
        rec["mixed_fraction"] = float(np.mean((succ[active] > 0) & (succ[active] < counts[active])))
        p_hat = np.array([np.nan if p is None else p for p in a["p_hat"]], np.float64)
        seen = active & np.isfinite(p_hat)
        rec["kappa_believed_min"] = rec["kappa_believed_mean"] = None
        rec["kappa_realised_min"] = rec["kappa_realised_mean"] = None
        if seen.any():
            kb = analytic_pass_at_k(p_hat[seen], np.maximum(counts[seen] - shift, 0))
            rec["kappa_believed_min"] = float(kb.min())
            rec["kappa_believed_mean"] = float(kb.mean())
            before = [tr for s, tr in points if s <= step - 1]
            if before:
                c = np.asarray(before[-1]["num_correct"])
                covered = seen & (ids < c.size)
                if covered.any():
                    kt = analytic_pass_at_k(c[ids[covered]] / before[-1]["num_samples"],
                                            np.maximum(counts[covered] - shift, 0))
                    rec["kappa_realised_min"] = float(kt.min())
                    rec["kappa_realised_mean"] = float(kt.mean())
        t = by_step.get(step, {})
        for field in ("live_row_fraction", "generated_tokens", "active_prompts", "reward_mean"):
            rec[field] = t.get(field)
        out.append(rec)
    return out


def _mean_series(runs: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, list]:
    """Per-step mean over seeds of every diagnostic (None where no seed defines it)."""
    if not runs:
        return {}
    length = min(len(r) for r in runs)
    out: dict[str, list] = {"step": [runs[0][i]["step"] for i in range(length)]}
    for field in runs[0][0] if length else ():
        if field == "step":
            continue
        col = []
        for i in range(length):
            vals = [r[i][field] for r in runs if r[i][field] is not None]
            col.append(float(np.mean(vals)) if vals else None)
        out[field] = col
    return out


def _outcome(e: Mapping[str, Any]) -> str:
    if e.get("lo") is None:
        return "undetermined (fewer than 2 paired seeds)"
    return "positive" if e["lo"] > 0 else "negative" if e["hi"] < 0 else "inconclusive"


def curve_statistics(cfg: ml_collections.ConfigDict, methods: Sequence[str],
                     recs: Mapping[str, Mapping[int, Mapping[int, Mapping[str, Any]]]],
                     sft_curve: Mapping[int, Mapping[str, Any]],
                     noise_floor_curve: Mapping[str, Mapping[str, Any]],
                     diagnostics: Mapping[str, Mapping[str, list]],
                     preregistered: bool = False) -> dict[str, Any]:
    """The curve half of `comparison.json` (module docstring), a pure function of counts.

    `recs`: {arm: {seed: {step: curve-size evaluation record}}} of the runs with every point
    (`curve_records`); `sft_curve`: {step: SFT record at curve size with that point's keys};
    `noise_floor_curve`: `compare.noise_floor` on held-out prompts at curve size;
    `diagnostics`: {arm: {str(seed): per_step_diagnostics}}; `preregistered`: whether the
    primary endpoint was recorded before the runs.

    The primary endpoint carries two intervals: `estimate`, the seed-level Student t
    interval of the per-seed window means (prompts, keys and the start held fixed), and
    `two_level`, the paired bootstrap of `compare.paired_bootstrap` on the per-seed per-prompt
    window-mean differences `d[s, m]` (each resample draws the seeds and, once for all
    seeds, the held-out prompts with replacement; `compare.bootstrap` resamples, percentile
    interval): the prompt sample's variation included. Its `verdict` (`compare.judge` of
    `estimate`) reads the pre-registered rule, the seed-level t interval (`outcome`; no
    noise floor: that is the unpaired comparison's, and the paired seeds' interval already
    holds the evaluation noise that does not cancel): better / worse when it lies clear of
    0; equivalent within ±`compare.margin` when that margin is registered and the paired
    TOST (the 90 % t interval for the default 95 % level) lies inside it; else
    inconclusive. `mde`: the smallest difference the seed count detects with 80 % power
    (per-seed sd of the window differences).
    """
    steps = eval_steps(cfg)
    n, level = int(cfg.eval.curve_samples), float(cfg.compare.level)
    spec = primary_spec(cfg)
    ks = sorted(set(cmp.ks_for(n)) | {spec["k"]})
    window = min(spec["window"], max(len(steps) - 1, 1))  # a shorter run: the points it has
    splits = eval_splits(cfg)
    recs = {arm: dict(runs) for arm, runs in recs.items()}
    out: dict[str, Any] = {
        "steps": steps, "num_samples": n, "ks": ks, "band_method": (
            f"seed is the unit: per-seed Δ_s(t) = mean over prompts of the per-prompt pass@k "
            f"difference (both arms scored with point t's keys); {100 * level:.0f} % band = "
            f"Student t over the paired seeds, mean ± t_(S−1)·sd/√S; endpoints average "
            f"Δ_s(t) over the last {window} points first"),
        "per_seed": {}, "sft": {}, "differences": {}}
    for split in splits:
        counts = _counts(sft_curve, steps, split)
        v = cmp.per_prompt_pass_at_k(counts, n, ks).mean(axis=-1)  # [K, T]
        out["sft"][split] = {
            "pass_at_k": {str(k): v[i].tolist() for i, k in enumerate(ks)},
            "bootstrap_pass_at_k": {str(k): [cmp.bootstrap_pass_at_k(c, n, [k])[str(k)]
                                             for c in counts] for k in ks}}
    for arm, runs in recs.items():
        out["per_seed"][arm] = {}
        for seed, r in runs.items():
            entry = {}
            for split in splits:
                counts = _counts(r, steps, split)
                v = cmp.per_prompt_pass_at_k(counts, n, ks).mean(axis=-1)
                entry[split] = {
                    "pass_at_k": {str(k): v[i].tolist() for i, k in enumerate(ks)},
                    "bootstrap_pass_at_k": {str(k): [cmp.bootstrap_pass_at_k(c, n, [k])[str(k)]
                                                     for c in counts] for k in ks}}
            out["per_seed"][arm][str(seed)] = entry

    def diff(a: str, b: str) -> dict[str, Any] | None:
        if b == "SFT":
            seeds = sorted(recs.get(a, {}))
            pair = [(recs[a][s], sft_curve) for s in seeds]
        else:
            seeds = sorted(set(recs.get(a, {})) & set(recs.get(b, {})))
            pair = [(recs[a][s], recs[b][s]) for s in seeds]
        if not seeds:
            return None
        res = {"seeds": seeds}
        for split in splits:
            ca = np.stack([_counts(x, steps, split) for x, _ in pair])
            cb = np.stack([_counts(y, steps, split) for _, y in pair])
            res[split] = cmp.curve_difference(ca, cb, n, ks, steps, level=level, window=window)
        return res

    base = spec["baseline"]
    arms_present = [a for a in recs if recs[a]]
    pairs = [(m, base) for m in methods if m != base]
    pairs += [(m, NULL) for m in methods if NULL in recs]
    pairs += [(AA, base)] if AA in recs else []
    pairs += [(a, "SFT") for a in arms_present]
    for a, b in pairs:
        d = diff(a, b)
        if d is not None:
            out["differences"][f"{a} − {b}"] = d

    name = f"{spec['method']} − {base}"
    prim = out["differences"].get(name, {}).get(spec["split"])
    out["primary"] = {**spec, "window_used": window, "comparison": name,
                      "preregistered": bool(preregistered),
                      "estimate": None if prim is None else prim["window"][str(spec["k"])],
                      "two_level": None}
    if prim is not None:
        seeds = sorted(set(recs[spec["method"]]) & set(recs[base]))
        ca = np.stack([_counts(recs[spec["method"]][s], steps, spec["split"]) for s in seeds])
        cb = np.stack([_counts(recs[base][s], steps, spec["split"]) for s in seeds])
        out["primary"]["two_level"] = window_bootstrap(
            ca, cb, n, spec["k"], window, num_resamples=int(cfg.compare.bootstrap),
            level=level, seed=int(cfg.compare.bootstrap_seed))
    out["primary"]["outcome"] = ("not run" if prim is None
                                 else _outcome(out["primary"]["estimate"]))
    out["primary"]["margin"] = cfg.compare.get("margin")
    if prim is not None:  # verdict, TOST against compare.margin, MDE (compare.judge)
        out["primary"].update(cmp.judge(out["primary"]["estimate"], cfg.compare.get("margin"),
                                        None, level))
    raw = {}
    for m in methods:
        d = out["differences"].get(f"{m} − {base}")
        for split in [s for s in splits if s != "test"] if d else ():
            for k in ks:  # the sealed test split answers the primary endpoint only
                key = f"{m} − {base} | {split} | pass@{k}"
                if key != f"{name} | {spec['split']} | pass@{spec['k']}":
                    raw[key] = d[split]["window"][str(k)]
    adjusted = cmp.holm({key: e["p"] for key, e in raw.items()})
    alpha = 1 - level
    out["secondary"] = {"correction": f"Holm step-down over the {len(raw)} endpoints below "
                        f"(family-wise error <= {alpha:.2f}); p from the seed-level t test",
                        "endpoints": {key: {**e, "p_holm": adjusted[key],
                                            "significant": adjusted[key] is not None and
                                            adjusted[key] <= alpha}
                                      for key, e in raw.items()}}
    gate_diff, one_seed = out["differences"].get(f"{base} − {NULL}"), None
    if gate_diff is not None and len(gate_diff["seeds"]) < 2:
        # One paired seed has no seed-level band: the gate reads the bootstrap over held-out
        # prompts instead (evaluation noise only), and says so.
        seeds = gate_diff["seeds"]
        one_seed = window_bootstrap(
            np.stack([_counts(recs[base][s], steps, "eval") for s in seeds]),
            np.stack([_counts(recs[NULL][s], steps, "eval") for s in seeds]), n, 1, window,
            num_resamples=int(cfg.compare.bootstrap), level=level,
            seed=int(cfg.compare.bootstrap_seed))
    out["gate"] = null_gate(gate_diff, noise_floor_curve, float(cfg.compare.gate_floor_multiple),
                            prompts_ci=one_seed)
    out["aa"] = aa_false_positive_rate(out["differences"].get(f"{AA} − {base}"), splits, ks)
    diags = {arm: dict(d) for arm, d in diagnostics.items()}
    means = {arm: _mean_series([r for r in d.values() if r]) for arm, d in diags.items()}
    out["diagnostics"] = {"per_seed": diags, "mean_over_seeds": means}
    return out


def window_bootstrap(correct_a: Any, correct_b: Any, n: int, k: int, window: int, *,
                     num_resamples: int = 2000, level: float = 0.95, seed: int = 0
                     ) -> dict[str, Any]:
    """Two-level bootstrap of a window endpoint: counts `[S, T, M]` of arms A and B (seed s
    paired, point t of both with t's keys) -> per-seed per-prompt `d[s, m]` = mean over the
    last `window` points of the per-prompt pass@k difference -> `compare.paired_bootstrap`
    (resample seeds, and prompts once for all seeds; percentile interval)."""
    a, b = np.asarray(correct_a, np.int64), np.asarray(correct_b, np.int64)
    v = cmp.per_prompt_pass_at_k(a, n, [k])[0] - cmp.per_prompt_pass_at_k(b, n, [k])[0]
    d = v[:, -int(window):, :].mean(axis=1)  # [S, M]
    out = cmp.paired_bootstrap(d, num_resamples=num_resamples, level=level, seed=seed)
    out["method"] = (f"two-level bootstrap: {num_resamples} resamples of seeds and held-out "
                     f"prompts (the same prompt draw for every seed), {100 * level:.0f} % "
                     "percentile interval of the mean window difference")
    return out


def null_gate(d: Mapping[str, Any] | None, floor: Mapping[str, Mapping[str, Any]],
              multiple: float, prompts_ci: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Baseline − null at held-out pass@1 over the endpoint window: passes iff its band lies
    above 0 and its mean exceeds `multiple` × the noise floor at pass@1 (the RL signal must
    stand clear of both optimiser noise and evaluation noise).

    With one paired seed there is no seed-level band; `prompts_ci` (the bootstrap over
    held-out prompts of `window_bootstrap`) then stands in, and `ci` says which it is: a
    one-seed pass shows that run learned beyond the null and the evaluation noise, not that
    another seed would."""
    if d is None or "eval" not in d:
        return {"ran": False, "passes": False, "outcome": "FAIL: the null control did not run"}
    e = dict(d["eval"]["window"]["1"])
    ci = "seed-level Student t band"
    if e["lo"] is None and prompts_ci is not None:
        e.update(lo=prompts_ci["lo"], hi=prompts_ci["hi"], p=None)
        ci = "one seed: bootstrap over held-out prompts (evaluation noise only)"
    f = float(floor["1"]["floor"])
    above = e["lo"] is not None and e["lo"] > 0
    clear = e["mean"] > multiple * f
    outcome = ("PASS" if above and clear else "FAIL") + (
        f": baseline − null at held-out pass@1 = {100 * e['mean']:+.2f} pp" +
        (f" [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}]" if e["lo"] is not None
         else " (no CI: fewer than 2 paired seeds)") +
        (f" ({ci})" if prompts_ci is not None and e["lo"] is not None else "") +
        f", {multiple:g} × noise floor = {100 * multiple * f:.2f} pp")
    return {"ran": True, "seeds": d["seeds"], **{k: e[k] for k in ("mean", "lo", "hi", "p")},
            "noise_floor": f, "floor_multiple": multiple, "ci_above_zero": bool(above),
            "exceeds_floor": bool(clear), "passes": bool(above and clear), "outcome": outcome,
            "ci": ci}


def aa_false_positive_rate(d: Mapping[str, Any] | None, splits: Sequence[str],
                           ks: Sequence[int]) -> dict[str, Any]:
    """Share of (split, k, point t > 0) cells of the A/A difference whose band excludes 0;
    None when the A/A arm did not run or has fewer than 2 paired seeds."""
    if d is None:
        return {"ran": False, "false_positive_rate": None}
    cells, hits, per_split = 0, 0, {}
    for split in splits:
        c = h = 0
        for k in ks:
            for e in d[split]["points"][str(k)]:
                if e["step"] == 0 or e["lo"] is None:
                    continue  # step 0: both arms are the SFT start (Δ = 0 exactly)
                c += 1
                h += int(cmp.excludes_zero(e))
        per_split[split] = h / c if c else None
        cells, hits = cells + c, hits + h
    return {"ran": True, "seeds": d["seeds"], "cells": cells, "false_positives": hits,
            "false_positive_rate": hits / cells if cells else None, "per_split": per_split,
            "note": "cells are points t > 0 × k × split; nominal rate 1 − level, but cells "
                    "of one run are correlated, so the rate is noisy"}


__all__ = ["PREREGISTERED", "aa_false_positive_rate", "curve_records", "curve_statistics",
           "null_gate", "per_step_diagnostics", "preregister", "window_bootstrap"]
