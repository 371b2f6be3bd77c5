"""Equivalence margins, TOST and MDE in the paired study's verdicts; the frontier-to-frontier
gap; per-method frontier seeds (`frontier.method_seeds`)."""

import ml_collections
import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired import config as pconfig
from sera_jax.studies.paired import curves, frontier, gap, recompute, spec, tables
from tests import util


def _tiny():
    return config_files.get_config("configs/maze/tiny.py")


# ----------------------------------------------------------------------------- config


def test_margins_are_validated():
    cfg = _tiny()
    pconfig.validate_compare(cfg)  # None: no margin registered
    pconfig.validate_frontier(cfg)
    for value in (0.02, 0.5):
        pconfig.validate_compare(util.set_field(_tiny(), "compare.margin", value))
        pconfig.validate_frontier(util.set_field(_tiny(), "frontier.margin", value))
    for value in (0.0, 1.0, -0.02, 2, True, "0.02", float("nan")):
        bad = _tiny()
        del bad.compare["margin"]  # the placeholder refuses a str or bool itself
        bad.compare.margin = value
        with pytest.raises(common.StudyError, match="compare.margin"):
            pconfig.validate_compare(bad)
    bad = _tiny()
    del bad.frontier["margin"]
    bad.frontier.margin = 1.5
    with pytest.raises(common.StudyError, match="frontier.margin"):
        pconfig.validate_frontier(bad)
    low = util.set_field(util.set_field(_tiny(), "compare.margin", 0.02), "compare.level", 0.5)
    with pytest.raises(common.StudyError, match="compare.level"):
        pconfig.validate_compare(low)


def test_margins_are_hashed_only_when_set():
    cfg = _tiny()
    cfg.compare.primary.k = 8
    base_cmp, base_front = spec.comparison_spec(cfg), spec.frontier_spec(cfg)
    absent = _tiny()
    del absent.compare["margin"], absent.frontier["margin"], absent.frontier["method_seeds"]
    assert spec.comparison_spec(absent) == base_cmp  # None = absent: old hashes hold
    assert spec.frontier_spec(absent) == base_front
    assert "margin" not in base_front and "method_seeds" not in base_front
    assert "method_seeds" not in base_front["at_config_lr"]
    marked = util.set_field(_tiny(), "compare.margin", 0.02)
    assert spec.comparison_spec(marked)["config_hash"] != base_cmp["config_hash"]
    assert spec.comparison_spec(marked)["fields"]["compare"]["margin"] == 0.02
    fm = spec.frontier_spec(util.set_field(_tiny(), "frontier.margin", 0.015))
    assert fm["margin"] == 0.015 and "90 % bootstrap interval" in fm["gap_rule"]
    assert fm["config_hash"] == base_front["config_hash"]  # the runs are the same


# ----------------------------------------------------------------------- method seeds


def _with_seeds(**per):
    cfg = _tiny()
    cfg.frontier.methods = ("uniform", "sera", "vip")
    cfg.frontier.method_seeds = ml_collections.ConfigDict(per)
    return cfg


