"""The seed-level statistics of `sera_jax.studies.compare`: paired differences of per-seed
values (Student t and the one-level bootstrap), the winner with its ties, the interval's
printed form."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from sera_jax.studies import compare


def test_t_difference_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 1.0, 40), rng.normal(0.0, 1.0, 40)
    got = compare.seed_difference(a, b)
    ref = scipy_stats.ttest_rel(a, b)
    assert got["mean"] == pytest.approx(np.mean(a - b)) and got["method"] == "t"
    assert (got["lo"], got["hi"]) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert got["p"] == pytest.approx(ref.pvalue)
    assert got == {**compare.seed_interval(a - b), "method": "t"}
    assert compare.excludes_zero(got) and "(n.s.)" not in compare.format_interval(got)


def test_differences_are_taken_in_float64():
    """float32 inputs are cast before subtracting (the lab's per-seed pass@k are float32)."""
    a = np.array([0.1, 0.7, 0.35], np.float32)
    b = np.array([0.3, 0.2, 0.15], np.float32)
    got = compare.seed_difference(a, b)
    assert got["per_seed"] == (a.astype(np.float64) - b.astype(np.float64)).tolist()


def test_bootstrap_is_the_index_resample_close_to_t_and_reproducible():
    rng = np.random.default_rng(1)
    a = rng.normal(0.1, 1.0, 64)
    b = a + rng.normal(0.0, 0.3, 64)
    t, boot = compare.seed_difference(a, b), compare.seed_difference(a, b, "bootstrap")
    d = a - b
    idx = np.random.default_rng(0).integers(0, 64, (10_000, 64))
    lo, hi = np.quantile(d[idx].mean(axis=1), [(1 - 0.95) / 2, (1 + 0.95) / 2])
    assert (boot["lo"], boot["hi"]) == (lo, hi) and boot["method"] == "bootstrap"
    assert boot["lo"] == pytest.approx(t["lo"], abs=0.03)
    assert boot["hi"] == pytest.approx(t["hi"], abs=0.03)
    assert compare.seed_difference(a, b, "bootstrap") == boot
    assert not compare.excludes_zero(t) and compare.format_interval(t).endswith("(n.s.)")
    with pytest.raises(ValueError, match="finite"):
        compare.seed_bootstrap([1.0, np.nan])


def test_winner_and_validation():
    base = np.linspace(0, 1, 16)
    samples = {"a": base, "b": base + 1.0, "c": base + 1.0 + 1e-3 * np.sin(np.arange(16))}
    best, ties = compare.winner(samples)
    assert best in ("b", "c") and ties == [{"b": "c", "c": "b"}[best]]
    with pytest.raises(ValueError, match="paired"):
        compare.seed_difference(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="paired"):
        compare.seed_difference(np.ones(1), np.ones(1))
    with pytest.raises(ValueError, match="ci="):
        compare.seed_difference(base, base, "wald")


def test_format_interval():
    e = {"mean": 1.234, "lo": 0.4, "hi": 2.06}
    assert compare.format_interval(e) == "+1.23 [+0.40, +2.06]"
    assert compare.format_interval(e, scale=100, digits=1) == "+123.4 [+40.0, +206.0]"
    assert compare.format_interval({**e, "lo": -0.1}) == "+1.23 [-0.10, +2.06] (n.s.)"
    assert compare.format_interval(compare.seed_interval([0.5])) == "+0.50 (no interval)"


def _groups(points, seeds=4):
    """Per lr, `seeds` identical per-seed values at each (x, y) point."""
    return [([x] * seeds, [y] * seeds) for x, y in points]


def test_frontier_gap_by_hand():
    ref = _groups([(0.1, 0.3), (0.3, 0.5)])
    # Parallel, 0.1 above: the gap is 0.1 everywhere on the overlap [0.1, 0.3].
    out = compare.frontier_gap(ref, _groups([(0.1, 0.4), (0.3, 0.6)]), num_resamples=50)
    assert out["overlap"] == (0.1, 0.3)
    assert out["mean"]["mean"] == pytest.approx(0.1)
    assert [lv["x"] for lv in out["levels"]] == pytest.approx([0.1 + 0.2 / 3, 0.1 + 0.4 / 3])
    assert all(lv["mean"] == pytest.approx(0.1) for lv in out["levels"])
    assert out["mean"]["lo"] == pytest.approx(0.1) and out["defined_share"] == 1.0
    # Crossing: target(x) = 0.2 + 2 (x − 0.1), reference(x) = 0.3 + (x − 0.1), so
    # g(x) = x − 0.2: −0.1 at 0.1, +0.1 at 0.3, mean 0 over the overlap.
    out = compare.frontier_gap(ref, _groups([(0.1, 0.2), (0.3, 0.6)]), num_resamples=50)
    assert out["mean"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert out["levels"][0]["mean"] == pytest.approx(0.1 + 0.2 / 3 - 0.2)
    # Only part of the target's range overlaps: no extrapolation past x = 0.3.
    out = compare.frontier_gap(ref, _groups([(0.2, 0.5), (0.5, 0.9)]), num_resamples=50)
    assert out["overlap"] == (0.2, 0.3)
    # The target line 0.5 + (x − 0.2)·0.4/0.3 minus the reference line 0.3 + (x − 0.1):
    tx = np.linspace(0.2, 0.3, 201)
    expect = np.mean((0.5 + (tx - 0.2) * 0.4 / 0.3) - (0.3 + (tx - 0.1)))
    assert out["mean"]["mean"] == pytest.approx(expect)
    # Disjoint frontiers: nothing to compare.
    out = compare.frontier_gap(ref, _groups([(0.5, 0.7), (0.6, 0.8)]))
    assert out["overlap"] is None and out["mean"]["mean"] is None


def test_frontier_gap_start_point_and_bootstrap_width():
    rng = np.random.default_rng(0)
    ref = [(rng.normal(x, 0.02, 16), rng.normal(y, 0.02, 16))
           for x, y in ((0.2, 0.5), (0.4, 0.6))]
    tgt = [(rng.normal(x, 0.02, 16), rng.normal(y + 0.05, 0.02, 16))
           for x, y in ((0.2, 0.5), (0.4, 0.6))]
    out = compare.frontier_gap(ref, tgt, num_resamples=400, seed=1)
    e = out["mean"]
    assert e["lo"] < e["mean"] < e["hi"] and e["lo"] > 0  # 0.05 above, seeds of sd 0.02
    paired = compare.frontier_gap(ref, tgt, num_resamples=400, seed=1, paired=True)
    assert paired["paired"] and paired["mean"]["mean"] == e["mean"]
    # The start (lr -> 0) joins both frontiers: it widens the overlap down to its x.
    start = compare.frontier_gap(ref, tgt, start=(0.05, 0.3), num_resamples=50)
    assert start["overlap"][0] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="same seed count"):
        compare.frontier_gap(ref, [(x[:8], y[:8]) for x, y in tgt], paired=True)
