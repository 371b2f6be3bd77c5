"""The published SERA allocator, written the straightforward way in NumPy (float64).

This is the baseline of ``allocation_bench.py`` and a reference for the tests: the
algorithm as SERA_SPEC §3 describes the paper's code -- 100 bisection steps in log τ over
``[(n_min - s) min λ, (n_max - s) max λ]``, floor + squared-error rounding, and the
dynamic active set found by a binary search over k, each candidate re-solved from scratch.
"""

from __future__ import annotations

import numpy as np


def _lam(p: np.ndarray) -> np.ndarray:
    tiny = np.finfo(np.float64).tiny
    return -np.log1p(-np.clip(p, tiny, np.nextafter(1.0, 0.0)))


def waterline_bisect(p, budget, n_min, n_max, shift=1, steps=100):
    """τ by bisection in log τ; returns (τ, continuous counts) with Σ counts <= budget."""
    lam = _lam(p)
    lo = np.log((n_min - shift) * lam.min())
    hi = np.log((n_max - shift) * lam.max())
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        n = np.clip(shift + np.exp(mid) / lam, n_min, n_max)
        if n.sum() > budget:
            hi = mid
        else:
            lo = mid
    tau = np.exp(lo)
    return tau, np.clip(shift + tau / lam, n_min, n_max)


def round_squared_error(p, cont, tau, budget, n_min, n_max, shift=1):
    """Floor, then +1 for the R prompts with the smallest change of (κ - κ*)^2, ties by index."""
    n = np.clip(np.floor(cont), n_min, n_max).astype(np.int64)
    r = int(budget - n.sum())
    if r > 0:
        k_star = -np.expm1(-tau)
        kap = lambda m: -np.expm1((m - shift) * np.log1p(-p))
        delta = (kap(n + 1) - k_star) ** 2 - (kap(n) - k_star) ** 2
        delta = np.where(n < n_max, delta, np.inf)
        n[np.argsort(delta, kind="stable")[:r]] += 1
    return n


def mixed(p, n):
    return 1.0 - (1.0 - p) ** n - p**n


def allocate_published(p, budget, n_min, n_max, shift=1, threshold=0.05, dynamic=True):
    """Counts (int64[P]) of the published 'dynamic active equalised' (or all-active) mode."""
    p = np.asarray(p, np.float64)
    num = p.shape[0]

    def solve(idx):
        tau, cont = waterline_bisect(p[idx], budget, n_min, n_max, shift)
        return round_squared_error(p[idx], cont, tau, budget, n_min, n_max, shift)

    if not dynamic:
        return solve(np.arange(num))
    score = mixed(p, n_max)
    order = np.argsort(-score, kind="stable")
    n_elig = int((score >= threshold).sum())
    k_lo = -(-budget // n_max)
    best_k, lo, hi = k_lo, k_lo, max(n_elig, k_lo)
    while lo <= hi:
        mid = (lo + hi) // 2
        idx = order[:mid]
        if np.all(mixed(p[idx], solve(idx)) >= threshold):
            best_k, lo = mid, mid + 1
        else:
            hi = mid - 1
    counts = np.zeros(num, np.int64)
    idx = order[:best_k]
    counts[idx] = solve(idx)
    return counts