def test_method_seeds_thread_through_the_arms_and_the_spec():
    cfg = _with_seeds(sera=(0, 1, 2, 3), vip=(0, 1))
    own = cfg.rl.optimizer.learning_rate
    other = [lr for lr in spec.frontier_learning_rates(cfg) if lr != own][0]
    methods, seeds, per = spec.lr_arms(cfg, other)
    assert methods == ["uniform", "sera", "vip"] and seeds == [0, 1, 2]
    assert per == {"sera": [0, 1, 2, 3], "vip": [0, 1]}
    got = dict(spec.arms(spec.lr_config(cfg, other), methods, seeds, per))
    assert got == {"uniform": [0, 1, 2], "sera": [0, 1, 2, 3], "vip": [0, 1],
                   spec.NULL: [0, 1]}
    # The config's own lr: the compared methods keep compare.seeds; vip (not compared) its own.
    methods, seeds, per = spec.lr_arms(cfg, own)
    assert seeds == list(cfg.compare.seeds) and per == {"vip": [0, 1]}
    assert dict(spec.arms(spec.lr_config(cfg, own), methods, seeds, per))["sera"] == seeds
    fs = spec.frontier_spec(cfg)
    assert fs["method_seeds"] == {"sera": [0, 1, 2, 3], "vip": [0, 1]}
    assert fs["at_config_lr"]["method_seeds"] == {"vip": [0, 1]}
    pconfig.validate_frontier(cfg)
    # A plain dict works as well as a ConfigDict.
    plain = _tiny()
    plain.frontier.method_seeds = {"sera": (0, 5)}
    assert spec.frontier_method_seeds(plain) == {"sera": [0, 5]}


@pytest.mark.parametrize("per, match", [
    ({"sera_evidence": (0, 1)}, "a method of frontier.methods"),
    ({"sera": ()}, "frontier.method_seeds.sera is empty"),
    ({"sera": (0, -1)}, "frontier.method_seeds.sera"),
    ({"sera": "0,1"}, "frontier.method_seeds.sera"),
])
def test_method_seeds_are_validated(per, match):
    cfg = _with_seeds(**per)
    with pytest.raises(common.StudyError, match=match):
        pconfig.validate_frontier(cfg)
    not_a_map = _tiny()
    del not_a_map.frontier["method_seeds"]
    not_a_map.frontier.method_seeds = (0, 1)
    with pytest.raises(common.StudyError, match="a mapping method -> tuple of seeds"):
        spec.frontier_method_seeds(not_a_map)


def test_method_seeds_overrides_of_a_set_key_parse_and_new_keys_are_refused():
    cfg = config_files.get_config("configs/maze/frontiers.py")
    assert common.unknown_override(["--config.frontier.method_seeds.vip=(0,1)"], cfg) is None
    assert common.unknown_override(["--config.frontier.margin=0.02"], _tiny()) is None
    assert common.unknown_override(["--config.compare.margin=0.02"], _tiny()) is None
    msg = common.unknown_override(["--config.frontier.method_seeds.sera=(0,1)"], _tiny())
    assert "no field 'frontier.method_seeds.sera'" in msg


# ------------------------------------------------------------------------ the primary


def _recs(values, steps, m=6):
    """{seed: {step: record}} with per-prompt correct counts `values[seed][t]`."""
    return {s: {t: {"num_correct": [int(v)] * m, "num_samples": 8} for t, v in zip(steps, row)}
            for s, row in enumerate(values)}


def test_primary_carries_margin_tost_mde_and_verdict():
    cfg = _tiny()
    cfg.eval.train_prompts = 0
    cfg.compare.margin = 0.3
    steps = spec.eval_steps(cfg)  # [0, 2, 3]
    # Correct counts of 8 samples: pass@8 is 0 at c = 0 and 1 at c >= 1. Window (last 2
    # points): seed 0 SERA 1 vs uniform 0, seed 1 0.5 vs 0.5: differences 1 and 0.
    base = [[0, 0, 0], [0, 0, 1]]
    sera = [[0, 1, 1], [0, 0, 1]]
    recs = {"uniform": _recs(base, steps), "sera": _recs(sera, steps)}
    sft = _recs([[0, 0, 0]], steps)[0]
    floor = {str(k): {"floor": 0.01} for k in (1, 2, 4, 8)}
    out = curves.curve_statistics(cfg, ["uniform", "sera"], recs, sft, floor, {})
    prim = out["primary"]
    assert prim["margin"] == 0.3 and prim["floor"] is None  # the pre-registered t rule
    assert prim["tost"]["level"] == 0.9 and prim["tost"]["margin"] == 0.3
    assert prim["estimate"]["per_seed"] == [1.0, 0.0]
    assert prim["verdict"] == cmp.judge(prim["estimate"], 0.3)["verdict"] == "inconclusive"
    assert not prim["tost"]["equivalent"]
    assert prim["mde"] == pytest.approx(cmp.mde(prim["estimate"]["sd"], 2))
    cfg.compare.margin = None
    bare = curves.curve_statistics(cfg, ["uniform", "sera"], recs, sft, floor, {})["primary"]
    assert bare["margin"] is None and bare["tost"] is None and bare["verdict"] != "no difference"


