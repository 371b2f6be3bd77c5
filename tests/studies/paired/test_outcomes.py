"""Outcome classes and the format/correctness split of pass@1 gains
(`sera_jax.studies.paired.outcomes`): hand-worked values, exact additivity, groups, the t
interval over seeds, and the refusals."""

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sera_jax.rl.evaluate import OUTCOMES
from sera_jax.studies.paired import outcomes as oc
from sera_jax.studies.paired.evaluation import outcome_fields

# 0 correct, 1 wrong, 2 no answer, 3 truncated
# start: half truncated; 3 correct + 1 wrong of 8 -> a0 = 1/2, c0 = 3/4, pass1 = 3/8
START = np.array([[0, 0, 3, 3],
                  [0, 1, 3, 3]], np.int8)
# arm: all answered; 5 correct + 3 wrong of 8 -> a1 = 1, c1 = 5/8, pass1 = 5/8
ARM = np.array([[0, 0, 0, 1],
                [0, 0, 1, 1]], np.int8)


def test_parse_round_trips_the_record():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (5, 7)).astype(np.int8)
    rec = outcome_fields(x, np.ones_like(x))
    got = oc.parse(rec["outcomes"])
    assert got.dtype == np.int8 and got.shape == (5, 7)
    np.testing.assert_array_equal(got, x)
    r = oc.rates(got)
    for name in OUTCOMES:
        assert r[name] == pytest.approx(rec["outcome_fractions"][name])


@pytest.mark.parametrize("strings, match", [
    (["0013", "001"], "ragged rows: prompt 1 has 3"),
    (["0013", "0014"], r"prompt 1 has characters \['4'\] outside 0-3"),
    (["01a3"], r"prompt 0 has characters \['a'\]"),
    ([], "no prompts"),
    ([""], "no samples"),
    (["01", 12], "prompt 1 is int"),
])
def test_parse_errors(strings, match):
    with pytest.raises(ValueError, match=match):
        oc.parse(strings)


def test_rates_by_hand():
    x = np.array([[0, 1, 2, 3],
                  [3, 3, 0, 0]], np.int8)
    r = oc.rates(x, groups=["algebra", "geometry"])
    assert r["correct"] == 3 / 8 and r["wrong"] == 1 / 8
    assert r["no_answer"] == 1 / 8 and r["truncated"] == 3 / 8
    assert r["answered"] == 4 / 8 and r["accuracy"] == 3 / 4 and r["pass1"] == 3 / 8
    assert r["pass1"] == r["answered"] * r["accuracy"]
    alg, geo = r["by_group"]["algebra"], r["by_group"]["geometry"]
    assert (alg["answered"], alg["accuracy"], alg["pass1"]) == (1 / 2, 1 / 2, 1 / 4)
    assert (geo["answered"], geo["accuracy"], geo["pass1"]) == (1 / 2, 1.0, 1 / 2)
    assert "by_group" not in alg
    nothing = oc.rates(np.full((2, 3), 3, np.int8))
    assert nothing["answered"] == 0 and nothing["accuracy"] is None and nothing["pass1"] == 0


def test_rates_refuses_bad_arrays():
    with pytest.raises(ValueError, match="0-3"):
        oc.rates(np.array([[0, 4]]))
    with pytest.raises(ValueError, match="shape"):
        oc.rates(np.array([0, 1]))
    with pytest.raises(ValueError, match="3 labels for 2 prompts"):
        oc.rates(START, groups=["a", "b", "c"])


def test_decompose_by_hand():
    d = oc.decompose(ARM, START)
    # gain = 5/8 - 3/8; format = (1 - 1/2)·3/4; correctness = 1·(5/8 - 3/4)
    assert d["gain"] == 1 / 4
    assert d["format"] == 3 / 8
    assert d["correctness"] == -1 / 8
    assert d["format"] + d["correctness"] == d["gain"]
    assert (d["answered_start"], d["answered_arm"]) == (1 / 2, 1.0)
    assert (d["accuracy_start"], d["accuracy_arm"]) == (3 / 4, 5 / 8)
    assert d["gain"] == oc.rates(ARM)["pass1"] - oc.rates(START)["pass1"]


def test_decompose_start_answers_nothing():
    start = np.array([[3, 3, 2, 2]], np.int8)  # a0 = 0 -> c0 := 0
    arm = np.array([[0, 1, 3, 3]], np.int8)     # a1 = 1/2, c1 = 1/2
    d = oc.decompose(arm, start)
    assert d["accuracy_start"] == 0 and d["format"] == 0
    assert d["correctness"] == d["gain"] == 1 / 4


def test_decompose_refuses_other_problems():
    with pytest.raises(ValueError, match="same problems"):
        oc.decompose(ARM, START[:1])


