"""Maze study report: finished runs -> `results/comparison.{json,md}` (pass@k per method,
paired differences with CIs, noise floor, null control, allocator diagnostics)."""

from __future__ import annotations

import copy
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
from sera_jax.studies.paired import outcomes
from sera_jax.studies.paired.curves import (
    PREREGISTERED,
    curve_records,
    curve_statistics,
    per_step_diagnostics,
    preregister,
)
from sera_jax.studies.paired.evaluation import sft_points, start_temperature_rows
from sera_jax.studies.paired.figures import plot_comparison, plot_delta_curves
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.mechanism import write_summary as write_mechanism
from sera_jax.studies.paired.prereg import (
    check_primary,
    preregistration_path,
    read_preregistration,
)
from sera_jax.studies.paired.spec import (
    AA,
    ALLOC_RECORDS,
    NULL,
    SPLITS,
    arms,
    build_task,
    eval_splits,
    eval_steps,
    is_exploratory,
    run_config,
    run_dir,
)
from sera_jax.studies.paired.tables import comparison_markdown
from sera_jax.studies.paired.validity import validity_record


def ks_curve(cfg: ml_collections.ConfigDict) -> list[int]:
    """The ks of the curve statistics: powers of 2 up to eval.curve_samples, plus the
    primary k."""
    ks = set(cmp.ks_for(int(cfg.eval.curve_samples)))
    if cfg.compare.get("primary") is not None:
        ks.add(int(cfg.compare.primary.k))
    return sorted(ks)


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

    Step t's batch was sampled by the policy of step t − 1; its true per-prompt success rate
    is taken from the training-prompt evaluation at the latest evaluation point <= t − 1
    (`p = c/n`). Over the active prompts with an estimate: believed κ = κ(p̂_q, N_q),
    realised κ = κ(p_q, N_q), `κ(p, N) = 1 − (1 − p)^(N − shift)`; per step the min and the
    mean, then the mean over steps (`kappa_true_min_solvable`: the min over prompts with
    p > 0, since a prompt the policy never solves has κ = 0 whatever its N). Also: the share
    of all generated rollouts spent on prompts never solved by any of the run's training
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


def _final_eval(records: list[dict], num_steps: int, num_samples: int) -> dict | None:
    for r in records:
        if (r["step"] == num_steps and r["num_samples"] == num_samples and not r.get("curve")
                and not r.get("noise_keys")):
            return r
    return None


def _noise_eval(records: list[dict], num_steps: int, num_samples: int) -> dict | None:
    """The final policy scored with the noise key set (`eval.paired_noise`), if it was."""
    return next((r for r in records if r.get("noise_keys") and r["step"] == num_steps
                 and r["num_samples"] == num_samples), None)


#: Per-run fields of `comparison.json` that are not functions of the correct counts (from
#: the run's train and allocation records); summarised over seeds with their values.
RUN_FIELDS = ("rollouts", "tokens", "reward_mean_last", "kappa_believed_min",
              "kappa_believed_mean", "kappa_true_min", "kappa_true_mean",
              "kappa_true_min_solvable", "mixed_fraction", "never_solved_share",
              "never_solved_mazes", "answer_length", "truncated_fraction")