def _prim(verdict, mean, lo, hi, margin=None, tlo=None, thi=None, mde=0.031, floor=None):
    t = None if margin is None else {"margin": margin, "level": 0.9, "lo": tlo, "hi": thi,
                                     "equivalent": verdict.startswith("equivalent")}
    return {"verdict": verdict, "tost": t, "margin": margin, "mde": mde, "power": 0.8,
            "floor": floor, "estimate": {"mean": mean, "lo": lo, "hi": hi}}


def test_the_primarys_verdict_in_words():
    eq = tables.verdict_sentence(_prim("equivalent within ±0.02", 0.001, -0.01, 0.012, 0.02,
                                       -0.008, 0.01))
    assert "**equivalent within ±2.0 pp** (90 % CI [-0.8, +1.0] pp inside the margin)" in eq
    wide = tables.verdict_sentence(_prim("inconclusive", 0.0, -0.05, 0.05, 0.02, -0.04, 0.04))
    assert "**inconclusive**: CI wider than the margin" in wide and "MDE 3.1 pp at 80 % power" \
        in wide
    shifted = tables.verdict_sentence(_prim("inconclusive", 0.01, -0.005, 0.03, 0.02, -0.002,
                                            0.025))
    assert "CI not inside the margin" in shifted
    none = tables.verdict_sentence(_prim("inconclusive", 0.0, -0.05, 0.05))
    assert "no equivalence margin registered; **inconclusive** (MDE 3.1 pp" in none
    better = tables.verdict_sentence(_prim("better", 0.05, 0.02, 0.08))
    assert "no equivalence margin registered; **better**" in better
    floored = tables.verdict_sentence(_prim("inconclusive", 0.005, 0.001, 0.009, floor=0.01))
    assert "within the noise floor (±1.0 pp)" in floored
    assert tables.verdict_sentence({"outcome": "positive"}) == ""  # an older table


def test_recompute_reads_an_older_exports_no_difference_as_inconclusive():
    now = {"paired": {"sera": {"eval": {"1": {"verdict": "inconclusive"}}}}}
    assert recompute.compare_numbers(now, {"paired": {"sera": {"eval": {"1": {
        "verdict": "no difference"}}}}}) == []
    assert recompute.compare_numbers({"x": {"verdict": "better"}},
                                     {"x": {"verdict": "no difference"}}) != []


# --------------------------------------------------------------------------- the gap


def _pt(x, y, seeds):
    return {"pass@1": {"mean": float(np.mean(x)), "lo": None, "hi": None, "per_seed": list(x),
                       "seeds": len(x)},
            "pass@64": {"mean": float(np.mean(y)), "lo": None, "hi": None, "per_seed": list(y),
                        "seeds": len(y)},
            "seeds": list(seeds)}


D = [0.01, -0.01, 0.005, -0.005]  # SERA − uniform per seed at both lrs: mean 0


def _frontier_out(margin=None):
    lrs = {}
    for name, (x, y) in (("1e-05", (0.1, 0.6)), ("3e-05", (0.3, 0.7))):
        lrs[name] = {"lr": float(name), "gate": {"passes": True, "outcome": "PASS"}, "points": {
            "uniform": _pt([x] * 4, [y] * 4, range(4)),
            "sera": _pt([x] * 4, [y + d for d in D], range(4)),
            "sera6": _pt([x] * 6, [y + 0.05] * 6, range(6))}}
    lrs["1e-05"]["points"]["vip"] = _pt([0.2] * 4, [0.7] * 4, range(4))
    return {"methods": ["uniform", "sera", "sera6", "vip"], "k": 64, "window": 3,
            "metric": "m", "rule": "r", "lrs": lrs, "sft": {"pass@1": 0.05, "pass@64": 0.5},
            "bootstrap": {"num_resamples": 300, "level": 0.95, "seed": 0}, "margin": margin}


