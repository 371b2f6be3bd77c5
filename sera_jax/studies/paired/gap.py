"""The frontier-to-frontier gap of the lr frontier (`frontier.json` "gap", the gap table of
`frontier.md`).

For every method other than the baseline with points at >= 2 lrs: `compare.frontier_gap`
of its frontier against the baseline's -- pass@k at matched pass@1, each frontier the mean
(pass@1, pass@k) point of every lr plus the SFT start as the lr -> 0 point of both, joined
linearly, no extrapolation -- averaged over the overlap of the two pass@1 ranges and at 2
pass@1 levels inside it. CIs: the percentile seed bootstrap of `frontier.bootstrap`'s
settings, paired by seed id (a seed shares the task instance, the start, the data order and
the evaluation keys across lrs and methods, so every (lr, arm) group takes the seeds drawn
that it has: `frontier_gap(paired=True, seed_ids=...)`; seed sets may differ, e.g. with
`frontier.method_seeds`).

Verdicts (`compare.verdict`): better / worse when the `level` (95 %) interval lies clear of
0; equivalent within ±`frontier.margin` when a margin is registered and the `2·level − 1`
(90 %) bootstrap interval lies inside it (`compare.bootstrap_tost`); else inconclusive. The
MDE is not defined for this statistic (a functional of interpolated frontiers, no t
distribution behind it): the CI's half-width stands in as the resolution, and the outputs
say so.
"""

from __future__ import annotations

from typing import Any

from sera_jax.studies import compare as cmp
from sera_jax.studies.paired.spec import SPLIT_NAMES

#: What the gap's `resolution` says instead of an MDE.
RESOLUTION_NOTE = ("no MDE: the gap is a bootstrap statistic of interpolated frontiers (no t "
                   "distribution to take power from); the half-width of its CI stands in as "
                   "the resolution of the design")


def _groups(out: dict[str, Any], arm: str, key: str, points: str = "points"
            ) -> tuple[list[str], list[tuple[list[float], list[float]]], list[list[int]] | None]:
    """(lr names, per-seed (pass@1, pass@k) per lr, seed ids per lr or None) of `arm`, read
    from each lr's `points` ("points": the primary's split; "points_eval": held-out)."""
    names = [n for n, e in out["lrs"].items()
             if arm in e.get(points, {}) and "per_seed" in e[points][arm]["pass@1"]]
    pts = [out["lrs"][n][points][arm] for n in names]
    groups = [(p["pass@1"]["per_seed"], p[key]["per_seed"]) for p in pts]
    ids = [p.get("seeds") for p in pts]
    ok = all(i is not None and len(i) == len(g[0]) for i, g in zip(ids, groups))
    return names, groups, (ids if ok else None)


def frontier_gaps(out: dict[str, Any], base: str, k: int, points: str = "points",
                  start_key: str = "sft") -> dict[str, Any]:
    """`frontier.json`'s "gap" (module docstring) from the frontier's points (`out["lrs"]`,
    each lr's `points`), the SFT start (`out[start_key]`), `out["bootstrap"]` and
    `out["margin"]` (None: none). `points="points_eval", start_key="sft_eval"`: the same
    gaps on the held-out set when the primary reads another split ("gap_eval")."""
    key = f"pass@{k}"
    boot = {f: v for f, v in out.get("bootstrap", {}).items()
            if f in ("num_resamples", "level", "seed")}
    level = float(boot.get("level", 0.95))
    margin = out.get("margin")
    start = (out[start_key]["pass@1"], out[start_key][key]) if out.get(start_key) else None
    res: dict[str, Any] = {
        "baseline": base, "k": k, "margin": margin, "level": level,
        "tost_level": None if margin is None else cmp.tost_level(level),
        "start_joins_both": start is not None, "methods": {}}
    b_names, b_groups, b_ids = _groups(out, base, key, points)
    for m in out["methods"]:
        if m == base:
            continue
        names, groups, ids = _groups(out, m, key, points)
        if len(names) < 2 or len(b_names) < 2:
            res["methods"][m] = {"lrs": names, "skipped": (
                f"{m} has points at {len(names)} lr(s), {base} at {len(b_names)}: a gap "
                "needs both frontiers at >= 2 lrs")}
            continue
        by_id = b_ids is not None and ids is not None
        by_index = len({len(x) for x, _ in b_groups + groups}) == 1
        e = cmp.frontier_gap(b_groups, groups, start=start, margin=margin,
                             paired=by_id or by_index,
                             seed_ids=(b_ids, ids) if by_id else None, **boot)
        e["pairing"] = ("paired by seed id" if by_id else
                        "paired by seed index" if by_index else "unpaired")
        for iv in (e["mean"], *e["levels"]):
            iv["verdict"] = (None if iv["mean"] is None else
                             cmp.verdict(iv, None, iv.get("tost")))
        m_iv = e["mean"]
        e["resolution"] = {"mde": None, "half_width": (
            None if m_iv["lo"] is None else (m_iv["hi"] - m_iv["lo"]) / 2),
            "note": RESOLUTION_NOTE}
        e["lrs"] = names
        e["seeds"] = sorted({int(s) for g in (b_ids or []) + (ids or []) for s in g})
        res["methods"][m] = e
    return res


