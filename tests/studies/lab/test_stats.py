"""Paired differences and their 95 % intervals."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from sera_jax.studies.lab import stats


def test_t_interval_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
    got = stats.paired_t_ci(a, b)
    ref = scipy_stats.ttest_rel(a, b).confidence_interval(0.95)
    assert got.mean == pytest.approx(np.mean(a - b))
    assert (got.lo, got.hi) == pytest.approx((ref.low, ref.high))
    assert got.significant and "(n.s.)" not in got.fmt()


def test_bootstrap_close_to_t_and_reproducible():
    rng = np.random.default_rng(1)
    a = rng.normal(0.1, 1.0, 64)
    b = a + rng.normal(0.0, 0.3, 64)
    t, boot = stats.paired_t_ci(a, b), stats.paired_bootstrap_ci(a, b)
    assert boot.lo == pytest.approx(t.lo, abs=0.03) and boot.hi == pytest.approx(t.hi, abs=0.03)
    assert stats.paired_bootstrap_ci(a, b) == boot
    assert not t.significant and t.fmt().endswith("(n.s.)")


def test_winner_and_validation():
    base = np.linspace(0, 1, 16)
    samples = {"a": base, "b": base + 1.0, "c": base + 1.0 + 1e-3 * np.sin(np.arange(16))}
    best, ties = stats.winner(samples)
    assert best in ("b", "c") and ties == [{"b": "c", "c": "b"}[best]]
    with pytest.raises(ValueError, match="paired"):
        stats.paired_t_ci(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="ci="):
        stats.paired(base, base, "wald")
