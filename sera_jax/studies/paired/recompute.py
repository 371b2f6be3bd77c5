"""Recompute every number of an exported paired comparison from its files alone.

`recompute(folder)` reads `results/<kind>/<name>/` (`export`): the per-prompt correct counts of
`counts.npz`, `config.json` and `export.json`, and rebuilds with the aggregator's own functions
(`report.build_table`, `frontier.point` / `summarise`, `matched.matched_endpoint`'s
arithmetic):

* the comparison table: every pass@k (recomputed from the counts as the evaluation does,
  `metrics.pass_at_k_curve`), the blind control (from the per-prompt `blind_q`), the validity
  check, paired differences, noise floors (unpaired and paired), the null control, the
  curve analysis (Δ(t), primary endpoint with both intervals, secondaries, gate, A/A);
* the frontier's points, gates, selected lr and distances with their CIs;
* the matched arm's endpoint.

Only the fields that are not functions of the counts are read from `comparison.json`: the
runs' generated rollouts / tokens, training reward and allocator diagnostics (`RUN_FIELDS`,
per seed) and the per-step diagnostics. `compare_numbers` lists every number that differs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_collections
import numpy as np

from sera_jax.loop import canonical
from sera_jax.metrics import pass_at_k_curve
from sera_jax.records import read_json
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired import frontier as fr
from sera_jax.studies.paired import matched as mt
from sera_jax.studies.paired.evaluation import pass1_distribution
from sera_jax.studies.paired.export import COUNTS
from sera_jax.studies.paired.frontier import frontier_markdown
from sera_jax.studies.paired.kinds.base import blind_pass_at_k
from sera_jax.studies.paired.report import RUN_FIELDS, build_table
from sera_jax.studies.paired.tables import comparison_markdown
from sera_jax.studies.paired.validity import check_validity, validity_settings


def _record(counts: Mapping[str, np.ndarray], key: str, n: int) -> dict[str, Any] | None:
    """An evaluation record (num_correct, num_samples, pass_at_k, train) from the counts."""
    if f"{key}/eval" not in counts:
        return None

    def one(c: np.ndarray) -> dict[str, Any]:
        c = np.asarray(c, np.int64)
        ks, values = pass_at_k_curve(np.full(c.size, n), c)
        return {"num_samples": n, "num_correct": c.tolist(),
                "pass_at_k": {str(int(k)): float(v) for k, v in zip(ks, values)}}

    rec = one(counts[f"{key}/eval"])
    if f"{key}/train" in counts:
        rec["train"] = one(counts[f"{key}/train"])
    return rec


def _curve(counts: Mapping[str, np.ndarray], key: str, n: int) -> dict[int, dict] | None:
    if f"{key}/curve_steps" not in counts:
        return None
    steps = counts[f"{key}/curve_steps"].tolist()
    out = {}
    for i, t in enumerate(steps):
        rec = {"eval": counts[f"{key}/curve/eval"][i]}
        if f"{key}/curve/train" in counts:
            rec["train"] = counts[f"{key}/curve/train"][i]
        out[int(t)] = _record({f"p/{s}": v for s, v in rec.items()}, "p", n)
    return out


def load_data(cfg: ml_collections.ConfigDict, counts: Mapping[str, np.ndarray],
              table: Mapping[str, Any] | None, prefix: str = "",
              sft_points: dict | None = None) -> dict[str, Any]:
    """`report.gather`'s data rebuilt from the counts (`prefix`: a frontier lr's or the
    matched arm's), the non-count fields taken from `table` (comparison.json) when given."""
    n, c_n = int(cfg.eval.num_samples), int(cfg.eval.curve_samples)
    points = sft_points
    if points is None:
        points = {}
        for key in counts:
            if key.startswith("sft/") and key.endswith("/eval"):
                step, size, keys = (int(x) for x in key.split("/")[1].split("_"))
                points[(step, size, keys)] = _record(counts, key[:-len("/eval")], size)
        # The start's answer length and truncation are recorded, not counted: from the table.
        start = (table or {}).get("sft", {})
        final = points.get((int(cfg.rl.num_steps), n, int(cfg.eval.seed)))
        if final is not None:
            final.update(mean_length=start.get("answer_length"),
                         truncated_fraction=start.get("truncated_fraction"))
    runs: dict[str, dict[int, Any]] = {}
    order = list(table["methods"]) if table else []
    found = sorted({k.split("/")[len(prefix.split("/"))] for k in counts
                    if k.startswith(f"{prefix}run/")})
    for arm in order + [a for a in found if a not in order]:
        entry = (table or {}).get("methods", {}).get(arm, {})
        seeds = entry.get("seeds") or sorted({int(k.split("/")[len(prefix.split("/")) + 1])
                                              for k in counts
                                              if k.startswith(f"{prefix}run/{arm}/")})
        diags = ((table or {}).get("curves", {}).get("diagnostics", {}).get("per_seed", {})
                 .get(arm, {}))
        runs[arm] = {}
        for i, seed in enumerate(seeds):
            key = f"{prefix}run/{arm}/{seed}"
            runs[arm][int(seed)] = {
                "final": _record(counts, f"{key}/final", n),
                "curve": _curve(counts, key, c_n),
                "noise": _record(counts, f"{key}/noise", n),
                "fields": {f: (entry[f]["values"][i] if entry.get(f) else None)
                           for f in RUN_FIELDS},
                "diagnostics": diags.get(str(seed), [])}
    final0 = points[(0, n, int(cfg.eval.seed))]
    return {"points": points, "runs": runs,
            "sft_eval": {"pass1_distribution": pass1_distribution(final0["num_correct"], n)},
            "preregistered": bool((table or {}).get("primary", {}).get("preregistered")),
            "validity": None}


