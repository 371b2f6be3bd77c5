"""The math kind's answer-blind guessers (`kinds.lm.blind_guessers` / `blind_validity`, issue
49 item 3): each guesser's per-problem success q worked by hand on a made-up task, the
strongest picked at the largest k, the mode's tie rule, and `compare.blind` choosing the
control the validity gate reads (default "frequency": what the committed results used)."""

import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.paired import config, validity
from sera_jax.studies.paired.kinds import lm
from sera_jax.tasks.mathqa.data import MathProblem
from tests import util


def problem(answer, template=None):
    return MathProblem("question", answer, meta={"template": template} if template else {})


class _Task:
    """A stand-in with the `MathTask` methods `blind_validity` reads."""

    def __init__(self, train, held):
        self._p = {"train": [problem(*p) for p in train], "eval": [problem(*p) for p in held]}

    def problems(self, split):
        return list(self._p[split])

    def split_size(self, split):
        return len(self._p[split])


# Ten training problems: "add" answers 3, 5, 5, 7; "mul" 12, 12, 20; three without a
# template whose answers are not all integers (2.5, 2.5, 4).
TRAIN = [("3", "add"), ("5", "add"), ("5", "add"), ("7", "add"),
         ("12", "mul"), ("12", "mul"), ("20", "mul"), ("2.5",), ("2.5",), ("4",)]
HELD = [("5", "add"), ("9", "add"), ("12", "mul"), ("15", "mul"), ("2.5",), ("5", "sub")]
# q by hand, one entry per held-out problem:
Q = {
    # overall frequency among the 10 training answers: "5" 2x, "12" 2x, "2.5" 2x
    "frequency": [2 / 10, 0, 2 / 10, 0, 2 / 10, 2 / 10],
    # within the template: add 2/4, mul 2/3, no template 2/3, "sub" has no training problem
    "template_frequency": [2 / 4, 0, 2 / 3, 0, 2 / 3, 0],
    # add: integers 3..7 (5 of them), 9 outside; mul: 12..20 (9), 15 inside though never a
    # training answer; no template: not integers, uniform over {2.5, 4}; "sub": nothing
    "uniform_range": [1 / 5, 0, 1 / 9, 1 / 9, 1 / 2, 0],
    # add -> 5, mul -> 12, no template -> 2.5
    "mode": [1, 0, 1, 0, 1, 0],
}


def pass_at(q, k):
    return float(np.mean(1 - (1 - np.asarray(q, float)) ** k))


def test_each_guessers_q_is_the_hand_worked_one():
    task = _Task(TRAIN, HELD)
    qs = lm.blind_guessers(task.problems("train"), task.problems("eval"))
    assert list(qs) == list(lm.GUESSERS)
    for name, q in Q.items():
        assert qs[name] == pytest.approx(q), name
    r = lm.blind_validity(task, "eval", 6, [1, 8])
    for name, q in Q.items():
        g = r["guessers"][name]
        assert g["pass1"] == pytest.approx(np.mean(q))
        assert g["blind_pass_at_k"]["1"] == pytest.approx(np.mean(q))
        assert g["blind_pass_at_k"]["8"] == pytest.approx(pass_at(q, 8))
    # A deterministic guesser's pass@k is its pass@1 at every k.
    assert r["guessers"]["mode"]["blind_pass_at_k"]["8"] == pytest.approx(0.5)


def test_gold_outside_the_training_range_gets_zero_under_uniform_range():
    task = _Task(train=[("10", "t"), ("20", "t")], held=[("9", "t"), ("21", "t"), ("15", "t")])
    r = lm.blind_validity(task, "eval", 3, [1], blind="uniform_range")
    assert r["blind_q"] == pytest.approx([0, 0, 1 / 11])


def test_the_strongest_is_the_best_at_the_largest_k():
    task = _Task(TRAIN, HELD)
    # at k = 8: frequency 0.555 > uniform_range 0.508 > mode 0.5 > template_frequency 0.499
    assert pass_at(Q["frequency"], 8) > pass_at(Q["uniform_range"], 8) > 0.5 > pass_at(
        Q["template_frequency"], 8)
    assert lm.blind_validity(task, "eval", 6, [1, 8])["strongest"] == "frequency"
    # at k = 1 the mode (0.5) beats template_frequency (0.306) and the rest
    r = lm.blind_validity(task, "eval", 6, [1], blind="strongest")
    assert r["strongest"] == r["blind"] == "mode"
    assert r["blind_q"] == pytest.approx(Q["mode"])
    assert r["blind_pass_at_k"] == r["guessers"]["mode"]["blind_pass_at_k"]
    r = lm.blind_validity(task, "eval", 6, [8, 2], blind="strongest")  # largest k, any order
    assert r["blind"] == "frequency" and r["blind_q"] == pytest.approx(Q["frequency"])