def gather(cfg: ml_collections.ConfigDict, workdir: str, methods: Sequence[str],
           seeds: Sequence[int], sft_dir: str | None = None, mesh=None,
           arm_configs: Mapping[str, ml_collections.ConfigDict] | None = None,
           curve_analysis: bool = True,
           method_seeds: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Everything `build_table` reads, from the workdir: the SFT start's scorings
    (`sft_points`), per arm and finished seed the final record, the curve records
    (`curves.curve_records`), the noise-key record, the run fields `RUN_FIELDS` and the
    per-step diagnostics; the κ shift per arm; the validity record; the plots' curves.
    `method_seeds`: per-method seeds in place of `seeds` (`spec.arms`; the frontier's)."""
    sft_dir = sft_dir or os.path.join(workdir, "sft")
    num_steps, n = int(cfg.rl.num_steps), int(cfg.eval.num_samples)
    sft_eval = read_json(os.path.join(sft_dir, "eval.json"))
    data: dict[str, Any] = {"points": sft_points(cfg, sft_dir, mesh), "runs": {}, "shifts": {},
                            "plot_curves": {}, "sft_eval": sft_eval,
                            "preregistered": os.path.exists(os.path.join(workdir,
                                                                         PREREGISTERED)),
                            "validity": (validity_record(cfg, sft_dir)
                                         if os.path.exists(os.path.join(sft_dir, "eval.json"))
                                         and "final" in sft_eval else None)}
    for arm, arm_seeds in arms(cfg, methods, seeds, method_seeds):
        acfg = (arm_configs or {}).get(arm, cfg)
        shift = rl_config.method(run_config(acfg, arm, 0)).kappa_shift
        data["shifts"][arm], data["runs"][arm], data["plot_curves"][arm] = shift, {}, []
        for seed in arm_seeds:
            d = run_dir(workdir, arm, seed)
            evals = read_jsonl(os.path.join(d, loop.EVAL_RECORDS))
            final = _final_eval(evals, num_steps, n)
            if final is None:
                logging.warning("%s seed %d has no final evaluation; left out", arm, seed)
                continue
            train = read_jsonl(os.path.join(d, loop.TRAIN_RECORDS))
            allocs = read_jsonl(os.path.join(d, ALLOC_RECORDS))
            curve = [r for r in evals if not r.get("final_only") and not r.get("noise_keys")]
            recs = curve_records(cfg, workdir, arm, seed) if curve_analysis else None
            data["runs"][arm][seed] = {
                "final": final, "curve": recs, "noise": _noise_eval(evals, num_steps, n),
                "fields": {"rollouts": final["rollouts"], "tokens": final["tokens"],
                           "reward_mean_last": float(np.mean([r["reward_mean"]
                                                              for r in train[-5:]])),
                           **allocation_diagnostics(allocs, curve, shift),
                           # what the policy writes (held-out, final point): tokens per
                           # answer and the share cut at the cap
                           "answer_length": final.get("mean_length"),
                           "truncated_fraction": final.get("truncated_fraction")},
                "diagnostics": per_step_diagnostics(allocs, train, recs or {},
                                                    int(cfg.task.num_train), shift)}
            data["plot_curves"][arm].append(curve)
    return data


def aggregate(cfg: ml_collections.ConfigDict, workdir: str, methods: Sequence[str],
              seeds: Sequence[int], sft_dir: str | None = None, mesh=None,
              plots: bool = True, results_dir: str | None = None,
              arm_configs: Mapping[str, ml_collections.ConfigDict] | None = None,
              curve_analysis: bool = True,
              method_seeds: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """Collect finished runs (`gather`, with `method_seeds`) -> `build_table` ->
    `results/comparison.{json,md}` and figures; returns the table.

    `arm_configs` (the regime's θ axis): per-method configs where they differ from `cfg`.
    `curve_analysis` (off for the regime's cells, evaluated at the end only): with
    `compare.primary` set, the statistics of the training curve (`curves`). With a
    pre-registration (`<workdir>/preregistered.json`, the committed
    `prereg.preregistration_path`), a config whose primary endpoint differs is refused.
    """
    results_dir = results_dir or os.path.join(workdir, "results")
    os.makedirs(results_dir, exist_ok=True)
    if curve_analysis and os.path.exists(os.path.join(workdir, PREREGISTERED)):
        preregister(cfg, workdir)  # refuses a primary / exploratory changed after the runs
    data = gather(cfg, workdir, methods, seeds, sft_dir, mesh, arm_configs, curve_analysis,
                  method_seeds)
    table = build_table(cfg, data, methods, curve_analysis)
    if is_exploratory(cfg):
        table["exploratory"] = True
        table["preregistration"] = {"found": False, "exploratory": True}
    elif curve_analysis and cfg.compare.get("primary") is not None:
        table["preregistration"] = check_primary(cfg)
    prereg_file = preregistration_path(cfg)
    if curve_analysis and "gate" in table and os.path.exists(prereg_file):
        registered = registered_gate(cfg, data, methods, read_preregistration(prereg_file))
        if registered is not None:
            table["gate_registered"] = registered
    write_json(os.path.join(results_dir, "comparison.json"), table)
    with open(os.path.join(results_dir, "comparison.md"), "w") as f:
        f.write(comparison_markdown(table))
    # mechanism.{json,md}: update norms, clipping, distance and KL from the start (if recorded)
    # the finished runs only (those of comparison.json), not every planned seed
    write_mechanism(results_dir, workdir,
                    [(arm, sorted(runs)) for arm, runs in data["runs"].items() if runs],
                    is_exploratory(cfg))
    write_outcomes(cfg, data, results_dir)
    rows = start_temperature_rows(cfg, sft_dir or os.path.join(workdir, "sft"), mesh)
    if rows:  # the start at other temperatures, beside the comparison's start
        write_json(os.path.join(results_dir, START_ROWS), {
            t: {k: r[k] for k in ("num_samples", "pass_at_k", "num_correct", "mean_length",
                                  "truncated_fraction", "outcome_fractions") if k in r}
            for t, r in rows.items()})
    if plots:
        plot_comparison(table, data["plot_curves"], data["sft_eval"], results_dir)
        if "curves" in table:
            plot_delta_curves(table, results_dir)
    return table


def build_table(cfg: ml_collections.ConfigDict, data: Mapping[str, Any],
                methods: Sequence[str], curve_analysis: bool = True) -> dict[str, Any]:
    """`comparison.json` from `gather`'s data: a pure function of the correct counts (and,
    for `RUN_FIELDS` and the per-step diagnostics, the values recorded in `data`), so
    `recompute` rebuilds it from the exported counts.

    Spread = sample standard deviation over seeds (and min / max in the JSON). Paired
    differences and CIs: `sera_jax.studies.compare` (the SFT start is scored with the keys
    of the final point, like every RL row). The comparison is `valid` only when the null
    control ran and stays within the noise floor of SFT at every k (the long-horizon
    analysis: the curve gate). Noise floors: `noise_floor` = one policy (SFT) scored with two
    key sets (what an unpaired comparison sees); `noise_floor_paired` (`eval.paired_noise`)
    = the primary pair's difference scored with the shared key set minus the same
    difference scored with the second key set (what paired arms see: shared keys cancel).
    """
    num_steps, n = int(cfg.rl.num_steps), int(cfg.eval.num_samples)
    w = get_kind(cfg).words
    points = data["points"]
    sft_final = points[(num_steps, n, int(cfg.eval.seed))]
    sft_noise = points[(num_steps, n, int(cfg.eval.noise_seed))]
    ks = cmp.ks_for(n)
    boot = dict(num_resamples=int(cfg.compare.bootstrap), level=float(cfg.compare.level),
                seed=int(cfg.compare.bootstrap_seed))
    table: dict[str, Any] = {
        "study": get_kind(cfg).name,
        "sft": {"pass_at_k": sft_final["pass_at_k"],
                "train_pass_at_k": sft_final.get("train", {}).get("pass_at_k"),
                "pass_at_k_noise_keys": sft_noise["pass_at_k"],
                "pass1_distribution": data["sft_eval"]["pass1_distribution"],
                "answer_length": sft_final.get("mean_length"),
                "truncated_fraction": sft_final.get("truncated_fraction"),
                "curve": {str(s): points[(s, int(cfg.eval.curve_samples), int(cfg.eval.seed))]
                          ["pass_at_k"] for s in eval_steps(cfg)}},
        "methods": {}, "num_samples": n, "num_steps": num_steps,
        "num_prompts": {"eval": len(sft_final["num_correct"]),
                        "train": len(sft_final.get("train", {}).get("num_correct", []))},
        "baseline": cfg.compare.baseline,
        "ci_method": (f"paired bootstrap over prompts and seeds: {cfg.compare.bootstrap} "
                      f"resamples, each drawing the seeds and the prompts with replacement (the "
                      f"same prompts for every seed), {100 * cfg.compare.level:.0f} % "
                      f"percentile interval of the mean per-prompt pass@k difference; every "
                      f"policy at a point is scored with that point's keys"),
        "noise_floor": {"eval": cmp.noise_floor(sft_final["num_correct"],
                                                sft_noise["num_correct"], n, ks, **boot)}}
    # The splits scored besides the held-out one ('train', the sealed 'test'), when present.
    others = [s for s in SPLITS if s != "eval" and s in sft_final]
    if "test" in sft_final:
        table["sft"]["test_pass_at_k"] = sft_final["test"]["pass_at_k"]
        table["num_prompts"]["test"] = len(sft_final["test"]["num_correct"])
    if data.get("validity") is not None:
        table["validity"] = data["validity"]
        guesser = data["validity"].get("blind")  # None: the kind's default guesser
        note = (f"{w.blind} guesser: {w.blind_note}" if guesser is None else
                f"{w.blind} guesser {guesser!r} (compare.blind; every guesser's pass@k, "
                f"{', '.join(sorted(data['validity']['guessers']))}, in sft/validity.json)")
        table["blind"] = {"pass_at_k": dict(data["validity"]["blind_pass_at_k"]),
                          "note": f"{note}; exact pass@k (sft/validity.json)"}
        if "test" in data["validity"]:
            table["blind"]["test_pass_at_k"] = dict(
                data["validity"]["test"]["blind_pass_at_k"])
    for split in others:
        table["noise_floor"][split] = cmp.noise_floor(
            sft_final[split]["num_correct"], sft_noise[split]["num_correct"], n, ks, **boot)
    correct: dict[str, dict[int, dict[str, list[int]]]] = {}
    for arm, runs in data["runs"].items():
        correct[arm] = {seed: {"eval": r["final"]["num_correct"],
                               **{s: r["final"].get(s, {}).get("num_correct")
                                  for s in SPLITS if s != "eval"}}
                        for seed, r in runs.items()}
        if not runs:
            continue
        finals = [r["final"] for r in runs.values()]
        entry = {"seeds": list(runs), "pass_at_k": {}, "train_pass_at_k": {}}
        if "test" in finals[0]:
            entry["test_pass_at_k"] = {}
        for k in finals[0]["pass_at_k"]:
            entry["pass_at_k"][k] = _summary([f["pass_at_k"][k] for f in finals])
            for split in [s for s in SPLITS if s != "eval" and s in finals[0]]:
                entry[f"{split}_pass_at_k"][k] = _summary([f[split]["pass_at_k"][k]
                                                           for f in finals])
        for field in RUN_FIELDS:
            vals = [r["fields"][field] for r in runs.values()]
            entry[field] = _summary(vals) if all(v is not None for v in vals) else None
        table["methods"][arm] = entry

    sft_c = {"eval": sft_final["num_correct"],
             **{s: sft_final.get(s, {}).get("num_correct") for s in SPLITS if s != "eval"}}
    table["paired"], table["vs_sft"] = {}, {}
    base = cfg.compare.baseline
    for arm in table["methods"]:
        table["vs_sft"][arm] = {}
        for split in SPLITS:
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
        for split in SPLITS:
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
    table["noise_floor_paired"] = paired_floor(cfg, data["runs"], n, ks, boot)
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
        c_n = int(cfg.eval.curve_samples)
        sft_curve = {s: points[(s, c_n, int(cfg.eval.seed))] for s in eval_steps(cfg)}
        floor_curve = cmp.noise_floor(points[(num_steps, c_n, int(cfg.eval.seed))]["num_correct"],
                                      points[(num_steps, c_n, int(cfg.eval.noise_seed))]
                                      ["num_correct"], c_n, ks_curve(cfg), **boot)
        table["noise_floor_curve"] = floor_curve
        table["bootstrap_pass_at_k"] = {
            "note": f"with-replacement bootstrap pass@k of the {w.published} (its "
                    "expectation 1 − (1 − c/n)^k), beside the unbiased pass_at_k; biased low",
            "sft": cmp.bootstrap_pass_at_k(sft_final["num_correct"], n, ks),
            "methods": {arm: {str(r): cmp.bootstrap_pass_at_k(correct[arm][r]["eval"], n, ks)
                              for r in correct[arm]} for arm in table["methods"]}}
        recs = {arm: {s: r["curve"] for s, r in runs.items() if r["curve"]}
                for arm, runs in data["runs"].items() if arm in table["methods"]}
        diags = {arm: {str(s): r["diagnostics"] for s, r in runs.items()}
                 for arm, runs in data["runs"].items() if arm in table["methods"]}
        table["curves"] = curve_statistics(cfg, methods, recs, sft_curve, floor_curve, diags,
                                           bool(data.get("preregistered")))
        table["gate"] = table["curves"]["gate"]
        table["primary"] = table["curves"]["primary"]
        table["aa"] = table["curves"]["aa"]
        table["valid"] = bool(table["gate"]["passes"])
    return table


#: The start at `eval.start_temperatures` (`evaluation.start_temperature_rows`), per
#: temperature: its pass@k, per-prompt counts and outcome shares.
START_ROWS = "start_temperatures.json"


def outcome_inputs(cfg: ml_collections.ConfigDict, data: Mapping[str, Any]
                   ) -> dict[str, np.ndarray]:
    """The per-sample arrays of the gathered runs (`outcomes.outcome_arrays`) with each
    scored split's problem templates (`templates/<split>`); empty without `eval.outcomes`."""
    arrays = outcomes.outcome_arrays(data)
    if arrays:
        task = build_task(cfg)
        for split in eval_splits(cfg):
            arrays[f"templates/{split}"] = np.asarray(
                [str(p.meta.get("template", "")) for p in task.problems(split)])
    return arrays


def outcome_summary(cfg: ml_collections.ConfigDict, arrays: Mapping[str, np.ndarray]
                    ) -> dict[str, Any]:
    """`outcomes.summarise` of `outcome_inputs` with the config's final-point start key,
    splits, baseline and level."""
    start_key = f"sft/{int(cfg.rl.num_steps)}_{int(cfg.eval.num_samples)}_{int(cfg.eval.seed)}"
    splits = eval_splits(cfg)
    return outcomes.summarise(arrays, start_key, splits,
                              {s: arrays[f"templates/{s}"].tolist() for s in splits},
                              str(cfg.compare.baseline), float(cfg.compare.get("level", 0.95)))


def write_outcomes(cfg: ml_collections.ConfigDict, data: Mapping[str, Any], results_dir: str
                   ) -> dict[str, Any] | None:
    """`results/outcomes.{json,md}` (format vs correctness per arm and template) when the
    runs' records carry per-sample outcomes (`eval.outcomes`); else nothing."""
    arrays = outcome_inputs(cfg, data)
    if not arrays:
        return None
    summary = outcome_summary(cfg, arrays)
    write_json(os.path.join(results_dir, "outcomes.json"), summary)
    with open(os.path.join(results_dir, "outcomes.md"), "w") as f:
        f.write(outcomes.summary_markdown(summary))
    return summary


def registered_gate(cfg: ml_collections.ConfigDict, data: Mapping[str, Any],
                    methods: Sequence[str], prereg: Mapping[str, Any]) -> dict[str, Any] | None:
    """One gate rule, registered seeds first (issue 49): when an amendment of the
    pre-registration `prereg` added null seeds, the gate recomputed on the null seeds it
    registered before any amendment (the table's `gate` then reads every seed: a labelled
    extension). Returns {**that gate, "null_seeds", "added_null_seeds", "note"}, or None when
    no amendment added null seeds."""
    changes = [a["changed"]["compare.null_seeds"] for a in prereg.get("amendments", [])
               if "compare.null_seeds" in a.get("changed", {})]
    if not changes or NULL not in data["runs"]:
        return None
    registered = [int(x) for x in changes[0][0]]
    runs = {**data["runs"], NULL: {s: r for s, r in data["runs"][NULL].items()
                                   if int(s) in registered}}
    rcfg = copy.deepcopy(cfg)
    rcfg.compare.null_seeds = tuple(registered)
    gate = build_table(rcfg, {**data, "runs": runs}, methods)["gate"]
    added = sorted(int(s) for s in data["runs"][NULL] if int(s) not in registered)
    return {**gate, "null_seeds": registered, "added_null_seeds": added,
            "note": "the gate on the null seeds registered before any amendment; the table's "
                    "gate, with the added seeds too, is a labelled extension"}


def paired_floor(cfg: ml_collections.ConfigDict, runs: Mapping[str, Mapping[int, Any]], n: int,
                 ks: Sequence[int], boot: Mapping[str, Any]) -> dict[str, Any]:
    """The noise floor as paired arms see it: for the primary pair (primary method, else the
    first compared method, − baseline) at the seeds where both final policies were also
    scored with the noise key set (`eval.paired_noise`), per seed and prompt
    `dd = (v_A − v_B)[keys eval.seed] − (v_A − v_B)[keys eval.noise_seed]`, then `floor =
    max(|mean dd|, half-width of its two-level bootstrap CI)` per k and split (the
    unpaired floor's definition with the paired difference in place of one policy)."""
    base = cfg.compare.baseline
    primary = cfg.compare.get("primary")
    others = [m for m in runs if m not in (base, NULL, AA)]
    method = primary.method if primary is not None and primary.method in runs else (
        others[0] if others else None)
    if method is None or base not in runs:
        return {"measured": False, "note": "no compared pair"}
    seeds = sorted(s for s in set(runs[method]) & set(runs[base])
                   if runs[method][s]["noise"] is not None and runs[base][s]["noise"] is not None)
    if not seeds:
        return {"measured": False, "note": "the final policies were not scored with the noise "
                                           "key set (eval.paired_noise=False)"}
    out: dict[str, Any] = {"measured": True, "pair": f"{method} − {base}", "seeds": seeds}
    for split in SPLITS:
        def counts(arm: str, which: str, split: str = split) -> list | None:
            recs = [runs[arm][s][which] for s in seeds]
            return ([r["num_correct"] for r in recs] if split == "eval" else
                    [r[split]["num_correct"] for r in recs] if split in recs[0] else None)

        a1, b1, a2, b2 = (counts(method, "final"), counts(base, "final"),
                          counts(method, "noise"), counts(base, "noise"))
        if a1 is None:
            continue
        va = [cmp.per_prompt_pass_at_k(np.asarray(x), n, ks) for x in (a1, b1, a2, b2)]
        dd = (va[0] - va[1]) - (va[2] - va[3])  # [K, S, M]
        out[split] = {}
        for i, k in enumerate(ks):
            e = cmp.paired_bootstrap(dd[i], **boot)
            out[split][str(int(k))] = {"diff": e["mean"], "lo": e["lo"], "hi": e["hi"],
                                       "floor": max(abs(e["mean"]), e["half_width"])}
    return out


__all__ = ["RUN_FIELDS", "aggregate", "allocation_diagnostics", "build_table",
           "comparison_markdown", "gather", "ks_curve", "paired_floor"]
