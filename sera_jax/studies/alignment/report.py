"""The alignment study's report: the per-draw CSV, the per-cell aggregate (mean cosine ± se,
paired differences vs uniform and SERA), the cosine-vs-budget figure and `summary.md`."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from typing import Any

import ml_collections
import numpy as np

from sera_jax import methods as methods_lib


def write_csv(path: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


#: Paired differences `aggregate` reports: (reference method, mean key, std-error key).
PAIRED_REFERENCES = (("uniform", "diff_vs_uniform", "diff_se"),
                     ("sera", "diff_vs_sera", "diff_vs_sera_se"))
#: The rules beyond the paper, compared with SERA in the summary when measured.
NEW_RULES = ("sera_posterior", "sera_sequential")


def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (stage, budget, allocator): mean ± std-error of the cosine over draws, mean norm
    ratio, κ diagnostics (mean over the rows), and the paired differences to `uniform` and to
    `sera` (same draws) when present."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["stage"], r["budget"], r["method"]), []).append(r)
    cosines = {k: np.array([r["cosine"] for r in sorted(rs, key=lambda r: r["draw"])])
               for k, rs in groups.items()}
    out = []
    for (stage, budget, name), rs in groups.items():
        c = cosines[(stage, budget, name)]
        mean = lambda f, rs=rs: float(np.mean([r[f] for r in rs]))  # noqa: E731
        row = {"stage": stage, "budget": budget, "method": name, "n": len(c),
               "cosine": float(c.mean()), "cosine_se": float(c.std(ddof=1) / math.sqrt(len(c))),
               "norm_ratio": mean("norm_ratio"), "cosine_expected": rs[0]["cosine_expected"],
               "kappa_min": mean("kappa_min"), "kappa_mean": mean("kappa_mean"),
               "active_frac": mean("active_frac")}
        for ref, key, se_key in PAIRED_REFERENCES:
            base = cosines.get((stage, budget, ref))
            if base is not None and name != ref:
                d = c - base
                row[key] = float(d.mean())
                row[se_key] = float(d.std(ddof=1) / math.sqrt(len(d)))
        out.append(row)
    return out


#: The two methods the study compares stand out (strong colours, thick, drawn on top); every
#: other allocator is a thin, faded peer in a colour of its own.
HEADLINE_STYLE = {"uniform": {"color": "black", "lw": 2.4, "alpha": 1.0, "zorder": 4},
                  "sera": {"color": "tab:red", "lw": 2.4, "alpha": 1.0, "zorder": 5}}
PEER_STYLE = {"lw": 1.0, "alpha": 0.45, "zorder": 2}


def alignment_figure(table: Sequence[dict[str, Any]], stages: Sequence[str],
                     methods: Sequence[str]):
    """Cosine vs budget, one line per allocator with ±1 std-error bars, one panel per stage;
    uniform and SERA in `HEADLINE_STYLE`, peers in `PEER_STYLE` (tab10 colours, skipping
    red), one legend below the panels (never over a curve). Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(stages), figsize=(4.2 * len(stages), 4.4), squeeze=False,
                             sharey=True)
    palette = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 3]  # 3: red
    peers = [m for m in methods if m not in HEADLINE_STYLE]
    style = {m: {**PEER_STYLE, "color": palette[i % len(palette)]} for i, m in enumerate(peers)}
    style.update(HEADLINE_STYLE)
    for ax, stage in zip(axes[0], stages):
        for name in methods:
            rs = sorted((r for r in table if r["stage"] == stage and r["method"] == name),
                        key=lambda r: r["budget"])
            if not rs:
                continue
            ax.errorbar([r["budget"] for r in rs], [r["cosine"] for r in rs],
                        yerr=[r["cosine_se"] for r in rs], marker="o", ms=3, capsize=2,
                        label=methods_lib.get_method(name).label, **style[name])
        ax.set_xscale("log", base=2)
        ax.set_title(stage)
        ax.set_xlabel("budget N0 (rollouts per image)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("cosine to exact CE gradient")
    handles, labels = axes[0][0].get_legend_handles_labels()
    rows = -(-len(labels) // 5)
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))
    return fig


