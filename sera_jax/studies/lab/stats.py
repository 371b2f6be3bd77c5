"""Paired comparisons over seeds: differences, 95 % confidence intervals, verdicts.

Seeds are the unit of replication: for seed s both methods share the task instance, the
initial policy, the data order and the rollout uniforms, so the paired difference
d_s = metric(method, s) − metric(reference, s) removes the between-seed variation.

* `paired_t_ci`: mean(d) ± t_{0.975, S−1} · sd(d)/√S (Student t over seeds, sd with ddof 1).
* `paired_bootstrap_ci`: percentile interval of mean(d) over `num_resamples` resamples of
  the S seeds with replacement (a fixed NumPy generator, so it is reproducible).

A difference whose interval contains 0 is reported as "no difference".
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats as scipy_stats


@dataclasses.dataclass(frozen=True)
class Paired:
    """mean of the paired differences, its 95 % interval [lo, hi] and the number of seeds."""

    mean: float
    lo: float
    hi: float
    n: int
    method: str = "t"

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.lo > 0 or self.hi < 0

    def fmt(self, scale: float = 1.0, digits: int = 2) -> str:
        """'+1.23 [+0.40, +2.06]' (or with ' (n.s.)' when the interval contains 0)."""
        m, lo, hi = (scale * x for x in (self.mean, self.lo, self.hi))
        tag = "" if self.significant else " (n.s.)"
        return f"{m:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{tag}"


def _diffs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"need two paired 1-D samples of >= 2 seeds, got {a.shape}, {b.shape}")
    return a - b


def paired_t_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> Paired:
    """Mean of a − b over seeds with the Student-t interval mean ± t·sd/√S."""
    d = _diffs(a, b)
    n = d.size
    half = scipy_stats.t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / np.sqrt(n)
    return Paired(float(d.mean()), float(d.mean() - half), float(d.mean() + half), n, "t")


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95,
                        num_resamples: int = 10_000, seed: int = 0) -> Paired:
    """Mean of a − b with the percentile interval of resampled seed means."""
    d = _diffs(a, b)
    idx = np.random.default_rng(seed).integers(0, d.size, (num_resamples, d.size))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return Paired(float(d.mean()), float(lo), float(hi), d.size, "bootstrap")


def paired(a: np.ndarray, b: np.ndarray, method: str = "t") -> Paired:
    """`paired_t_ci` (method 't') or `paired_bootstrap_ci` ('bootstrap')."""
    if method == "t":
        return paired_t_ci(a, b)
    if method == "bootstrap":
        return paired_bootstrap_ci(a, b)
    raise ValueError(f"ci={method!r}; allowed 't' or 'bootstrap'")


def winner(samples: dict[str, np.ndarray], method: str = "t") -> tuple[str, list[str]]:
    """The method with the highest mean, and the methods not separable from it (the paired
    interval of best − other contains 0). `samples`: name -> per-seed values (paired)."""
    names = list(samples)
    best = max(names, key=lambda n: float(np.mean(samples[n])))
    ties = [n for n in names if n != best
            and not paired(samples[best], samples[n], method).significant]
    return best, ties
