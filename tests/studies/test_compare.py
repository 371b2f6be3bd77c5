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


# ----------------------------------------------------------------- equivalence and power

# Four per-seed differences: mean 0.00625, sd 0.0110868 (ddof 1), se 0.0055434; with 3 df,
# t_0.95 = 2.353363, so the 90 % t interval is 0.00625 ± 0.0130456 = [−0.0067956, 0.0192956].
DIFFS = [0.01, -0.005, 0.02, 0.0]


def test_tost_by_hand_and_against_scipy():
    out = compare.tost(DIFFS, 0.02)
    assert out["mean"] == pytest.approx(0.00625) and out["sd"] == pytest.approx(0.0110868, 1e-5)
    assert (out["lo"], out["hi"]) == pytest.approx((-0.0067956, 0.0192956), abs=1e-7)
    # Both one-sided tests reject at 5 %: (0.00625 ± 0.02)/0.0055434 = 4.7354 and −2.4804.
    assert out["p_lower"] == pytest.approx(scipy_stats.t.sf(4.7354, 3), 1e-3)
    assert out["p_upper"] == pytest.approx(scipy_stats.t.cdf(-2.4804, 3), 1e-3)
    assert out["p_lower"] == pytest.approx(
        scipy_stats.ttest_1samp(DIFFS, -0.02, alternative="greater").pvalue)
    assert out["p_upper"] == pytest.approx(
        scipy_stats.ttest_1samp(DIFFS, 0.02, alternative="less").pvalue)
    assert out["p"] == out["p_upper"] < 0.05 and out["equivalent"]
    # A margin of 0.015 lies inside the interval's upper end 0.0193: not equivalent, and the
    # upper one-sided test does not reject (p = 0.106 > 0.05).
    narrow = compare.tost(DIFFS, 0.015)
    assert not narrow["equivalent"] and narrow["p_upper"] == pytest.approx(0.10629, 1e-3)
    # The interval's test and the p-values agree across margins.
    for m in np.linspace(0.005, 0.04, 36):
        e = compare.tost(DIFFS, m)
        assert e["equivalent"] == (e["lo"] > -m and e["hi"] < m)


def test_tost_edges_and_validation():
    one = compare.tost([0.001], 0.02)  # one seed: no spread, no test
    assert one["lo"] is None and one["p"] is None and not one["equivalent"]
    flat = compare.tost([0.01, 0.01, 0.01], 0.02)  # sd 0: the interval is the point
    assert flat["equivalent"] and flat["p"] == 0.0
    assert not compare.tost([0.03, 0.03], 0.02)["equivalent"]
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="margin"):
            compare.tost(DIFFS, bad)
    with pytest.raises(ValueError, match="level"):
        compare.tost(DIFFS, 0.02, level=1.0)


def test_mde_uses_t_quantiles():
    # (t_0.975,3 + t_0.80,3) · sd/√4 = (3.182446 + 0.978472) / 2 for sd = 1.
    assert compare.mde(1.0, 4) == pytest.approx((3.182446 + 0.978472) / 2, 1e-6)
    assert compare.mde(1.0, 4) == pytest.approx(
        (scipy_stats.t.ppf(0.975, 3) + scipy_stats.t.ppf(0.8, 3)) / 2)
    # Many seeds: close to the normal quantiles (1.95996 + 0.84162) · sd/√n.
    assert compare.mde(0.1, 10_000) == pytest.approx(2.80158 * 0.1 / 100, 1e-3)
    assert compare.mde(0.0, 3) == 0.0
    assert compare.mde(1.0, np.int64(8)) < compare.mde(1.0, 4)
    for sd, n in ((1.0, 1), (-1.0, 4), (float("inf"), 4), (1.0, 2.5)):
        with pytest.raises(ValueError):
            compare.mde(sd, n)


