r"""Allocation demo: the methods of `sera_jax.methods` on a realistic batch of success
probabilities.

A batch whose p̂ piles up near 0 and 1 (Beta(0.3, 0.3) plus a few 1e-6 / 1 - 1e-6 prompts)
gets the same rollout budget B = P·N0 from each method of `config.compare.methods`
(`configs/allocation_demo/default.py`: uniform = plain MaxRL, sera = dynamic active set, the
paper's default, and sera_equalized = every prompt active). `run(config, workdir)` returns a
table of p̂, N_q, κ_q, w_q for a readable subset of prompts (sorted by p̂) and a summary (min
/ mean κ, spread, active count), and writes the tables (``allocation_demo.md``) and a plot
of κ and N_q against p̂ (``allocation_demo.png``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from sera_jax import methods as methods_lib
from sera_jax import validation
from sera_jax.allocation import Allocation
from sera_jax.scaling import kappa
from sera_jax.studies import common


def synthetic_success_probs(key: jax.Array, num: int) -> np.ndarray:
    """float64[num]: Beta(0.3, 0.3) (U-shaped: most mass near 0 and 1) with 2% of the
    prompts replaced by the extremes 1e-6 and 1 - 1e-6."""
    k_beta, k_ext, k_side = jax.random.split(key, 3)
    p = np.asarray(jax.random.beta(k_beta, 0.3, 0.3, (num,)), np.float64)
    ext = np.asarray(jax.random.bernoulli(k_ext, 0.02, (num,)))
    side = np.asarray(jax.random.bernoulli(k_side, 0.5, (num,)))
    return np.where(ext, np.where(side, 1 - 1e-6, 1e-6), p)


def summarize(p: np.ndarray, alloc: Allocation) -> dict[str, float]:
    """min / mean / spread / std of κ over active prompts, active count, bound fractions."""
    counts = np.asarray(alloc.counts)
    act = counts > 0
    kap = np.asarray(kappa(p, counts), np.float64)[act]
    return {
        "min κ": float(alloc.kappa_min),
        "mean κ": float(alloc.kappa_mean),
        "spread (max−min κ)": float(kap.max() - kap.min()),
        "std κ": float(kap.std()),
        "active": int(alloc.num_active),
        "at n_min": float(alloc.frac_at_n_min),
        "at n_max": float(alloc.frac_at_n_max),
    }


def _fmt_p(x: float) -> str:
    """Readable near both ends: 3.2e-05, 0.41, 1-1e-06."""
    return f"1-{1 - x:.2g}" if x > 0.99 else f"{x:.3g}"


def markdown_tables(p: np.ndarray, allocs: dict[str, Allocation], rows: int) -> str:
    """Per-prompt rows (a spread of `rows` prompts sorted by p̂: N, κ, w per method) and the
    per-method summary, as markdown."""
    order = np.argsort(p, kind="stable")
    shown = order[np.unique(np.linspace(0, len(p) - 1, min(rows, len(p))).round().astype(int))]
    names = list(allocs)
    head = "| q | p̂ | " + " | ".join(f"N {n} | κ {n} | w {n}" for n in names) + " |"
    lines = [head, "|" + "---|" * (2 + 3 * len(names))]
    for q in shown:
        cells = [f"{q}", _fmt_p(p[q])]
        for n in names:
            c = int(allocs[n].counts[q])
            cells += [f"{c}", f"{float(kappa(p[q], c)):.4f}", f"{float(allocs[n].weights[q]):.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    stats = {n: summarize(p, a) for n, a in allocs.items()}
    keys = list(next(iter(stats.values())))
    lines += ["", "| method | " + " | ".join(keys) + " |", "|" + "---|" * (1 + len(keys))]
    for n, s in stats.items():
        lines.append(f"| {n} | " + " | ".join(
            f"{v}" if isinstance(v, int) else f"{v:.4f}" for v in s.values()) + " |")
    return "\n".join(lines)


def plot(p: np.ndarray, allocs: dict[str, Allocation], path: str) -> None:
    """κ and N_q against p̂ (logit axis) per method, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = np.argsort(p)
    x = np.clip(p[order], 1e-7, 1 - 1e-7)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, alloc in allocs.items():
        counts = np.asarray(alloc.counts)[order]
        kap = np.asarray(kappa(p[order], counts))
        act = counts > 0
        axes[0].plot(x[act], kap[act], ".", ms=4, label=name)
        axes[1].plot(x, counts, ".", ms=4, label=name)
    for ax, ylabel in zip(axes, ["κ(p̂, N_q)  (active prompts)", "N_q"]):
        ax.set_xscale("logit")
        ax.set_xlabel("p̂ (logit scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[1].set_yscale("symlog", linthresh=2)
    axes[1].set_ylim(0, 1.5 * max(int(np.asarray(a.counts).max()) for a in allocs.values()))
    budget = int(np.asarray(next(iter(allocs.values())).counts).sum())
    fig.suptitle(f"P = {len(p)}, budget = {budget}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def validate(config: ml_collections.ConfigDict) -> None:
    """Every field `run` reads: StudyError naming the field and what is allowed."""
    common.renamed_fields(config)
    c = functools.partial(validation.check, error=common.StudyError)
    r, a = config.rl, config.rl.allocation
    for field, value in (("rl.prompts_per_step", r.prompts_per_step),
                         ("rl.rollouts_per_prompt", r.rollouts_per_prompt),
                         ("rows", config.rows)):
        c(validation.is_positive_int(value), field, value, "an integer >= 1")
    c(validation.is_int(a.n_min) and validation.is_int(a.n_max)
      and 2 <= a.n_min <= r.rollouts_per_prompt <= a.n_max, "rl.rollouts_per_prompt",
      r.rollouts_per_prompt, f"n_min={a.n_min} <= N0 <= n_max={a.n_max}, n_min >= 2")
    c(validation.is_int(config.seed), "seed", config.seed, "an integer")
    names = config.compare.methods
    c(isinstance(names, tuple | list) and len(names) >= 1 and len(set(names)) == len(names),
      "compare.methods", names, "a tuple of distinct method names, e.g. ('uniform', 'sera')")
    for name in names:
        try:
            method = methods_lib.get_method(name)
        except ValueError as e:
            raise common.StudyError(f"config.compare.methods: {e}") from None
        c(not (method.two_stage or method.dynamic_sampling), "compare.methods", name,
          "one-shot methods without dynamic sampling: the demo allocates from p̂ alone, "
          "with no rollouts")


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Allocate with each method of `config.compare.methods`, write
    ``allocation_demo.{md,png}``; returns {'summary': the tables, 'allocations'}. Inputs are
    checked first (`validate`)."""
    validate(config)
    num_prompts, n0 = config.rl.prompts_per_step, config.rl.rollouts_per_prompt
    n_min, n_max = config.rl.allocation.n_min, config.rl.allocation.n_max
    chosen = [methods_lib.get_method(m) for m in config.compare.methods]
    workdir = common.prepare_workdir(workdir)
    p = synthetic_success_probs(jax.random.key(config.seed), num_prompts)
    budget = num_prompts * n0
    allocs = {}
    for m in chosen:
        a = m.allocate(p, budget, n_min=n_min, n_max=n_max)
        allocs[m.name] = a.replace(weights=m.prompt_weights(a.counts, a.weights))
    text = markdown_tables(p, allocs, config.rows)
    header = (f"# Allocation demo\n\nP = {num_prompts}, N0 = {n0}, budget = {budget}, "
              f"n_min = {n_min}, n_max = {n_max}, seed = {config.seed}\n\n")
    with open(os.path.join(workdir, "allocation_demo.md"), "w") as f:
        f.write(header + text + "\n")
    plot(p, allocs, os.path.join(workdir, "allocation_demo.png"))
    return {"summary": header + text, "allocations": allocs}