def recompute_validity(cfg: ml_collections.ConfigDict, counts: Mapping[str, np.ndarray],
                       saved: Mapping[str, Any]) -> dict[str, Any]:
    """The validity record: blind pass@k from `blind_q`, the start's from its counts, the
    check; the descriptive fields (distinct answers, path) from `saved`."""
    s = validity_settings(cfg)
    n = int(cfg.eval.num_samples)
    ks = sorted(set(cmp.ks_for(n)) | {s["k"]})
    blind = blind_pass_at_k(counts["blind_q"], ks)
    start_c = counts[f"sft/0_{n}_{int(cfg.eval.seed)}/eval"]
    v = cmp.per_prompt_pass_at_k(np.asarray(start_c), n, ks).mean(axis=-1)
    start = {str(k): float(x) for k, x in zip(ks, v)}
    check = check_validity(start, blind, s["k"], s["pass1_ratio"], s["blind_share"])
    return {**saved, **check, "blind_pass_at_k": blind, "start_pass_at_k": start,
            "override": bool(s["allow_blind_task"] and not check["passes"])}


def recompute(folder: str) -> dict[str, Any]:
    """{"comparison": table, "frontier": out | None, "matched": result | None} rebuilt from
    the export in `folder` (module docstring)."""
    cfg = ml_collections.ConfigDict(read_json(os.path.join(folder, "config.json")))
    manifest = read_json(os.path.join(folder, "export.json"))
    saved = read_json(os.path.join(folder, "comparison.json"))
    with np.load(os.path.join(folder, COUNTS)) as z:
        counts = {k: z[k] for k in z.files}
    data = load_data(cfg, counts, saved)
    if saved.get("validity") is not None:
        data["validity"] = recompute_validity(cfg, counts, saved["validity"])
    table = build_table(cfg, data, manifest["methods"], manifest["curve_analysis"])
    if "preregistration" in saved:
        table["preregistration"] = saved["preregistration"]
    out: dict[str, Any] = {"comparison": table, "frontier": None, "matched": None}
    fpath = os.path.join(folder, "frontier.json")
    if os.path.exists(fpath):
        fsaved = read_json(fpath)
        k, window = int(fsaved["k"]), int(fsaved["window"])
        level = float(cfg.compare.level)
        fout = {key: fsaved[key] for key in fsaved if key not in (
            "lrs", "sft", "blind", "selected_lr", "admissible", "above_baseline_frontier",
            "above_baseline_frontier_ci")}
        fout["lrs"] = {}
        for name, e in fsaved["lrs"].items():
            lcfg = fr.lr_config(cfg, e["lr"])
            ldata = load_data(lcfg, counts, None, f"frontier/{name}/", data["points"])
            ldata["validity"] = data["validity"]
            lr_methods = e.get("methods", fsaved["methods"])
            ltable = build_table(lcfg, ldata, lr_methods)
            pts = {arm: p for arm in lr_methods + ([fr.NULL] if lcfg.compare.null else [])
                   if (p := fr.point(ltable, arm, k, window, level)) is not None}
            fout["lrs"][name] = {"lr": e["lr"], "dir": e["dir"], "points": pts,
                                 "gate": ltable["gate"],
                                 **{key: e[key] for key in ("methods", "seeds") if key in e}}
            if "sft" not in fout:
                fout["sft"] = fr.start_point(ltable, k, window)
                fout["blind"] = fr.blind_point(ltable, k)
        fout.update(fr.summarise(fout, cfg.compare.baseline, k))
        out["frontier"] = fout
    mpath = os.path.join(folder, "matched.json")
    if os.path.exists(mpath) and read_json(mpath).get("result", {}).get("ran"):
        m = read_json(mpath)
        mcfg = mt.matched_config(cfg, m["choice"]["lr"])
        mdata = load_data(mcfg, counts, None, "matched/", data["points"])
        sera = {s: r["curve"] for s, r in data["runs"][m["method"]].items()}
        unif = {s: r["curve"] for s, r in mdata["runs"][m["baseline"]].items()}
        out["matched"] = mt.endpoint_from_curves(mcfg, sera, unif, m["seeds"])
    return out


