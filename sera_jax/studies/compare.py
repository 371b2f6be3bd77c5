r"""Paired comparisons of policies evaluated with common random numbers: per-prompt pass@k,
paired bootstrap confidence intervals over prompts and seeds, the evaluation noise floor, the
null-control check and verdicts. Pure NumPy on host counts; reusable by every study whose
evaluation records per-prompt correct counts.

Definitions (n samples per prompt, c correct, M prompts, S seeds):

* per-prompt pass@k: `v[k, m] = 1 - C(n - c_m, k) / C(n, k)` (`sera_jax.metrics.pass_at_k`);
  the study's pass@k is `mean_m v[k, m]`.
* paired difference of arms A and B at seed s: `d[s, m] = v_A[s, m] - v_B[s, m]`, both scored
  with the same evaluation keys (common random numbers), so the per-prompt evaluation noise
  that the two policies share cancels. The estimate is `mean_{s, m} d[s, m]`.
* paired bootstrap (two-level): each resample draws S seeds and M prompts with replacement
  (the same prompt draw for every seed, so prompt difficulty stays paired across seeds) and
  takes the mean of `d` over the drawn (seed, prompt) pairs; the CI is the percentile
  interval of `num_resamples` resamples. With one seed it is the bootstrap over prompts.
* noise floor: one policy scored with two independent key sets, `d[m] = v_a[m] - v_b[m]`;
  its true mean is 0, so whatever it shows is evaluation noise. `floor[k] = max(|mean d|,
  half-width of its 95 % bootstrap CI)`. A difference whose magnitude is at most the floor
  is "no difference".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sera_jax.metrics import pass_at_k


def ks_for(n: int) -> list[int]:
    """k = 1, 2, 4, … up to n (and n itself), as in `metrics.pass_at_k_curve`."""
    ks = [1 << i for i in range(int(n).bit_length()) if 1 << i <= n]
    return ks if ks[-1] == n else ks + [int(n)]


def per_prompt_pass_at_k(num_correct: Any, n: int, ks: Sequence[int]) -> np.ndarray:
    """float64 `[K, *shape]`: unbiased pass@k of every prompt for each k (c in `[..., M]`)."""
    c = np.asarray(num_correct, np.int64)
    k = np.asarray(ks, np.int64).reshape((-1,) + (1,) * c.ndim)
    return pass_at_k(np.full(c.shape, int(n))[None], c[None], k)


def paired_bootstrap(diffs: Any, *, num_resamples: int = 2000, level: float = 0.95,
                     seed: int = 0) -> dict[str, Any]:
    """Mean and percentile CI of paired differences `diffs` `[S, M]` (or `[M]`) by the
    two-level bootstrap of the module docstring.

    Returns {mean, lo, hi, half_width, per_seed (mean over prompts of each seed), seeds,
    prompts}. `seed` makes the resamples reproducible (an explicit numpy Generator).
    """
    d = np.asarray(diffs, np.float64)
    if d.ndim == 1:
        d = d[None]
    if d.ndim != 2 or d.size == 0:
        raise ValueError(f"diffs must be [S, M] with S, M >= 1; got shape {d.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level={level}; must lie in (0, 1)")
    if num_resamples < 1:
        raise ValueError(f"num_resamples={num_resamples}; must be >= 1")
    s, m = d.shape
    rng = np.random.default_rng(seed)
    prompt_w = rng.multinomial(m, np.full(m, 1.0 / m), size=num_resamples) / m  # [R, M]
    seed_w = rng.multinomial(s, np.full(s, 1.0 / s), size=num_resamples) / s  # [R, S]
    per_seed = prompt_w @ d.T  # [R, S]: mean over the drawn prompts of each seed
    stats = np.sum(seed_w * per_seed, axis=1)
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(d.mean()), "lo": float(lo), "hi": float(hi),
            "half_width": float((hi - lo) / 2), "per_seed": d.mean(axis=1).tolist(),
            "seeds": int(s), "prompts": int(m)}


def paired_difference(correct_a: Any, correct_b: Any, n: int, ks: Sequence[int], *,
                      num_resamples: int = 2000, level: float = 0.95, seed: int = 0
                      ) -> dict[str, dict[str, Any]]:
    """`{str(k): paired_bootstrap(v_A - v_B)}` for per-seed per-prompt correct counts
    `[S, M]` of arms A and B (seed s of A paired with seed s of B, same evaluation keys);
    each entry also has `per_seed_ci` (the bootstrap over prompts of that seed alone)."""
    va = per_prompt_pass_at_k(np.atleast_2d(correct_a), n, ks)
    vb = per_prompt_pass_at_k(np.atleast_2d(correct_b), n, ks)
    if va.shape != vb.shape:
        raise ValueError(f"arms have different shapes {va.shape[1:]} and {vb.shape[1:]}")
    out = {}
    for i, k in enumerate(ks):
        d = va[i] - vb[i]
        entry = paired_bootstrap(d, num_resamples=num_resamples, level=level, seed=seed)
        entry["per_seed_ci"] = [
            [b["lo"], b["hi"]] for b in (paired_bootstrap(row, num_resamples=num_resamples,
                                                          level=level, seed=seed + 1 + j)
                                         for j, row in enumerate(d))]
        out[str(int(k))] = entry
    return out


def noise_floor(correct_a: Any, correct_b: Any, n: int, ks: Sequence[int], *,
                num_resamples: int = 2000, level: float = 0.95, seed: int = 0
                ) -> dict[str, dict[str, float]]:
    """One policy, two key sets: `{str(k): {diff, lo, hi, floor}}` with `floor = max(|diff|,
    CI half-width)` (the module docstring)."""
    out = {}
    for k, e in paired_difference(correct_a, correct_b, n, ks, num_resamples=num_resamples,
                                  level=level, seed=seed).items():
        out[k] = {"diff": e["mean"], "lo": e["lo"], "hi": e["hi"],
                  "floor": max(abs(e["mean"]), e["half_width"])}
    return out


def verdict(diff: Mapping[str, float], floor: float) -> str:
    """'better' / 'worse' when the CI excludes 0 *and* |mean| exceeds the noise floor, else
    'no difference'."""
    if diff["lo"] > 0 and diff["mean"] > floor:
        return "better"
    if diff["hi"] < 0 and -diff["mean"] > floor:
        return "worse"
    return "no difference"


def within_floor(diffs: Mapping[str, Mapping[str, float]],
                 floors: Mapping[str, Mapping[str, float]]) -> dict[str, bool]:
    """`{k: |mean difference| <= floor[k]}` (the null-control check, per k)."""
    return {k: abs(d["mean"]) <= floors[k]["floor"] for k, d in diffs.items() if k in floors}


__all__ = ["ks_for", "noise_floor", "paired_bootstrap", "paired_difference",
           "per_prompt_pass_at_k", "verdict", "within_floor"]