def test_gap_by_hand_with_paired_seeds_and_the_margin():
    out = _frontier_out(margin=0.02)
    out.update(frontier.summarise(out, "uniform", 64))
    g = out["gap"]
    assert g["margin"] == 0.02 and g["tost_level"] == 0.9 and g["start_joins_both"]
    sera = g["methods"]["sera"]
    # Equal pass@1 at both lrs; SERA's pass@k differs by mean(D) = 0: no gap anywhere, and
    # every resample (the same seed draw at both lrs) moves it by the drawn seeds' mean of D,
    # at most ±0.01: inside the ±0.02 margin.
    assert sera["overlap"] == pytest.approx((0.05, 0.3)) and sera["paired"]
    assert sera["mean"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert -0.01 <= sera["mean"]["lo"] <= 0 <= sera["mean"]["hi"] <= 0.01
    assert sera["mean"]["tost"]["equivalent"] and sera["mean"]["verdict"] == (
        "equivalent within ±0.02")
    assert sera["resolution"]["mde"] is None and sera["resolution"]["half_width"] > 0
    assert sera["seeds"] == [0, 1, 2, 3] and sera["lrs"] == ["1e-05", "3e-05"]
    # Six seeds against four (paired where shared): 0.05 above at both lrs, the start joins
    # both frontiers, so the gap rises linearly from 0 at pass@1 0.05 to 0.05 at 0.1.
    s6 = g["methods"]["sera6"]
    u = np.linspace(0.05, 0.3, 201)
    xs = [0.05, 0.1, 0.3]
    expect = np.mean(np.interp(u, xs, [0.5, 0.65, 0.75]) - np.interp(u, xs, [0.5, 0.6, 0.7]))
    assert s6["mean"]["mean"] == pytest.approx(expect)
    assert s6["mean"]["verdict"] == "better" and not s6["mean"]["tost"]["equivalent"]
    assert s6["seeds"] == list(range(6))
    assert "at >= 2 lrs" in g["methods"]["vip"]["skipped"]
    md = frontier.frontier_markdown(out)
    assert "Frontier gap vs uniform: held-out pass@64 at matched pass@1" in md
    assert "| sera | 2 | 5.00–30.00 | +0.00 [" in md and "equivalent within ±2.0 pp |" in md
    assert "| vip | 1 | – | – | – | – | – |" in md
    assert "sera: TOST against ±2.0 pp: 90 % interval" in md and "inside the margin" in md
    assert "the MDE is not defined for this bootstrap statistic" in md
    assert "Equivalence margin (frontier.margin): ±2.0 pp." in md


def test_gap_without_a_margin_and_tighter_margins():
    out = _frontier_out()
    out.update(frontier.summarise(out, "uniform", 64))
    sera = out["gap"]["methods"]["sera"]
    assert "tost" not in sera["mean"] and sera["mean"]["verdict"] == "inconclusive"
    assert "none registered" in "\n".join(gap.gap_lines(out))
    tight = _frontier_out(margin=0.002)
    tight.update(frontier.summarise(tight, "uniform", 64))
    assert tight["gap"]["methods"]["sera"]["mean"]["verdict"] == "inconclusive"
    # A frontier written before the gap: no gap table.
    old = _frontier_out()
    old.update(frontier.summarise(old, "uniform", 64))
    del old["gap"]
    assert "Frontier gap" not in frontier.frontier_markdown(old)