def test_additivity_is_exact_on_random_arrays():
    rng = np.random.default_rng(1)
    for _ in range(200):
        p, n = rng.integers(1, 9), rng.integers(1, 9)
        arm = rng.choice(4, (p, n), p=rng.dirichlet(np.ones(4))).astype(np.int8)
        start = rng.choice(4, (p, n), p=rng.dirichlet(np.ones(4))).astype(np.int8)
        d = oc.decompose(arm, start)
        assert d["format"] + d["correctness"] == d["gain"]
        exact = Fraction(int((arm == 0).sum()) - int((start == 0).sum()), arm.size)
        assert abs(Fraction(d["gain"]) - exact) <= Fraction(1, 2 ** 50)


def test_paired_decomposition_groups_and_one_seed():
    out = oc.paired_decomposition({7: ARM}, START, groups=["a", "b"])
    assert out["seeds"] == [7] and out["note"] == oc.ONE_SEED
    assert out["gain"] == {"mean": 1 / 4, "sd": None, "ci": None}
    assert out["format"]["mean"] == 3 / 8 and out["correctness"]["mean"] == -1 / 8
    assert out["per_seed"][7] == oc.decompose(ARM, START)
    a, b = out["by_group"]["a"], out["by_group"]["b"]
    # a: start [0 0 3 3] (a0 = 1/2, c0 = 1), arm [0 0 0 1] (a1 = 1, c1 = 3/4)
    assert (a["gain"]["mean"], a["format"]["mean"], a["correctness"]["mean"]) == (
        1 / 4, 1 / 2, -1 / 4)
    # b: start [0 1 3 3] (a0 = 1/2, c0 = 1/2), arm [0 0 1 1] (a1 = 1, c1 = 1/2)
    assert (b["gain"]["mean"], b["format"]["mean"], b["correctness"]["mean"]) == (
        1 / 4, 1 / 4, 0)
    assert a["num_prompts"] == b["num_prompts"] == 1
    md = oc.markdown(out, "maze: SERA vs start")
    assert "### maze: SERA vs start" in md and oc.ONE_SEED in md
    assert "| all | gain | +25.00 | – |" in md
    assert "|  | format | +37.50 | – |" in md and "|  | correctness | -12.50 | – |" in md
    assert "| a | gain | +25.00 |" in md and "| b | gain | +25.00 |" in md
    assert md.split("| b |")[1].splitlines()[1].startswith("|  | format | +25.00 |")
    assert "50.0% → 100.0%" in md


def test_t_interval_matches_scipy_for_three_seeds():
    arms = {0: ARM,
            1: np.array([[0, 0, 0, 0], [0, 1, 2, 3]], np.int8),
            2: np.array([[0, 1, 1, 3], [0, 0, 2, 1]], np.int8)}
    starts = {s: START for s in arms}
    out = oc.paired_decomposition(arms, starts, level=0.9)
    assert out["seeds"] == [0, 1, 2] and "note" not in out and out["level"] == 0.9
    for part in ("gain", "format", "correctness", "answered_arm", "accuracy_arm"):
        x = np.array([oc.decompose(arms[s], START)[part] for s in range(3)])
        lo, hi = stats.t.interval(0.9, df=2, loc=x.mean(), scale=stats.sem(x))
        assert out[part]["mean"] == pytest.approx(x.mean(), abs=1e-15)
        assert out[part]["ci"] == pytest.approx([lo, hi], abs=1e-12)
        assert out[part]["sd"] == pytest.approx(x.std(ddof=1))
    assert out["format"]["mean"] + out["correctness"]["mean"] == out["gain"]["mean"]
    # the start scored once with the same keys gives the same record as a mapping of it
    same = oc.paired_decomposition(arms, START, level=0.9)
    assert same["gain"] == out["gain"] and same["per_seed"] == out["per_seed"]
    with pytest.raises(ValueError, match=r"no scoring for seeds \[2\]"):
        oc.paired_decomposition(arms, {0: START, 1: START})


def test_difference_decomposition():
    base = {0: START, 1: START}
    arm = {0: ARM, 1: ARM}
    out = oc.difference_decomposition(arm, base, groups=["a", "b"])
    assert out["reference"] == "base" and out["seeds"] == [0, 1]
    # format = (a_arm - a_base)·c_base, correctness = a_arm·(c_arm - c_base)
    assert out["per_seed"][0]["format"] == (1 - 1 / 2) * 3 / 4
    assert out["per_seed"][0]["correctness"] == 1 * (5 / 8 - 3 / 4)
    assert out["per_seed"][0]["answered_base"] == 1 / 2
    assert out["per_seed"][0]["accuracy_base"] == 3 / 4
    assert out["gain"]["ci"] == [1 / 4, 1 / 4]  # identical seeds: sd 0, the point
    assert out["by_group"]["b"]["format"]["mean"] == 1 / 4
    md = oc.markdown(out, "SERA − uniform")
    assert "answered base → arm" in md and "| all | gain | +25.00 | [+25.00, +25.00] |" in md
    with pytest.raises(ValueError, match=r"missing from base: \[2\]; missing from arm: \[5\]"):
        oc.difference_decomposition({0: ARM, 2: ARM}, {0: START, 5: START})