def test_ties_go_to_the_first_guesser():
    # Without templates the per-template frequency is the overall one: a tie, "frequency".
    # At k = 4: frequency = template_frequency (q 3/4, 1/4) 0.840 > uniform_range over 1..5
    # (q 1/5 each) 0.590 > mode (q 1, 0) 0.5.
    task = _Task(train=[("1",), ("1",), ("1",), ("5",)], held=[("1",), ("5",)])
    r = lm.blind_validity(task, "eval", 2, [1, 4], blind="strongest")
    assert r["guessers"]["frequency"] == r["guessers"]["template_frequency"]
    assert r["strongest"] == r["blind"] == "frequency"


def test_mode_ties_go_to_the_smallest_answer_by_string_order():
    # "10" and "9" are each drawn once: "10" < "9" as strings, so the mode is "10".
    task = _Task(train=[("9", "t"), ("10", "t")], held=[("10", "t"), ("9", "t")])
    r = lm.blind_validity(task, "eval", 2, [1], blind="mode")
    assert r["blind_q"] == [1.0, 0.0]


def test_default_is_the_committed_frequency_guesser_with_every_guesser_reported():
    task = _Task(TRAIN, HELD)
    r = lm.blind_validity(task, "eval", 4, [1, 8])
    # On the first four problems uniform_range is the strongest (pass@8 0.513 vs frequency's
    # 0.416), yet the default control stays the frequency guesser.
    assert r["blind"] == "frequency" and r["strongest"] == "uniform_range"
    assert r["blind_q"] == pytest.approx(Q["frequency"][:4])
    assert r["blind_pass_at_k"] == r["guessers"]["frequency"]["blind_pass_at_k"]
    assert set(r["guessers"]) == set(lm.GUESSERS) and r["num_prompts"] == 4
    assert r["distinct_sft_answers"] == 7 and r["distinct_answers"] == 4
    assert r["seen_in_sft"] == pytest.approx(2 / 4) and r["kind"] == "math"
    # The kind's method is the same function.
    m = lm.MathKind().blind_validity(task, "eval", 4, [1, 8], blind="strongest")
    assert m == lm.blind_validity(task, "eval", 4, [1, 8], blind="strongest")
    with pytest.raises(ValueError, match="blind"):
        lm.blind_validity(task, "eval", 4, [1], blind="nope")


def _math_cfg():
    return config_files.get_config(os.path.join(util.ROOT, "configs", "math",
                                                "smollm2_arith.py"))


def test_compare_blind_is_checked():
    cfg = _math_cfg()
    assert validity.blind_choice(cfg) == "frequency"  # the committed configs have no field
    cfg.compare.blind = "strongest"
    assert validity.blind_choice(cfg) == "strongest"
    config.validate(cfg, ["uniform", "sera"], [0])
    cfg.compare.blind = "best"
    with pytest.raises(common.StudyError, match="compare.blind"):
        config.validate(cfg, ["uniform", "sera"], [0])
    maze = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "cpu_read.py"))
    maze.compare.blind = "strongest"  # the maze kind has one guesser only
    with pytest.raises(common.StudyError, match="compare.blind"):
        validity.blind_choice(maze)


def test_the_validity_report_reads_compare_blind_and_caches_by_it(tmp_path, monkeypatch):
    task = _Task(TRAIN, HELD)
    monkeypatch.setattr(validity, "build_task", lambda cfg: task)
    monkeypatch.setattr(validity, "start_fingerprint", lambda cfg: {})
    cfg = _math_cfg()
    cfg.eval.num_prompts = 6
    cfg.compare.primary.k = 4
    start = {"num_samples": 4, "num_correct": [4, 0, 4, 0, 4, 0]}
    out = validity.sft_validity(cfg, str(tmp_path), start, 0)
    assert out["blind"] == "frequency" and out["blind_q"] == pytest.approx(Q["frequency"])
    cfg.compare.blind = "strongest"  # a new cache key: recomputed, not the stale report
    out = validity.sft_validity(cfg, str(tmp_path), start, 0)
    # ks = 1, 2, 4; at k = 4 the mode's 0.5 beats template_frequency 0.486, frequency 0.394
    # and uniform_range 0.380
    assert out["blind"] == out["strongest"] == "mode"
    assert out["blind_q"] == pytest.approx(Q["mode"])
    assert out["check"]["blind_pass1"] == pytest.approx(0.5)
