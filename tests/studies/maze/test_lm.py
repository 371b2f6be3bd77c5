"""The paired study on a pretrained LM (`sera_jax.studies.maze.lm`): which configs are LM
studies, where their results go, the answer-blind control, validation before any model
loads, and the run plan of disjoint `--methods` processes."""

import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.maze import lm, prereg, setup
from sera_jax.tasks.mathqa.data import MathProblem
from tests import util


def load(name: str):
    return config_files.get_config(os.path.join(util.ROOT, "configs", name))


class _Task:
    """A stand-in with the `MathTask` methods `blind_validity` reads."""

    def __init__(self, train, held):
        self._p = {"train": [MathProblem(q, a) for q, a in train],
                   "eval": [MathProblem(q, a) for q, a in held]}

    def problems(self, split):
        return list(self._p[split])

    def split_size(self, split):
        return len(self._p[split])


def test_lm_configs_are_lm_studies_with_their_own_results_folder():
    arith, maze = load("math/smollm2_arith.py"), load("maze/cpu_read.py")
    assert lm.is_lm(arith) and not lm.is_lm(maze)
    assert lm.study_name(arith) == "math" and lm.study_name(maze) == "maze"
    path = prereg.preregistration_path(arith)
    assert path.endswith(os.path.join("results", "math", "math_smollm2_arith",
                                      "preregistration.json"))
    assert os.path.exists(path)  # committed before any RL run
    # The start's fingerprint is task + model: there is no SFT block to read.
    assert set(setup.sft_fingerprint(arith)) == {"task", "model"}


def test_committed_preregistrations_match_the_math_configs():
    for name in ("smollm2_arith", "smollm2_arith_quick"):
        cfg = load(f"math/{name}.py")
        prereg.check_preregistration(cfg, "comparison")  # raises on any difference


def test_blind_control_is_exact_for_the_training_answer_frequencies():
    task = _Task(train=[("a", "7"), ("b", "7"), ("c", "1,200"), ("d", "3")],
                 held=[("e", "7"), ("f", "1200"), ("g", "9")])
    r = lm.blind_validity(task, "eval", 3, [1, 4])
    q = np.array([0.5, 0.25, 0.0])  # "1,200" and "1200" are one answer; 9 never drawn
    assert r["blind_q"] == pytest.approx(q)
    assert r["blind_pass_at_k"]["1"] == pytest.approx(q.mean())
    assert r["blind_pass_at_k"]["4"] == pytest.approx(np.mean(1 - (1 - q) ** 4))
    assert r["seen_in_sft"] == pytest.approx(2 / 3) and r["distinct_answers"] == 3
    assert r["distinct_sft_answers"] == 3 and r["num_mazes"] == 3 and r["kind"] == "math"


@pytest.mark.parametrize("field,value,match", [
    ("model.source", "zip", "model.source"),
    ("task.templates", "small_add,nope", "task.templates"),
    ("eval.top_p", 1.5, "eval.top_p"),
    ("model.init_checkpoint", "/tmp/x", "model.init_checkpoint"),
])
def test_bad_lm_fields_fail_before_any_model_loads(field, value, match, tmp_path):
    cfg = util.set_field(load("math/smollm2_arith.py"), field, value)
    with pytest.raises(common.StudyError, match=match):
        setup.validate(cfg, ["uniform", "sera"], [0])


def test_disjoint_methods_processes_never_share_a_run():
    cfg = load("math/smollm2_arith_quick.py")
    with_base = setup.rl_plan(cfg, ["uniform"], [0], only_these_methods=True)
    without = setup.rl_plan(cfg, ["sera"], [0], only_these_methods=True)
    assert [a for a, _ in with_base] == ["uniform", setup.NULL]
    assert [a for a, _ in without] == ["sera"]
    # Without --methods every arm and its controls run, as before.
    assert [a for a, _ in setup.rl_plan(cfg, ["uniform", "sera"], [0])] == [
        "uniform", "sera", setup.NULL]

