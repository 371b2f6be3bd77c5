"""Maze study report: finished runs -> `results/comparison.{json,md}` (pass@k per method,
paired differences with CIs, noise floor, null control, allocator diagnostics)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop
from sera_jax.metrics import analytic_pass_at_k
from sera_jax.records import read_json, read_jsonl, write_json
from sera_jax.rl import config as rl_config
from sera_jax.studies import compare as cmp
from sera_jax.studies.maze.curves import PREREGISTERED, curve_statistics, preregister
from sera_jax.studies.maze.evaluation import sft_points
from sera_jax.studies.maze.figures import plot_comparison, plot_delta_curves
from sera_jax.studies.maze.setup import ALLOC_RECORDS, NULL, arms, eval_steps, run_config, run_dir


def ks_curve(cfg: ml_collections.ConfigDict) -> list[int]:
    """The ks of the curve statistics: powers of 2 up to eval.curve_samples, plus the
    primary k."""
    ks = set(cmp.ks_for(int(cfg.eval.curve_samples)))
    if cfg.compare.get("primary") is not None:
        ks.add(int(cfg.compare.primary.k))
    return sorted(ks)


def _final_eval(records: list[dict], num_steps: int, num_samples: int) -> dict | None:
    for r in records:
        if r["step"] == num_steps and r["num_samples"] == num_samples and not r.get("curve"):
            return r
    return None


def _mean_spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    v = np.asarray(values, np.float64)
    return (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, float(v.min()),
            float(v.max()))


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {**dict(zip(("mean", "std", "min", "max"), _mean_spread(values))),
            "values": [float(v) for v in values]}


def allocation_diagnostics(allocs: list[dict], curve: list[dict], shift: int
                           ) -> dict[str, float | None]:
    """What the allocator believed and what was true, averaged over steps.

    Step t's batch was sampled by the policy of step t − 1; its true per-maze success rate
    is taken from the training-maze evaluation at the latest evaluation point <= t − 1
    (`p = c/n`). Over the active prompts with an estimate: believed κ = κ(p̂_q, N_q),
    realised κ = κ(p_q, N_q), `κ(p, N) = 1 − (1 − p)^(N − shift)`; per step the min and the
    mean, then the mean over steps (`kappa_true_min_solvable`: the min over mazes with
    p > 0, since a maze the policy never solves has κ = 0 whatever its N). Also: the share
    of all generated rollouts spent on mazes never solved by any of the run's training
    rollouts, and the mean fraction of mixed groups.
    """
    points = sorted((r["step"], r["train"]) for r in curve if "train" in r)
    believed_min, believed_mean, true_min, true_mean, solvable_min = [], [], [], [], []
    total, successes, spent = 0, {}, {}
    mixed = []
    for a in allocs:
        ids = np.asarray(a["prompt_ids"])
        counts = np.asarray(a["counts"])
        succ = np.asarray(a["successes"])
        total += int(counts.sum())
        for q, n_q, k_q in zip(ids.tolist(), counts.tolist(), succ.tolist()):
            spent[q] = spent.get(q, 0) + n_q
            successes[q] = successes.get(q, 0) + k_q
        active = counts > 0
        mixed.append(float(np.mean((succ[active] > 0) & (succ[active] < counts[active]))))
        p_hat = np.array([np.nan if p is None else p for p in a["p_hat"]], np.float64)
        seen = active & np.isfinite(p_hat)
        if not seen.any():
            continue
        k_b = analytic_pass_at_k(p_hat[seen], np.maximum(counts[seen] - shift, 0))
        believed_min.append(float(k_b.min()))
        believed_mean.append(float(k_b.mean()))
        before = [tr for s, tr in points if s <= a["step"] - 1]
        if before:
            tr = before[-1]
            c = np.asarray(tr["num_correct"])
            covered = seen & (ids < c.size)
            if covered.any():
                p_true = c[ids[covered]] / tr["num_samples"]
                k_t = analytic_pass_at_k(p_true, np.maximum(counts[covered] - shift, 0))
                true_min.append(float(k_t.min()))
                true_mean.append(float(k_t.mean()))
                if (p_true > 0).any():
                    solvable_min.append(float(k_t[p_true > 0].min()))
    never = sum(spent[q] for q in spent if successes[q] == 0)
    mean = lambda v: float(np.mean(v)) if v else None  # noqa: E731
    return {"kappa_believed_min": mean(believed_min), "kappa_believed_mean": mean(believed_mean),
            "kappa_true_min": mean(true_min), "kappa_true_mean": mean(true_mean),
            "kappa_true_min_solvable": mean(solvable_min),
            "mixed_fraction": mean(mixed),
            "never_solved_share": float(never / total) if total else None,
            "never_solved_mazes": int(sum(successes[q] == 0 for q in successes))}


def aggregate(cfg: ml_collections.ConfigDict, workdir: str, methods: Sequence[str],
              seeds: Sequence[int], sft_dir: str | None = None, mesh=None,
              plots: bool = True, results_dir: str | None = None,
              arm_configs: Mapping[str, ml_collections.ConfigDict] | None = None,
              curve_analysis: bool = True) -> dict[str, Any]:
    """Collect finished runs -> `results/comparison.{json,md}` and figures; returns the dict.

    `arm_configs` (the regime's θ axis): per-method configs where they differ from `cfg`.
    `curve_analysis` (off for the regime's cells, evaluated at the end only): with
    `compare.primary` set, the statistics of the training curve (`curves`).

    Spread = sample standard deviation over seeds (and min / max in the JSON). Paired
    differences and CIs: `sera_jax.studies.compare` (the SFT start is scored with the keys
    of the final point, like every RL row). The comparison is `valid` only when the null
    control ran and stays within the noise floor of SFT at every k.
    """
    sft_dir = sft_dir or os.path.join(workdir, "sft")
    results_dir = results_dir or os.path.join(workdir, "results")
    os.makedirs(results_dir, exist_ok=True)
    sft_eval = read_json(os.path.join(sft_dir, "eval.json"))
    num_steps, n = int(cfg.rl.num_steps), int(cfg.eval.num_samples)
    points = sft_points(cfg, sft_dir, mesh)
    sft_final = points[(num_steps, n, int(cfg.eval.seed))]
    sft_noise = points[(num_steps, n, int(cfg.eval.noise_seed))]
    ks = cmp.ks_for(n)
    boot = dict(num_resamples=int(cfg.compare.bootstrap), level=float(cfg.compare.level),
                seed=int(cfg.compare.bootstrap_seed))
    table: dict[str, Any] = {
        "sft": {"pass_at_k": sft_final["pass_at_k"],
                "train_pass_at_k": sft_final.get("train", {}).get("pass_at_k"),
                "pass_at_k_noise_keys": sft_noise["pass_at_k"],
                "pass1_distribution": sft_eval["pass1_distribution"],
                "curve": {str(s): points[(s, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
                          ["pass_at_k"] for s in eval_steps(cfg)}},
        "methods": {}, "num_samples": n, "num_steps": num_steps,
        "num_prompts": {"eval": len(sft_final["num_correct"]),
                        "train": len(sft_final.get("train", {}).get("num_correct", []))},
        "baseline": cfg.compare.baseline,
        "ci_method": (f"paired bootstrap over mazes and seeds: {cfg.compare.bootstrap} "
                      f"resamples, each drawing the seeds and the mazes with replacement (the "
                      f"same mazes for every seed), {100 * cfg.compare.level:.0f} % "
                      f"percentile interval of the mean per-maze pass@k difference; every "
                      f"policy at a point is scored with that point's keys"),
        "noise_floor": {"eval": cmp.noise_floor(sft_final["num_correct"],
                                                sft_noise["num_correct"], n, ks, **boot)}}
    if "train" in sft_final:
        table["noise_floor"]["train"] = cmp.noise_floor(
            sft_final["train"]["num_correct"], sft_noise["train"]["num_correct"], n, ks, **boot)
    curves: dict[str, list[list[dict]]] = {}
    correct: dict[str, dict[int, dict[str, list[int]]]] = {}
    shifts: dict[str, int] = {}
    for arm, arm_seeds in arms(cfg, methods, seeds):
        runs = []
        curves[arm], correct[arm] = [], {}
        shift = rl_config.method(run_config((arm_configs or {}).get(arm, cfg), arm, 0)
                                 ).kappa_shift
        shifts[arm] = shift
        for seed in arm_seeds:
            d = run_dir(workdir, arm, seed)
            evals = read_jsonl(os.path.join(d, loop.EVAL_RECORDS))
            final = _final_eval(evals, num_steps, n)
            if final is None:
                logging.warning("%s seed %d has no final evaluation; left out", arm, seed)
                continue
            train = read_jsonl(os.path.join(d, loop.TRAIN_RECORDS))
            curve = [r for r in evals if not r.get("final_only")]
            diag = allocation_diagnostics(read_jsonl(os.path.join(d, ALLOC_RECORDS)), curve,
                                          shift)
            runs.append({"seed": seed, "final": final, "rollouts": final["rollouts"],
                         "tokens": final["tokens"],
                         "reward_mean_last": float(np.mean([r["reward_mean"]
                                                            for r in train[-5:]])), **diag})
            curves[arm].append(curve)
            correct[arm][seed] = {"eval": final["num_correct"],
                                  "train": final.get("train", {}).get("num_correct")}
        if not runs:
            continue
        entry = {"seeds": [r["seed"] for r in runs], "pass_at_k": {}, "train_pass_at_k": {}}
        for k in runs[0]["final"]["pass_at_k"]:
            entry["pass_at_k"][k] = _summary([r["final"]["pass_at_k"][k] for r in runs])
            if "train" in runs[0]["final"]:
                entry["train_pass_at_k"][k] = _summary([r["final"]["train"]["pass_at_k"][k]
                                                        for r in runs])
        for field in ("rollouts", "tokens", "reward_mean_last", "kappa_believed_min",
                      "kappa_believed_mean", "kappa_true_min", "kappa_true_mean",
                      "kappa_true_min_solvable", "mixed_fraction", "never_solved_share",
                      "never_solved_mazes"):
            vals = [r[field] for r in runs]
            entry[field] = _summary(vals) if all(v is not None for v in vals) else None
        table["methods"][arm] = entry

    sft_c = {"eval": sft_final["num_correct"], "train": sft_final.get("train", {}).get(
        "num_correct")}
    table["paired"], table["vs_sft"] = {}, {}
    base = cfg.compare.baseline
    for arm in table["methods"]:
        table["vs_sft"][arm] = {}
        for split in ("eval", "train"):
            if sft_c[split] is None:
                continue
            s_ids = sorted(correct[arm])
            table["vs_sft"][arm][split] = cmp.paired_difference(
                [correct[arm][s][split] for s in s_ids], [sft_c[split]] * len(s_ids), n, ks,
                **boot)
        if arm in (base, NULL) or base not in correct:
            continue
        common_seeds = sorted(set(correct[arm]) & set(correct[base]))
        if not common_seeds:
            continue
        table["paired"][arm] = {"seeds": common_seeds}
        for split in ("eval", "train"):
            if sft_c[split] is None:
                continue
            diff = cmp.paired_difference([correct[arm][s][split] for s in common_seeds],
                                         [correct[base][s][split] for s in common_seeds], n,
                                         ks, **boot)
            floors = table["noise_floor"][split]
            for k, e in diff.items():
                e["floor"] = floors[k]["floor"]
                e["verdict"] = cmp.verdict(e, floors[k]["floor"])
            table["paired"][arm][split] = diff
    null = table["vs_sft"].get(NULL, {}).get("eval")
    if null is None:
        table["null_control"] = {"ran": False}
        table["valid"] = False
    else:
        within = cmp.within_floor(null, table["noise_floor"]["eval"])
        table["null_control"] = {"ran": True, "within_floor": within,
                                 "passes": bool(all(within.values()))}
        table["valid"] = table["null_control"]["passes"]
    if curve_analysis and cfg.compare.get("primary") is not None:
        # The long-horizon analysis: the gate is "RL beats the null by a clear margin"
        # (curves.null_gate); staying within the SFT noise floor stays a diagnostic above.
        if os.path.exists(os.path.join(workdir, PREREGISTERED)):
            preregister(cfg, workdir)  # refuses a primary endpoint changed after the run
        c_n = int(cfg.eval.curve_samples)
        sft_curve = {s: points[(s, c_n, int(cfg.eval.seed))] for s in eval_steps(cfg)}
        floor_curve = cmp.noise_floor(points[(num_steps, c_n, int(cfg.eval.seed))]["num_correct"],
                                      points[(num_steps, c_n, int(cfg.eval.noise_seed))]
                                      ["num_correct"], c_n, ks_curve(cfg), **boot)
        table["noise_floor_curve"] = floor_curve
        table["bootstrap_pass_at_k"] = {
            "note": "with-replacement bootstrap pass@k of the published maze evaluation (its "
                    "expectation 1 − (1 − c/n)^k), beside the unbiased pass_at_k; biased low",
            "sft": cmp.bootstrap_pass_at_k(sft_final["num_correct"], n, ks),
            "methods": {arm: {str(r): cmp.bootstrap_pass_at_k(correct[arm][r]["eval"], n, ks)
                              for r in correct[arm]} for arm in table["methods"]}}
        table["curves"] = curve_statistics(
            cfg, workdir, methods, {arm: e["seeds"] for arm, e in table["methods"].items()},
            sft_curve, floor_curve, shifts)
        table["gate"] = table["curves"]["gate"]
        table["primary"] = table["curves"]["primary"]
        table["aa"] = table["curves"]["aa"]
        table["valid"] = bool(table["gate"]["passes"])
    write_json(os.path.join(results_dir, "comparison.json"), table)
    md = comparison_markdown(table)
    with open(os.path.join(results_dir, "comparison.md"), "w") as f:
        f.write(md)
    if plots:
        plot_comparison(table, curves, sft_eval, results_dir)
        if "curves" in table:
            plot_delta_curves(table, results_dir)
    return table


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f}"


def comparison_markdown(table: dict[str, Any]) -> str:
    """The pass@k table (percent, mean ± std over seeds) with matched rollouts / tokens, the
    paired differences with CIs and verdicts, the noise floor, the null control and the
    allocator diagnostics."""
    ks = list(table["sft"]["pass_at_k"])
    n_steps = table["num_steps"]
    head = "| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + \
        " | generated rollouts | generated tokens |"
    lines = [head, "|" + "---|" * (len(ks) + 4)]
    lines.append(f"| SFT (start, step-{n_steps} keys) | – | " + " | ".join(
        _pct(table["sft"]["pass_at_k"][k]) for k in ks) + " | 0 | 0 |")
    for method, e in table["methods"].items():
        cells = [f"{_pct(e['pass_at_k'][k]['mean'])} ± {_pct(e['pass_at_k'][k]['std'])}"
                 if k in e["pass_at_k"] else "–" for k in ks]
        lines.append(f"| {method} | {len(e['seeds'])} | " + " | ".join(cells) +
                     f" | {e['rollouts']['mean']:,.0f} | {e['tokens']['mean']:,.0f} ± "
                     f"{e['tokens']['std']:,.0f} |")
    lines.append("")
    lines.append(f"Held-out mazes ({table['num_prompts']['eval']}), n = "
                 f"{table['num_samples']} samples per maze at the final step ({n_steps} RL "
                 "steps), every row scored with the same keys; mean ± sample std over seeds, "
                 "percent.")
    floor = table["noise_floor"]
    for split in ("eval", "train"):
        if split not in floor:
            continue
        name = "held-out" if split == "eval" else "training"
        lines += ["", f"**Paired differences on {name} mazes** (percentage points, mean "
                  f"[95 % CI]; noise floor = one policy, two key sets):", "",
                  "| comparison | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "|" + "---|" * (len(ks) + 1),
                  "| noise floor (SFT, keys A − keys B) | " + " | ".join(
                      f"{_pct(floor[split][k]['diff'])} (±{_pct(floor[split][k]['floor'])})"
                      for k in ks) + " |"]
        for arm, p in table.get("paired", {}).items():
            if split in p:
                lines.append(f"| {arm} − {table['baseline']} ({len(p['seeds'])} seeds) | " +
                             " | ".join(_ci(p[split][k]) + f" {_short(p[split][k]['verdict'])}"
                                        for k in ks) + " |")
        for arm, p in table.get("vs_sft", {}).items():
            if split in p:
                lines.append(f"| {arm} − SFT | " + " | ".join(_ci(p[split][k]) for k in ks) +
                             " |")
    nc = table["null_control"]
    lines.append("")
    if not nc["ran"]:
        lines.append("Null control: **not run** -- the comparison is not a result.")
    else:
        bad = [k for k, ok in nc["within_floor"].items() if not ok]
        lines.append("Null control (uniform, rewards shuffled within each batch): " + (
            "within the noise floor of SFT at every k -- the comparison stands." if nc["passes"]
            else f"**outside the noise floor of SFT at k = {', '.join(bad)}**: optimiser "
            "noise alone moves the policy that far, so the comparison is *not* reported as a "
            "result."))
    lines += ["", "**What the allocator did** (mean over steps, then mean ± std over seeds):",
              "", "| method | κ_min believed | κ_min realised | κ_min realised (p > 0) | "
              "κ_mean believed | κ_mean realised | mixed groups | budget on never-solved "
              "mazes | training reward |", "|---|---|---|---|---|---|---|---|---|"]
    for method, e in table["methods"].items():
        def f(field: str, e: dict = e) -> str:
            v = e.get(field)
            return "–" if v is None else f"{v['mean']:.2f} ± {v['std']:.2f}"

        lines.append(f"| {method} | {f('kappa_believed_min')} | {f('kappa_true_min')} | "
                     f"{f('kappa_true_min_solvable')} | "
                     f"{f('kappa_believed_mean')} | {f('kappa_true_mean')} | "
                     f"{f('mixed_fraction')} | {f('never_solved_share')} | "
                     f"{f('reward_mean_last')} |")
    lines += ["", f"CIs: {table['ci_method']}. A difference is a win or a loss only when its "
              "CI excludes 0 and it exceeds the noise floor; otherwise it is no difference."]
    if "curves" in table:
        lines += ["", *curves_markdown(table)]
    return "\n".join(lines) + "\n"


def _band(e: dict[str, Any]) -> str:
    if e.get("lo") is None:
        return f"{100 * e['mean']:+.1f} (1 seed)"
    return f"{100 * e['mean']:+.1f} [{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}]"


def curves_markdown(table: dict[str, Any]) -> list[str]:
    """The curve analysis: primary endpoint, gate, A/A, Δ(t) tables, Holm secondaries."""
    cur, prim, gate, aa = table["curves"], table["primary"], table["gate"], table["aa"]
    ks = cur["ks"]
    est = prim["estimate"]
    p_text = "–" if est is None or est["p"] is None else f"{est['p']:.3g}"
    out = ["## Over the training curve", "", f"Bands: {cur['band_method']}.", "",
           f"**Primary endpoint** (fixed in the config before the run"
           f"{'' if prim['preregistered'] else '; NOT pre-registered in this workdir'}): "
           f"{prim['comparison']} on {'held-out' if prim['split'] == 'eval' else 'training'} "
           f"pass@{prim['k']}, mean of the last {prim['window_used']} points: " +
           ("not run" if est is None else f"{_band(est)} pp, p = {p_text}") +
           f" -- **{prim['outcome']}**.", "",
           f"**Gate** (uniform − null at held-out pass@1 over the same window, CI above 0 and "
           f"> {table['gate'].get('floor_multiple', 2):g} × noise floor): {gate['outcome']}.",
           "", "**A/A control** (the baseline twice, different RL seeds, same evaluation "
           "keys): " + ("not run" if not aa["ran"] or aa["false_positive_rate"] is None else
                        f"{aa['false_positives']} of {aa['cells']} (point, k, split) cells "
                        f"exclude 0: false-positive rate {100 * aa['false_positive_rate']:.1f} %"
                        " (nominal 5 %)") + "."]
    for split in ("eval", "train"):
        rows = [(name, d[split]) for name, d in cur["differences"].items()
                if split in d and not name.endswith("SFT")]
        if not rows:
            continue
        out += ["", f"Δ(t) on {'held-out' if split == 'eval' else 'training'} mazes at the "
                f"last point (pp, mean [95 % band over seeds]):", "",
                "| comparison | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                "|" + "---|" * (len(ks) + 2)]
        for name, d in rows:
            out.append(f"| {name} | {d['points']['1'][-1]['seeds']} | " + " | ".join(
                _band(d["points"][str(k)][-1]) for k in ks) + " |")
    out += ["", "Held-out pass@k at the last point, unbiased / with-replacement bootstrap (the "
            "published maze evaluation's estimator, biased low; for comparison with published "
            "figures only), percent, mean over seeds:", "",
            "| policy | " + " | ".join(f"pass@{k}" for k in ks) + " |",
            "|" + "---|" * (len(ks) + 1)]
    rows = [("SFT", [cur["sft"]["eval"]])] + [
        (arm, [v["eval"] for v in runs.values()]) for arm, runs in cur["per_seed"].items()]
    for name, runs in rows:
        if runs:
            out.append(f"| {name} | " + " | ".join(
                f"{100 * np.mean([r['pass_at_k'][str(k)][-1] for r in runs]):.1f} / "
                f"{100 * np.mean([r['bootstrap_pass_at_k'][str(k)][-1] for r in runs]):.1f}"
                for k in ks) + " |")
    sec = cur["secondary"]
    hits = [k for k, e in sec["endpoints"].items() if e["significant"]]
    out += ["", f"Secondary endpoints: {sec['correction']}; significant after Holm: "
            f"{', '.join(hits) if hits else 'none'}."]
    return out


def _ci(e: dict[str, float]) -> str:
    return f"{100 * e['mean']:+.1f} [{100 * e['lo']:+.1f}, {100 * e['hi']:+.1f}]"


def _short(verdict: str) -> str:
    return {"better": "▲", "worse": "▼"}.get(verdict, "=")
