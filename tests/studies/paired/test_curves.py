"""Curve statistics of the maze study (pure, no model): seed-level bands, Holm, the
published bootstrap pass@k, the null gate, the A/A false-positive rate, per-step
diagnostics and the pre-registered primary endpoint."""

import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired import curves
from tests import util


def _tiny():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.compare.exploratory = False  # the protocol's pre-registered path
    return cfg


def test_seed_interval_is_student_t_over_seeds():
    x = [0.01, 0.03, 0.02, 0.04]
    e = cmp.seed_interval(x)
    sd = np.std(x, ddof=1)
    assert e["mean"] == pytest.approx(0.025)
    assert e["hi"] - e["mean"] == pytest.approx(3.182446 * sd / 2, rel=1e-5)  # t_{.975, 3}
    assert e["lo"] > 0 and e["p"] < 0.05 and e["seeds"] == 4
    one = cmp.seed_interval([0.3])
    assert one["lo"] is None and one["p"] is None and not cmp.excludes_zero(one)
    zero = cmp.seed_interval([0.0, 0.0, 0.0])
    assert zero["lo"] == zero["hi"] == 0 and zero["p"] == 1.0 and not cmp.excludes_zero(zero)
    with pytest.raises(ValueError, match="finite"):
        cmp.seed_interval([np.nan, 1.0])


def test_curve_difference_pairs_seeds_and_points():
    # 3 seeds, 2 points, 4 mazes, n = 8: A solves one more sample per maze at point 1.
    b = np.full((3, 2, 4), 4)
    a = b.copy()
    a[:, 1] += 1
    a[2, 1, 0] += 2  # seed 2 a bit better: spread across seeds
    d = cmp.curve_difference(a, b, 8, [1, 8], [0, 5], window=1)
    p0, p1 = d["points"]["1"]
    assert p0["step"] == 0 and p0["mean"] == 0 and p1["step"] == 5
    assert p1["per_seed"][0] == pytest.approx(1 / 8) and p1["per_seed"][2] == pytest.approx(
        1 / 8 + 2 / 32)
    assert d["window"]["1"]["mean"] == pytest.approx(p1["mean"])
    both = cmp.curve_difference(a, b, 8, [1], [0, 5], window=2)["window"]["1"]
    assert both["mean"] == pytest.approx(p1["mean"] / 2)
    with pytest.raises(ValueError, match="window"):
        cmp.curve_difference(a, b, 8, [1], [0, 5], window=3)
    with pytest.raises(ValueError, match=r"\[S, T, M\]"):
        cmp.curve_difference(a[0], b[0], 8, [1], [0, 5])


def test_holm_step_down():
    adj = cmp.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert adj["a"] == pytest.approx(0.03) and adj["c"] == pytest.approx(0.06)
    assert adj["b"] == pytest.approx(0.06) and adj["d"] is None  # monotone: max with c's
    assert cmp.holm({"x": 0.9, "y": 0.8}) == {"x": 1.0, "y": 1.0}


def test_bootstrap_pass_at_k_is_the_with_replacement_estimate_below_the_unbiased_one():
    c, n = np.array([0, 1, 4, 8]), 8
    boot = cmp.bootstrap_pass_at_k(c, n, [1, 4, 8])
    unbiased = cmp.per_prompt_pass_at_k(c, n, [1, 4, 8]).mean(axis=1)
    assert boot["1"] == pytest.approx(unbiased[0])  # k = 1: the same
    assert boot["8"] < unbiased[2] and boot["4"] < unbiased[1]
    # Monte Carlo of the published procedure: k draws with replacement, any correct.
    rng = np.random.default_rng(0)
    draws = rng.random((20000, 4, 4)) < (c / n)[None, None, :]
    assert boot["4"] == pytest.approx(draws.any(axis=1).mean(), abs=0.01)
    with pytest.raises(ValueError, match="num_correct"):
        cmp.bootstrap_pass_at_k([9], 8, [1])


def _diff(values):
    e = cmp.seed_interval(values)
    return {"seeds": list(range(len(values))), "eval": {"window": {"1": e}}}


def test_null_gate_passes_only_clear_of_zero_and_twice_the_floor():
    floor = {"1": {"floor": 0.01}}
    learns = curves.null_gate(_diff([0.05, 0.06, 0.055]), floor, 2.0)
    assert learns["passes"] and learns["outcome"].startswith("PASS")
    flat = curves.null_gate(_diff([0.0, 0.0, 0.0]), floor, 2.0)  # lr = 0: Δ exactly 0
    assert not flat["passes"] and not flat["ci_above_zero"]
    small = curves.null_gate(_diff([0.015, 0.016, 0.014]), floor, 2.0)  # > 0, not > 2 floors
    assert small["ci_above_zero"] and not small["exceeds_floor"] and not small["passes"]
    one_seed = curves.null_gate(_diff([0.5]), floor, 2.0)
    assert not one_seed["passes"] and "fewer than 2" in one_seed["outcome"]
    assert not curves.null_gate(None, floor, 2.0)["passes"]


