"""The maze alignment stage's statistics and table (`paired.alignment`): pure functions of
the stored repetition records, so a re-run rebuilds them from the cache.

Per policy: each estimator's cosine to the reference and norm ratio (covered prompts, and as
trained on all prompts) with an interval over repetitions, the paired difference of each
method's cosine minus the baseline's per repetition, the reference's half-cosine (its noise
ceiling) and what it implies for the reference's own alignment (`reference_alignment`).
Intervals: `sera_jax.studies.compare` -- `seed_interval` (Student t over repetitions, 't')
or `seed_bootstrap` ('bootstrap'); paired differences `seed_difference`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sera_jax.studies import compare

METRICS = ("cosine", "norm_ratio", "cosine_all", "norm_ratio_all", "kappa_mean", "active")


def reference_alignment(half_cosine: float) -> float | None:
    """cos(g_ref, exact) implied by the cosine c of two independent halves of the reference:
    each half is g + e_h with independent noise of equal size, so c ≈ ‖g‖²/(‖g‖² + 2σ²) and
    the full reference (noise σ²) has cosine sqrt(2c/(1+c)) to g. None for c <= 0."""
    return math.sqrt(2 * half_cosine / (1 + half_cosine)) if half_cosine > 0 else None


def interval(values: Sequence[float], ci: str, level: float) -> dict[str, Any] | None:
    """Mean and interval of per-repetition values (None entries dropped; None if none)."""
    x = [float(v) for v in values if v is not None]
    if not x:
        return None
    if ci == "bootstrap":
        return {**compare.seed_bootstrap(x, level=level), "method": "bootstrap"}
    return {**compare.seed_interval(x, level), "method": "t"}


def paired(a: Sequence[float | None], b: Sequence[float | None], ci: str, level: float
           ) -> dict[str, Any] | None:
    """`compare.seed_difference` of a − b over the repetitions where both are defined (None
    with fewer than two)."""
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if len(pairs) < 2:
        return None
    x, y = zip(*pairs)
    return compare.seed_difference(list(x), list(y), ci, level)


def summarise(reps: Sequence[Mapping[str, Any]], baseline: str, ci: str, level: float
              ) -> dict[str, Any]:
    """The statistics of one policy's repetitions (module docstring)."""
    names = list(reps[0]["estimators"])
    est = {n: {m: interval([r["estimators"][n][m] for r in reps], ci, level)
               for m in METRICS} for n in names}
    for n in names:
        first = reps[0]["estimators"][n]
        est[n].update(method=first["method"], p_source=first["p_source"])
    base = next(n for n in names if reps[0]["estimators"][n]["method"] == baseline)
    diffs = {n: {m: paired([r["estimators"][n][m] for r in reps],
                           [r["estimators"][base][m] for r in reps], ci, level)
                 for m in ("cosine", "cosine_all")} for n in names if n != base}
    half = interval([r["reference"]["half_cosine"] for r in reps
                     if r["reference"]["norm"] > 0], ci, level)
    return {"repetitions": len(reps), "baseline": base, "estimators": est,
            "difference": diffs,
            "reference": {"half_cosine": half,
                          "implied_alignment": (reference_alignment(half["mean"])
                                                if half else None),
                          "uncovered_mean": float(np.mean([r["reference"]["uncovered"]
                                                           for r in reps])),
                          "uncovered_max": int(max(r["reference"]["uncovered"] for r in reps)),
                          "prompts": len(reps[0]["prompt_ids"]),
                          "samples": int(reps[0]["reference"]["samples"]),
                          "reward_mean": float(np.mean([r["reference"]["reward_mean"]
                                                        for r in reps]))},
            "seconds_per_repetition": float(np.mean([r["seconds"] for r in reps]))}


def _fmt(e: Mapping[str, Any] | None, digits: int = 3) -> str:
    if e is None:
        return "–"
    if e.get("lo") is None:
        return f"{e['mean']:.{digits}f}"
    return f"{e['mean']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"


def markdown(result: Mapping[str, Any]) -> str:
    """The table of `paired.alignment.run`'s result: policy × estimator."""
    c = result["config"]
    lines = [
        "**Exploratory (not pre-registered)**", "",
        f"# Gradient alignment of the maze policy (budget P·N0 = {c['prompts_per_step']} × "
        f"{c['rollouts_per_prompt']}, reference N_ref = {c['reference_samples']} a prompt)",
        "",
        f"cos(ĝ, g_ref) on the prompts the reference covers (≥ 1 success of N_ref), "
        f"mean [{c['level']:.0%} interval, {'Student t' if c['ci'] == 't' else 'bootstrap'} "
        f"over repetitions]; 'all' = ĝ as trained on every prompt. p̂: 'history' = the "
        f"success history SERA would read, 'oracle' = K/N_ref of the reference.",
        "",
        "| policy | estimator | cosine (covered) | ‖ĝ‖/‖g_ref‖ | cosine (all) | κ mean | "
        "active prompts |",
        "|---|---|---|---|---|---|---|"]
    for pol in result["policies"]:
        s = pol["summary"]
        for name, e in s["estimators"].items():
            lines.append(f"| {pol['name']} | {name} | {_fmt(e['cosine'])} | "
                         f"{_fmt(e['norm_ratio'], 2)} | {_fmt(e['cosine_all'])} | "
                         f"{_fmt(e['kappa_mean'], 2)} | {_fmt(e['active'], 1)} |")
    lines += ["", f"Paired difference of cosines, estimator − {c['baseline']} (same "
                  "prompts and reference per repetition):", "",
              "| policy | estimator | Δ cosine (covered) | Δ cosine (all) |", "|---|---|---|---|"]
    diff = lambda e: "–" if e is None else compare.format_interval(e, digits=3)  # noqa: E731
    for pol in result["policies"]:
        for name, d in pol["summary"]["difference"].items():
            lines.append(f"| {pol['name']} | {name} | {diff(d['cosine'])} | "
                         f"{diff(d['cosine_all'])} |")
    lines += ["", "Reference noise (cosine of its two halves, N_ref/2 each) and what it "
                  "implies for cos(g_ref, exact), sqrt(2c/(1+c)):", "",
              "| policy | p̂ history | R | half cosine | implied cos(g_ref, exact) | "
              "uncovered prompts (mean / max of P) | reference reward | s / repetition |",
              "|---|---|---|---|---|---|---|---|"]
    for pol in result["policies"]:
        r, s = pol["summary"]["reference"], pol["summary"]
        implied = "–" if r["implied_alignment"] is None else f"{r['implied_alignment']:.3f}"
        lines.append(f"| {pol['name']} | {pol.get('history_source') or '–'} | "
                     f"{s['repetitions']} | {_fmt(r['half_cosine'])} | {implied} | "
                     f"{r['uncovered_mean']:.1f} / {r['uncovered_max']} of {r['prompts']} | "
                     f"{r['reward_mean']:.3f} | {s['seconds_per_repetition']:.0f} |")
    return "\n".join(lines) + "\n"


__all__ = ["METRICS", "interval", "markdown", "paired", "reference_alignment", "summarise"]