def _cell(e: dict[str, Any]) -> str:
    if e["mean"] is None:
        return "–"
    band = "" if e["lo"] is None else f" [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}]"
    return f"{100 * e['mean']:+.2f}{band}"


def verdict_words(e: dict[str, Any], margin: float | None) -> str:
    """A gap interval's verdict in the table's units (pp)."""
    v = e.get("verdict")
    if v is None:
        return "–"
    if v.startswith("equivalent") and margin is not None:
        return f"equivalent within ±{100 * margin:.1f} pp"
    return v


def gap_lines(out: dict[str, Any], which: str = "gap") -> list[str]:
    """The gap table of `frontier.md` (pp), with the margin, the TOST and the resolution;
    [] for a frontier written before the gap existed. `which="gap_eval"`: the held-out
    set's gaps, beside a primary on another split."""
    gap = out.get(which)
    if not gap or not gap.get("methods"):
        return []
    k, base, margin = gap["k"], gap["baseline"], gap.get("margin")
    level = 100 * gap["level"]
    split = ("held-out" if which == "gap_eval" else
             SPLIT_NAMES.get(str(out.get("split", "eval")), "held-out"))
    pairings = sorted({g["pairing"] for g in gap["methods"].values() if "pairing" in g})
    pairing = "; ".join(pairings) if pairings else "paired by seed id"
    lines = ["", f"Frontier gap vs {base}: {split} pass@{k} at matched pass@1 (pp; {level:.0f} % "
             f"seed bootstrap {pairing}"
             + (", the SFT start the lr -> 0 point of both frontiers" if
                gap.get("start_joins_both") else "")
             + "), averaged over the overlap of the two frontiers and at two pass@1 levels "
             "inside it:", "",
             "| method | lrs | pass@1 overlap (%) | mean over overlap | at level 1 | "
             "at level 2 | verdict (mean) |", "|---|---|---|---|---|---|---|"]
    notes = []
    for m, g in gap["methods"].items():
        if "skipped" in g:
            lines.append(f"| {m} | {len(g['lrs'])} | – | – | – | – | – |")
            notes.append(f"{m}: {g['skipped']}.")
            continue
        if g["overlap"] is None:
            lines.append(f"| {m} | {len(g['lrs'])} | none | – | – | – | not comparable |")
            continue
        lv = [f"{_cell(e)} (pass@1 {100 * e['x']:.2f})" for e in g["levels"]]
        lines.append(f"| {m} | {len(g['lrs'])} | {100 * g['overlap'][0]:.2f}–"
                     f"{100 * g['overlap'][1]:.2f} | {_cell(g['mean'])} | " + " | ".join(lv)
                     + f" | {verdict_words(g['mean'], margin)} |")
        t, r = g["mean"].get("tost"), g["resolution"]
        if t is not None:
            inside = ("no interval" if t["lo"] is None else
                      f"{100 * t['level']:.0f} % interval [{100 * t['lo']:+.2f}, "
                      f"{100 * t['hi']:+.2f}] {'inside' if t['equivalent'] else 'not inside'}")
            notes.append(f"{m}: TOST against ±{100 * margin:.1f} pp: {inside} the margin.")
        if r["half_width"] is not None:
            notes.append(f"{m}: resolution ±{100 * r['half_width']:.2f} pp (the CI's "
                         f"half-width; {100 * g['defined_share']:.0f} % of resamples defined)"
                         " -- the MDE is not defined for this bootstrap statistic.")
    lines += ["", "Equivalence margin (frontier.margin): " + (
        f"±{100 * margin:.1f} pp." if margin is not None else "none registered: the verdict "
        "is better, worse or inconclusive, never equivalence.")]
    return lines + notes


__all__ = ["RESOLUTION_NOTE", "frontier_gaps", "gap_lines", "verdict_words"]