def _numbers(x: Any, path: str = "") -> dict[str, Any]:
    if isinstance(x, Mapping):
        out = {}
        for k, v in x.items():
            out.update(_numbers(v, f"{path}/{k}"))
        return out
    if isinstance(x, list | tuple):
        out = {}
        for i, v in enumerate(x):
            out.update(_numbers(v, f"{path}[{i}]"))
        return out
    return {path: x}


#: Leaves that describe a method in words (how a CI was computed, what a control is), not a
#: result: their wording may change between versions (e.g. "prompts" for "mazes"); every
#: number, verdict, name and outcome is compared.
DESCRIPTIONS = ("note", "ci_method", "band_method", "two_level/method")


def compare_numbers(recomputed: Any, saved: Any, tol: float = 0.0) -> list[str]:
    """Paths (and values) of every leaf of `saved` that `recomputed` lacks or differs on
    (numbers: by more than `tol`; the wording of `DESCRIPTIONS` leaves is not compared);
    JSON round trip first (tuples, int keys)."""
    a, b = _numbers(canonical(recomputed)), _numbers(canonical(saved))
    bad = []
    for path, v in b.items():
        if path.endswith(tuple("/" + d for d in DESCRIPTIONS)) and isinstance(v, str):
            continue
        w = a.get(path, "<missing>")
        same = (abs(w - v) <= tol if isinstance(v, int | float) and isinstance(w, int | float)
                and not isinstance(v, bool) else w == v)
        if not same:
            bad.append(f"{path}: recomputed {w!r}, saved {v!r}")
    return bad


def main(folder: str) -> int:
    """Print the recomputed tables and the check against the saved JSON (exit status 1 on a
    difference)."""
    out = recompute(folder)
    print(comparison_markdown(out["comparison"]))
    status = 0
    checks = [("comparison", out["comparison"], "comparison.json", None)]
    if out["frontier"] is not None:
        print(frontier_markdown(out["frontier"]))
        checks.append(("frontier", out["frontier"], "frontier.json", None))
    if out["matched"] is not None:
        checks.append(("matched", out["matched"], "matched.json", "result"))
    for name, got, file, sub in checks:
        saved = read_json(os.path.join(folder, file))
        saved = saved[sub] if sub else saved
        skip = ("preregistration",) if name != "matched" else ()
        bad = compare_numbers(got, {k: v for k, v in saved.items() if k not in skip},
                              tol=1e-12)
        count = len(_numbers(saved))
        print(f"{name}: {count - len(bad)} of {count} saved values recomputed equal"
              + ("" if not bad else "; differ:\n  " + "\n  ".join(bad[:20])))
        status |= bool(bad)
    return status


__all__ = ["compare_numbers", "load_data", "main", "recompute", "recompute_validity"]