def test_verdict_is_never_no_difference():
    up, down, wide = ({"mean": 0.03, "lo": 0.01, "hi": 0.05},
                      {"mean": -0.03, "lo": -0.05, "hi": -0.01},
                      {"mean": 0.01, "lo": -0.03, "hi": 0.05})
    assert compare.verdict(up) == "better" and compare.verdict(down) == "worse"
    assert compare.verdict(up, 0.02) == "better"
    assert compare.verdict(up, 0.04) == "inconclusive"  # clear of 0, inside the floor
    assert compare.verdict(wide) == "inconclusive"
    assert compare.verdict({"mean": 0.01, "lo": None, "hi": None}) == "inconclusive"
    eq = compare.tost(DIFFS, 0.02)
    e = compare.seed_interval(DIFFS)
    assert compare.verdict(e, None, eq) == "equivalent within ±0.02"
    assert compare.verdict(e, None, compare.tost(DIFFS, 0.015)) == "inconclusive"
    # Clear of 0 and inside the margin: the difference is named (tost still says inside).
    assert compare.verdict(up, None, {"margin": 0.1, "equivalent": True}) == "better"


def test_judge_collects_margin_tost_mde_and_verdict():
    e = compare.seed_interval(DIFFS)
    j = compare.judge(e, 0.02, None, level=0.95)
    assert j["verdict"] == "equivalent within ±0.02" and j["tost"]["level"] == 0.9
    assert j["mde"] == pytest.approx(compare.mde(e["sd"], 4)) and j["power"] == 0.8
    bare = compare.judge(e)
    assert bare["margin"] is None and bare["tost"] is None and bare["verdict"] == "inconclusive"
    one = compare.judge(compare.seed_interval([0.01]), 0.02)
    assert one["mde"] is None and one["verdict"] == "inconclusive"


def test_frontier_gap_pairs_by_seed_id_and_tests_equivalence():
    rng = np.random.default_rng(0)
    ref = [(rng.normal(x, 0.02, 8), rng.normal(y, 0.02, 8)) for x, y in ((0.2, 0.5), (0.4, 0.6))]
    tgt = [(rng.normal(x, 0.02, 8), rng.normal(y + 0.005, 0.02, 8))
           for x, y in ((0.2, 0.5), (0.4, 0.6))]
    same = [list(range(8))] * 2
    by_index = compare.frontier_gap(ref, tgt, paired=True, num_resamples=300, seed=3)
    by_id = compare.frontier_gap(ref, tgt, paired=True, num_resamples=300, seed=3,
                                 seed_ids=(same, same))
    assert by_id == by_index  # the same ids in the same order: the index draw
    # The target has 6 seeds at one lr (ids 2..7) and 8 at the other: paired where shared.
    short = [(x[2:], y[2:]) for x, y in tgt[:1]] + tgt[1:]
    ids = ([list(range(8))] * 2, [list(range(2, 8)), list(range(8))])
    mixed = compare.frontier_gap(ref, short, paired=True, num_resamples=300, seed=3,
                                 seed_ids=ids, margin=0.05)
    assert mixed["mean"]["lo"] < mixed["mean"]["mean"] < mixed["mean"]["hi"]
    t = mixed["mean"]["tost"]
    assert t["level"] == 0.9 and t["margin"] == 0.05
    assert t["lo"] >= mixed["mean"]["lo"] and t["hi"] <= mixed["mean"]["hi"]  # 90 % ⊂ 95 %
    assert t["equivalent"] == (t["lo"] > -0.05 and t["hi"] < 0.05)
    with pytest.raises(ValueError, match="seed_ids"):
        compare.frontier_gap(ref, short, paired=True, seed_ids=([list(range(8))] * 2, same))
    with pytest.raises(ValueError, match="same seed count"):
        compare.frontier_gap(ref, short, paired=True)


def test_bootstrap_tost_by_hand():
    stats = np.linspace(-0.01, 0.03, 401)  # 5 % and 95 % quantiles: −0.008 and 0.028
    out = compare.bootstrap_tost(0.01, stats, 0.03)
    assert (out["lo"], out["hi"]) == pytest.approx((-0.008, 0.028)) and out["equivalent"]
    assert not compare.bootstrap_tost(0.01, stats, 0.02)["equivalent"]
    assert compare.bootstrap_tost(None, stats, 0.03) == {
        "margin": 0.03, "level": 0.9, "lo": None, "hi": None, "equivalent": False}
