"""Figures: the comparison's PNGs, the regime map's heatmaps / θ curves and the lr frontier.
A figure of an exploratory run carries `spec.EXPLORATORY` in red."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from sera_jax.studies.paired.kinds import words
from sera_jax.studies.paired.spec import AA, EXPLORATORY, NULL, SPLIT_NAMES, SPLITS


def _save(fig: Any, path: str, record: dict[str, Any]) -> None:
    """Save `fig` at `path`, stamped `EXPLORATORY` when `record` (a table or an output) is."""
    if record.get("exploratory"):
        fig.text(0.01, 0.005, EXPLORATORY, color="tab:red", fontsize=8, ha="left",
                 va="bottom")
    fig.savefig(path, dpi=120)


def plot_comparison(table: dict, curves: dict, sft_eval: dict, results_dir: str) -> list[str]:
    """PNG figures: final pass@k vs k per method (with the start and the blind control);
    pass@1 / pass@k_max vs training rollouts (blind as a line); paired differences vs k with
    CIs and the noise floor; the start's per-prompt pass@1 histogram. Returns
    the file paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    colors = {"uniform": "tab:blue", "sera": "tab:red", "grpo": "tab:gray", NULL: "tab:olive",
              "sera_evidence": "tab:purple", AA: "tab:cyan"}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ks = [int(k) for k in table["sft"]["pass_at_k"]]
    w = words(table.get("study"))
    ax.plot(ks, [table["sft"]["pass_at_k"][str(k)] for k in ks], "k--", label=w.start_long)
    blind = table.get("blind", {}).get("pass_at_k", {})
    if blind:
        bk = [k for k in ks if str(k) in blind]
        ax.plot(bk, [blind[str(k)] for k in bk], ":", color="0.45", marker="x",
                label=f"blind ({w.blind} guesser)")
    for method, e in table["methods"].items():
        kk = [int(k) for k in e["pass_at_k"]]
        mean = np.array([e["pass_at_k"][str(k)]["mean"] for k in kk])
        lo = np.array([e["pass_at_k"][str(k)]["min"] for k in kk])
        hi = np.array([e["pass_at_k"][str(k)]["max"] for k in kk])
        c = colors.get(method)
        ax.plot(kk, mean, "o-", color=c, label=f"{method} ({len(e['seeds'])} seeds)")
        ax.fill_between(kk, lo, hi, color=c, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k")
    ax.set_title("pass@k after RL (band: min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "pass_at_k.png"))
    _save(fig, paths[-1], table)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    floor = table["noise_floor"]["eval"]
    ax.fill_between(ks, [-100 * floor[str(k)]["floor"] for k in ks],
                    [100 * floor[str(k)]["floor"] for k in ks], color="0.85",
                    label="noise floor")
    for arm, p in table.get("paired", {}).items():
        e = p["eval"]
        mean = np.array([100 * e[str(k)]["mean"] for k in ks])
        ax.errorbar(ks, mean, yerr=[mean - [100 * e[str(k)]["lo"] for k in ks],
                                    [100 * e[str(k)]["hi"] for k in ks] - mean],
                    fmt="o-", capsize=3, color=colors.get(arm),
                    label=f"{arm} − {table['baseline']}")
    if NULL in table.get("vs_sft", {}):
        e = table["vs_sft"][NULL]["eval"]
        ax.plot(ks, [100 * e[str(k)]["mean"] for k in ks], "s:", color=colors[NULL],
                label=f"null − {w.start}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k difference (points)")
    ax.set_title("paired differences, 95 % CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "paired_differences.png"))
    _save(fig, paths[-1], table)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    sft_curve = table["sft"]["curve"]
    kmax = list(sft_curve["0"])[-1]
    budget = next((r["rollouts"] / r["step"] for runs in curves.values() for run in runs
                   for r in run if r["step"] > 0), None)
    for ax, k in zip(axes, ("1", kmax)):
        for method, runs in curves.items():
            if not runs:
                continue
            c = colors.get(method)
            steps = sorted({r["rollouts"] for r in runs[0]})
            ys = np.array([[next((r["pass_at_k"].get(k, np.nan) for r in run
                                  if r["rollouts"] == s), np.nan) for s in steps]
                           for run in runs])
            ax.plot(steps, np.nanmean(ys, 0), "o-", color=c, label=f"{method}")
            ax.fill_between(steps, np.nanmin(ys, 0), np.nanmax(ys, 0), color=c, alpha=0.2)
        if budget:
            ss = sorted(int(s) for s in sft_curve)
            ax.plot([s * budget for s in ss], [sft_curve[str(s)].get(k, np.nan) for s in ss],
                    "k--", label=f"{w.start} (same keys)")
        if k in blind:
            ax.axhline(blind[k], color="0.45", ls=":", label="blind (exact)")
        ax.set_xlabel("generated training rollouts")
        ax.set_ylabel(f"held-out pass@{k}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("held-out pass@k over RL training (mean, band min-max over seeds)")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "training_curves.png"))
    _save(fig, paths[-1], table)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    p = np.asarray(sft_eval["final"]["num_correct"]) / sft_eval["final"]["num_samples"]
    ax.hist(p, bins=np.linspace(0, 1, 21), color="tab:purple")
    ax.set_xlabel(f"per-{w.prompt} pass@1 of the {w.start_long}")
    ax.set_ylabel(f"held-out {w.prompts}")
    ax.set_title(f"{w.start_long}: mean pass@1 {p.mean():.2f}")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "sft_pass1_hist.png"))
    _save(fig, paths[-1], table)
    plt.close(fig)
    return paths


def plot_delta_curves(table: dict[str, Any], results_dir: str) -> str:
    """`delta_curves.png`: Δ(t) with its seed-level 95 % band against the RL step, for every
    paired comparison (not vs the start), at pass@1 and the primary k, on every split scored
    (held-out, training, sealed test prompts; one panel each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cur, k_prim = table["curves"], table["primary"]["k"]
    splits = [s for s in SPLITS if any(s in d for d in cur["differences"].values())]
    fig, axes = plt.subplots(len(splits), 2, figsize=(10, 3.6 * len(splits)), squeeze=False)
    for row, split in enumerate(splits):
        for col, k in enumerate((1, k_prim)):
            ax = axes[row][col]
            for name, d in cur["differences"].items():
                if name.endswith("SFT") or split not in d:
                    continue
                pts = d[split]["points"][str(k)]
                t = [p["step"] for p in pts]
                mean = np.array([100 * p["mean"] for p in pts])
                line, = ax.plot(t, mean, "o-", ms=3, label=f"{name} ({len(d['seeds'])})")
                if all(p["lo"] is not None for p in pts):
                    ax.fill_between(t, [100 * p["lo"] for p in pts],
                                    [100 * p["hi"] for p in pts], alpha=0.15,
                                    color=line.get_color())
            ax.axhline(0, color="k", lw=0.6)
            ax.set_title(f"{SPLIT_NAMES[split]} pass@{k}")
            ax.set_xlabel("RL step")
            ax.set_ylabel("Δ (pp), 95 % band over seeds")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(results_dir, "delta_curves.png")
    _save(fig, path, table)
    plt.close(fig)
    return path


def plot_regime(out: dict[str, Any], results_dir: str, stem: str = "regime_map"
                ) -> str | None:
    """Heatmaps (rows P, columns N0) of the first compared method − baseline at pass@1 and
    at the largest k, annotated with the mean and the 95 % CI; with a θ axis (cells at more
    than one θ), the differences against θ with their CIs, one line per (P, N0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(out["cells"].values())
    if not cells or not cells[0]["paired"]:
        return None
    arm = next(iter(cells[0]["paired"]))
    if len({c.get("theta") for c in cells}) > 1:
        return _plot_thresholds(cells, arm, out["methods"][0], results_dir, stem, out)
    ps = sorted({c["P"] for c in cells})
    ns = sorted({c["N0"] for c in cells})
    kmax = list(cells[0]["paired"][arm]["eval"])[-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, k in zip(axes, ("1", kmax)):
        grid = np.full((len(ps), len(ns)), np.nan)
        text = {}
        for c in cells:
            if arm not in c["paired"]:
                continue
            e = c["paired"][arm]["eval"][k]
            i, j = ps.index(c["P"]), ns.index(c["N0"])
            grid[i, j] = 100 * e["mean"]
            text[i, j] = (f"{100 * e['mean']:+.1f}\n[{100 * e['lo']:+.1f}, "
                          f"{100 * e['hi']:+.1f}]\nn_max {c['n_max']}")
        lim = max(1.0, float(np.nanmax(np.abs(grid)))) if np.isfinite(grid).any() else 1.0
        im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, origin="lower")
        for (i, j), t in text.items():
            ax.text(j, i, t, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(ns)), [str(n) for n in ns])
        ax.set_yticks(range(len(ps)), [str(p) for p in ps])
        ax.set_xlabel("N0 (rollouts per prompt; n_max tied)")
        ax.set_ylabel("P (prompts per step)")
        ax.set_title(f"{arm} − {out['methods'][0]}: held-out pass@{k} (points)")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    path = os.path.join(results_dir, f"{stem}.png")
    _save(fig, path, out)
    plt.close(fig)
    return path


def _plot_thresholds(cells: list[dict], arm: str, base: str, results_dir: str, stem: str,
                     out: dict[str, Any]
                     ) -> str:
    import matplotlib.pyplot as plt

    kmax = list(cells[0]["paired"][arm]["eval"])[-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    shapes = sorted({(c["P"], c["N0"], c["n_max"]) for c in cells})
    for ax, k in zip(axes, ("1", kmax)):
        for shape in shapes:
            row = sorted((c for c in cells if (c["P"], c["N0"], c["n_max"]) == shape
                          and arm in c["paired"] and c.get("theta") is not None),
                         key=lambda c: c["theta"])
            if not row:
                continue
            e = [c["paired"][arm]["eval"][k] for c in row]
            mean = np.array([100 * x["mean"] for x in e])
            err = np.array([[100 * (x["mean"] - x["lo"]) for x in e],
                            [100 * (x["hi"] - x["mean"]) for x in e]])
            ax.errorbar([c["theta"] for c in row], mean, yerr=err, marker="o", capsize=3,
                        label=f"P {shape[0]}, N0 {shape[1]}, n_max {shape[2]}")
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_xlabel("θ (active-set threshold)")
        ax.set_ylabel("points")
        ax.set_title(f"{arm} − {base}: held-out pass@{k}, 95 % CI")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(results_dir, f"{stem}.png")
    _save(fig, path, out)
    plt.close(fig)
    return path


def plot_frontier(out: dict[str, Any], path: str) -> str:
    """`frontier.png`: per arm, pass@k against pass@1 on the primary endpoint's split
    (held-out unless `out["split"]` says otherwise) over the lr grid (one point per lr, 95 % t
    intervals over seeds on both axes, labelled by lr), with the start (uniform's lr -> 0
    point) and the blind control."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = f"pass@{out['k']}"
    fig, ax = plt.subplots(figsize=(6, 4.5))
    arms = list(dict.fromkeys(a for e in out["lrs"].values() for a in e["points"]))
    for arm in arms:
        rows = sorted((e["lr"], e["points"][arm]) for e in out["lrs"].values()
                      if arm in e["points"])
        x = np.array([100 * p["pass@1"]["mean"] for _, p in rows])
        y = np.array([100 * p[key]["mean"] for _, p in rows])

        def err(f: str, rows: list = rows) -> np.ndarray | None:
            if any(p[f]["lo"] is None for _, p in rows):
                return None
            return np.array([[100 * (p[f]["mean"] - p[f]["lo"]) for _, p in rows],
                             [100 * (p[f]["hi"] - p[f]["mean"]) for _, p in rows]])

        ax.errorbar(x, y, xerr=err("pass@1"), yerr=err(key), fmt="o-" if arm != NULL else "x:",
                    ms=4, capsize=2, label=arm)
        for (lr, _), xi, yi in zip(rows, x, y, strict=True):
            ax.annotate(f"{lr:g}", (xi, yi), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    w = words(out.get("study"))
    for name, marker, label in (("sft", "*", f"{w.start_long} (lr -> 0)"),
                                ("blind", "x", f"blind ({w.blind} guesser)")):
        p = out.get(name)
        if p:
            ax.plot([100 * p["pass@1"]], [100 * p[key]], marker, ms=9 if name == "sft" else 7,
                    color="k" if name == "sft" else "0.45", label=label)
    # Percentages: a 2-seed t interval can reach far past [0, 100]; keep the points readable.
    ax.set_xlim(left=0)
    ax.set_ylim(0, 100)
    where = SPLIT_NAMES[out.get("split", "eval")]
    ax.set_xlabel(f"{where} pass@1 (%)")
    ax.set_ylabel(f"{where} {key} (%)")
    ax.set_title(f"lr frontier (last {out['window']} points; 95 % t over seeds)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path, out)
    plt.close(fig)
    return path
