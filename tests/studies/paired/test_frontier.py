"""The lr frontier's arithmetic: points above a reference frontier, the lr rule, the table."""

import pytest

from sera_jax.studies.paired import frontier


def _e(mean, lo=None, hi=None):
    return {"mean": mean, "lo": lo, "hi": hi, "seeds": 2}


def test_above_frontier_interpolates_and_refuses_to_extrapolate():
    ref = [(0.2, 0.5), (0.1, 0.8)]  # unsorted on purpose
    got = frontier.above_frontier([(0.15, 0.7), (0.2, 0.45), (0.05, 0.9), (0.3, 0.1)], ref)
    assert got[0] == pytest.approx(0.7 - 0.65)
    assert got[1] == pytest.approx(-0.05)
    assert got[2] is None and got[3] is None


def _out(gates, uniform_k, sera=None):
    lrs = {}
    for i, (lr, passes) in enumerate(gates.items()):
        pts = {"uniform": {"pass@1": _e(0.1 * (i + 1)), "pass@64": _e(uniform_k[i])}}
        if sera:
            pts["sera"] = {"pass@1": _e(sera[i][0]), "pass@64": _e(sera[i][1])}
        lrs[f"{lr:g}"] = {"lr": lr, "points": pts,
                          "gate": {"passes": passes, "outcome": "PASS" if passes else "FAIL"}}
    return {"methods": ["uniform"] + (["sera"] if sera else []), "k": 64, "window": 3,
            "metric": "m", "rule": "r", "lrs": lrs}


def test_selected_lr_is_the_baselines_best_among_gate_passing_lrs():
    # The best uniform pass@64 (lr 1e-6) fails the gate: it is not admissible.
    out = _out({1e-6: False, 1e-5: True, 1e-4: True}, [0.9, 0.8, 0.7])
    s = frontier.summarise(out, "uniform", 64)
    assert s["selected_lr"] == 1e-5 and s["admissible"] == ["1e-05", "0.0001"]
    assert frontier.summarise(_out({1e-5: False}, [0.9]), "uniform", 64)["selected_lr"] is None


def test_sera_points_are_measured_against_uniforms_frontier_and_tabled():
    out = _out({1e-5: True, 1e-4: True}, [0.8, 0.6], sera=[(0.15, 0.75), (0.25, 0.6)])
    out.update(frontier.summarise(out, "uniform", 64))
    above = out["above_baseline_frontier"]["sera"]
    assert above["1e-05"] == pytest.approx(0.75 - 0.7) and above["0.0001"] is None
    md = frontier.frontier_markdown(out)
    assert "Selected: 1e-05." in md and "| 0.0001 | sera | 2 | 25.00 | 60.00 |" in md
    assert "lr 1e-05: +5.00 pp" in md and "outside uniform's pass@1 range" in md


def test_matched_lr_follows_the_written_rule():
    from sera_jax.studies.paired import matched

    pts = [(1e-5, 0.02), (3e-6, 0.009), (3e-5, 0.05)]  # unsorted on purpose
    # Between 3e-6 (gain 0.009) and 1e-5 (0.02): linear in log lr.
    got = matched.matched_lr(pts, 0.0145)
    t = (0.0145 - 0.009) / (0.02 - 0.009)
    assert got["lr"] == pytest.approx(3e-6 * (1e-5 / 3e-6) ** t) and got["segment"] == [3e-6, 1e-5]
    # Below the smallest lr: linear in lr from the SFT start (0, 0).
    low = matched.matched_lr(pts, 0.0039)
    assert low["lr"] == pytest.approx(3e-6 * 0.0039 / 0.009) and low["segment"] == [0.0, 3e-6]
    # Exactly at a grid point; the first crossing of a non-monotone gain.
    assert matched.matched_lr(pts, 0.02)["lr"] == pytest.approx(1e-5)
    bumpy = [(1e-6, 0.01), (1e-5, 0.03), (1e-4, 0.015)]
    assert matched.matched_lr(bumpy, 0.02)["segment"] == [1e-6, 1e-5]
    # No positive gain, or beyond the grid: none (no extrapolation).
    assert matched.matched_lr(pts, -0.001)["lr"] is None
    assert "no extrapolation" in matched.matched_lr(pts, 0.08)["reason"]


def test_matched_lr_is_read_from_the_frontier_output():
    from sera_jax.studies.paired import matched

    out = _out({3e-6: True, 1e-5: True}, [0.8, 0.7], sera=[(0.0545, 0.83), (0.08, 0.7)])
    out["sft"] = {"pass@1": 0.04, "pass@64": 0.84}
    # uniform pass@1: 0.1 (gain 0.06) and 0.2 (0.16); SERA at 3e-6: 0.0545 (gain 0.0145).
    c = matched.choose_matched_lr(out, "sera", "uniform", 3e-6)
    assert c["target_gain"] == pytest.approx(0.0145)
    assert c["lr"] == pytest.approx(3e-6 * 0.0145 / 0.06) and c["segment"] == [0.0, 3e-6]
    with pytest.raises(Exception, match="no sera point at lr 3e-05"):
        matched.choose_matched_lr(out, "sera", "uniform", 3e-5)


def test_frontier_distance_includes_the_start_and_has_a_seed_bootstrap_ci():
    ref = [([0.10, 0.12], [0.70, 0.72]), ([0.20, 0.22], [0.60, 0.58])]
    start = (0.05, 0.84)
    target = ([0.07, 0.09], [0.82, 0.80])
    d = frontier.frontier_distance(ref, start, target, num_resamples=500, seed=0)
    # Uniform's frontier at pass@1 0.08: between the start (0.05, 0.84) and (0.11, 0.71).
    expected = 0.81 - (0.84 + (0.08 - 0.05) / (0.11 - 0.05) * (0.71 - 0.84))
    assert d["mean"] == pytest.approx(expected)
    assert d["lo"] < d["mean"] < d["hi"] and 0 < d["defined_share"] <= 1
    # Without the start SERA's pass@1 lies outside uniform's range: no distance.
    assert frontier.frontier_distance(ref, None, target, num_resamples=50)["mean"] is None


def test_config_lr_is_the_comparison_with_its_methods_seeds_and_null():
    from sera_jax import config_files

    cfg = config_files.get_config("configs/maze/cpu_read.py")
    own = cfg.rl.optimizer.learning_rate
    methods, seeds, per = frontier.lr_arms(cfg, own)
    assert methods == ["uniform", "sera"] and seeds == list(cfg.compare.seeds) and per == {}
    assert frontier.lr_dir(cfg, "/w", own) == "/w"
    assert tuple(frontier.lr_config(cfg, own).compare.null_seeds) == tuple(cfg.compare.null_seeds)
    other = 3e-5
    assert frontier.lr_arms(cfg, other) == (["uniform"], list(cfg.frontier.seeds), {})
    assert tuple(frontier.lr_config(cfg, other).compare.null_seeds) == (0, 1)
    assert frontier.lr_dir(cfg, "/w", other) == "/w/frontier/lr3e-05"
    assert frontier.all_methods(cfg) == ["uniform", "sera"]
    cfg.rl.optimizer.learning_rate = 2e-5  # off the grid: uniform only, everywhere
    assert frontier.all_methods(cfg) == ["uniform"]