def test_one_seed_gate_reads_the_prompt_bootstrap_and_says_so():
    """One paired seed: the gate's interval is the bootstrap over held-out prompts of the
    window difference (`window_bootstrap`), labelled; clear learning passes, none fails."""
    floor = {"1": {"floor": 0.01}}
    n, rng = 16, np.random.default_rng(0)
    base = rng.binomial(n, 0.6, size=(1, 2, 64))  # [S=1, T=2 points, M=64 prompts]
    null = rng.binomial(n, 0.1, size=(1, 2, 64))
    boot = curves.window_bootstrap(base, null, n, 1, 1)
    assert boot["lo"] > 0.4 and boot["seeds"] == 1
    learns = curves.null_gate(_diff([0.5]), floor, 2.0, prompts_ci=boot)
    assert learns["passes"] and "held-out prompts" in learns["outcome"]
    assert learns["ci"].startswith("one seed")
    same = curves.window_bootstrap(base, base, n, 1, 1)  # no difference: CI touches 0
    flat = curves.null_gate(_diff([0.0]), floor, 2.0, prompts_ci=same)
    assert not flat["passes"] and not flat["exceeds_floor"]
    several = curves.null_gate(_diff([0.05, 0.06, 0.055]), floor, 2.0, prompts_ci=boot)
    assert several["ci"] == "seed-level Student t band"  # seeds present: the t band decides


def test_aa_false_positive_rate_counts_points_after_the_start():
    ok = {"step": 0, **cmp.seed_interval([0.0, 0.0])}
    null = {"step": 5, **cmp.seed_interval([0.01, -0.01])}
    hit = {"step": 9, **cmp.seed_interval([0.02, 0.021])}
    d = {"seeds": [0, 1], "eval": {"points": {"1": [ok, null, hit], "2": [ok, null, null]}}}
    r = curves.aa_false_positive_rate(d, ["eval"], [1, 2])
    assert r["cells"] == 4 and r["false_positives"] == 1 and r["false_positive_rate"] == 0.25
    assert curves.aa_false_positive_rate(None, ["eval"], [1])["false_positive_rate"] is None


def test_per_step_diagnostics():
    allocs = [{"step": 1, "prompt_ids": [0, 1], "p_hat": [None, None], "counts": [4, 4],
               "successes": [0, 0]},
              {"step": 2, "prompt_ids": [2, 0], "p_hat": [0.5, 0.25], "counts": [2, 6],
               "successes": [1, 0]},
              {"step": 3, "prompt_ids": [1, 2], "p_hat": [0.1, 0.5], "counts": [6, 2],
               "successes": [0, 2]}]
    train = [{"step": s, "live_row_fraction": 0.5, "generated_tokens": 10.0 * s,
              "active_prompts": 2.0, "reward_mean": 0.1} for s in (1, 2, 3)]
    curve = {0: {"train": {"num_correct": [4, 0, 8], "num_samples": 8}}}
    d = curves.per_step_diagnostics(allocs, train, curve, num_train=4, shift=1)
    assert [r["step"] for r in d] == [1, 2, 3]
    assert d[0]["unsolved_share"] == 1 and d[0]["ever_solved"] == 0
    assert d[0]["kappa_believed_min"] is None  # unseen: no belief yet
    assert d[1]["ever_solved"] == 0.25 and d[1]["unsolved_share"] == 1  # maze 2 solved at 2
    assert d[2]["unsolved_share"] == pytest.approx(6 / 8) and d[2]["ever_solved"] == 0.25
    assert d[1]["kappa_realised_min"] == pytest.approx(1 - 0.5 ** 5)  # maze 0, p = 4/8
    assert d[1]["kappa_believed_min"] == pytest.approx(min(1 - 0.5, 1 - 0.75 ** 5))
    assert d[2]["mixed_fraction"] == 0 and d[1]["mixed_fraction"] == 0.5
    assert d[2]["generated_tokens"] == 30.0 and d[2]["live_row_fraction"] == 0.5


def test_primary_endpoint_is_fixed_before_the_run(tmp_path):
    cfg = _tiny()
    spec = curves.preregister(cfg, str(tmp_path))
    assert spec == {"method": "sera", "baseline": "uniform", "split": "eval", "k": 8,
                    "window": 2, "gate_floor_multiple": 2.0, "level": 0.95}
    assert curves.preregister(cfg, str(tmp_path)) == spec  # unchanged: fine
    cfg.compare.primary.k = 4  # chosen after the run: refused
    with pytest.raises(common.StudyError, match="cannot change after the run"):
        curves.preregister(cfg, str(tmp_path))


def test_primary_endpoint_validation():
    from sera_jax.studies import paired as study

    for field, value, match in (("compare.primary.method", "uniform", "primary.method"),
                                ("compare.primary.method", "grpo", "primary.method"),
                                ("compare.primary.split", "test", "primary.split"),
                                ("compare.primary.k", 9, "primary.k"),
                                ("compare.primary.window", 0, "primary.window"),
                                ("compare.gate_floor_multiple", -1.0, "gate_floor_multiple"),
                                ("compare.aa_seed_offset", 0, "aa_seed_offset")):
        with pytest.raises(common.StudyError, match=match):
            study.validate(util.set_field(_tiny(), field, value), ["uniform", "sera"], [0])


def test_two_processes_with_disjoint_seeds_split_every_run_once():
    from sera_jax.studies import paired as study

    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "cpu.py"))
    methods = list(cfg.compare.methods)
    full = {(a, s) for a, ss in study.rl_plan(cfg, methods, list(cfg.compare.seeds))
            for s in ss}
    halves = [{(a, s) for a, ss in study.rl_plan(cfg, methods, part, True) for s in ss}
              for part in ([0, 2, 4, 6], [1, 3, 5, 7])]
    assert not halves[0] & halves[1] and halves[0] | halves[1] == full
    assert len(full) == 3 * 8 + 2 + 4  # uniform, sera, sera_evidence x 8; null x 2; A/A x 4
    assert {s for a, s in halves[0] if a == study.NULL} == {0}
