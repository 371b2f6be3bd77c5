"""The lr frontier's arithmetic: points above a reference frontier, the lr rule, the table."""

import pytest

from sera_jax.studies.maze import frontier


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