def plot_alignment(table: Sequence[dict[str, Any]], path: str, stages: Sequence[str],
                   methods: Sequence[str]) -> None:
    """`alignment_figure` saved as a PNG at `path`."""
    import matplotlib.pyplot as plt

    fig = alignment_figure(table, stages, methods)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def summary_markdown(table: Sequence[dict[str, Any]], stages: Sequence[dict[str, Any]],
                     methods: Sequence[str], seconds: float,
                     config: ml_collections.ConfigDict, note: str = "") -> str:
    """Markdown: stage statistics, cosine mean ± se per (stage, budget) and allocator, and
    SERA-dynamic vs uniform paired differences with κ diagnostics; `note` follows the wall
    time (e.g. how many units a resumed run reused)."""
    ms, al = config.measure, config.rl.allocation
    lines = [f"## Gradient alignment — {config.data.name}, {config.model.name}", "",
             f"{ms.num_draws} paired draws per cell, seed {config.seed}, measure batch "
             f"P = {ms.prompts_per_step}, n_min = {al.n_min}, n_max = {al.n_max}, θ = "
             f"{al.threshold}; "
             f"wall time {seconds:.1f} s{note}.", "",
             "| stage | CE steps | mean p | median p | p<0.1 | p>0.9 | top-1 |",
             "|---|---|---|---|---|---|---|"]
    for s in stages:
        lines.append(f"| {s['stage']} | {s['step']} | {s['mean_p']:.3f} | {s['median_p']:.3f} "
                     f"| {s['frac_p_below_0.1']:.2f} | {s['frac_p_above_0.9']:.2f} "
                     f"| {s['top1']:.3f} |")
    lines += ["", "Cosine to the exact gradient, mean ± std-error over draws:", "",
              "| stage | N0 | " + " | ".join(methods) + " |",
              "|---|---|" + "---|" * len(methods)]
    idx = {(r["stage"], r["budget"], r["method"]): r for r in table}
    budgets = sorted({r["budget"] for r in table})
    for s in stages:
        for b in budgets:
            cells = [f"{idx[(s['stage'], b, a)]['cosine']:.3f} ± "
                     f"{idx[(s['stage'], b, a)]['cosine_se']:.3f}"
                     if (s["stage"], b, a) in idx else "" for a in methods]
            lines.append(f"| {s['stage']} | {b} | " + " | ".join(cells) + " |")
    if "uniform" in methods and "sera" in methods:
        lines += ["", "SERA (dynamic) vs uniform (paired over the same draws); κ over active "
                  "prompts; cos(E) = cosine of the expected (noise-free) gradient:", "",
                  "| stage | N0 | uniform | SERA | Δ ± se | κmin U | κmin S | κmean U | "
                  "κmean S | active S | cos(E) U | cos(E) S |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for s in stages:
            for b in budgets:
                u, v = idx.get((s["stage"], b, "uniform")), idx.get((s["stage"], b, "sera"))
                if u is None or v is None:
                    continue
                lines.append(
                    f"| {s['stage']} | {b} | {u['cosine']:.3f} | {v['cosine']:.3f} | "
                    f"{v['diff_vs_uniform']:+.3f} ± {v['diff_se']:.3f} | {u['kappa_min']:.3f} "
                    f"| {v['kappa_min']:.3f} | {u['kappa_mean']:.3f} | {v['kappa_mean']:.3f} | "
                    f"{v['active_frac']:.2f} | {u['cosine_expected']:.3f} | "
                    f"{v['cosine_expected']:.3f} |")
    new = [n for n in NEW_RULES if n in methods]
    if "sera" in methods and new:
        lines += ["", "Rules beyond the paper vs SERA (dynamic), paired over the same draws (Δ ± "
                  "se); κ and cos(E) of a two-stage method are over its pilot too (E[c_q], "
                  "comparable with a one-shot κ(p, N_q); the cosine of E[g]):", "",
                  "| stage | N0 | SERA | " + " | ".join(
                      f"{n} | Δ vs SERA | κmin | cos(E)" for n in new) + " |",
                  "|---|---|---|" + "---|---|---|---|" * len(new)]
        for s in stages:
            for b in budgets:
                v = idx.get((s["stage"], b, "sera"))
                cells = [idx.get((s["stage"], b, n)) for n in new]
                if v is None or any(c is None for c in cells):
                    continue
                lines.append(f"| {s['stage']} | {b} | {v['cosine']:.3f} | " + " | ".join(
                    f"{c['cosine']:.3f} | {c['diff_vs_sera']:+.3f} ± {c['diff_vs_sera_se']:.3f} "
                    f"| {c['kappa_min']:.3f} | {c['cosine_expected']:.3f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- train
