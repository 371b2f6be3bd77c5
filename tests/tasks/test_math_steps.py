"""Issue 49's task pieces: two-step templates, the sealed third split, few-shot turns and the
per-sample outcome classes."""

import numpy as np
import pytest

from sera_jax.models.tokenizer import load_tokenizer
from sera_jax.rl import evaluate as eval_lib
from sera_jax.studies.paired.evaluation import outcome_fields
from sera_jax.studies.paired.outcomes import parse
from sera_jax.tasks.mathqa import problems as gen
from sera_jax.tasks.mathqa import task as math_task
from sera_jax.tasks.mathqa.data import MathProblem
from tests import util

STEPS2 = ["chain_addsub", "chain_subadd", "mul_add", "mul_sub"]
SMALL2 = ["small_" + name for name in STEPS2]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("byte_tokenizer"))
    util.write_byte_tokenizer(path)
    return load_tokenizer(path)


@pytest.mark.parametrize("names", [STEPS2, SMALL2])
def test_two_step_golds_follow_the_order_of_operations(names):
    data = gen.generate_arithmetic(200, 60, seed=3, steps=(2,), templates=names)
    for p in data["train"] + data["test"]:
        expr = p.question.removeprefix("What is ").removesuffix("?").replace(" x ", " * ")
        assert int(p.answer) == eval(expr) and int(p.answer) >= 0  # noqa: S307 (own text)
        assert p.level == 2 and p.meta["template"] in names


def test_sealed_split_is_a_third_hash_band_disjoint_in_content():
    kw = dict(seed=0, steps=(2,), templates=SMALL2)
    two = gen.generate_arithmetic(128, 64, **kw)
    three = gen.generate_arithmetic(128, 64, num_sealed=64, sealed_fraction=0.25, **kw)
    keys = {s: {gen.content_key(p.meta["template"], p.meta["operands"]) for p in ps}
            for s, ps in three.items()}
    assert len(three["sealed"]) == 64
    assert not (keys["train"] & keys["test"] or keys["train"] & keys["sealed"]
                or keys["test"] & keys["sealed"])
    for key in keys["sealed"]:  # the band [test_fraction, test_fraction + sealed_fraction)
        assert gen.in_test_split(key, 0.5) and not gen.in_test_split(key, 0.25)
    # the held-out band is the two-split rule's: the same held-out problems
    assert [p.question for p in three["test"]] == [p.question for p in two["test"]]
    with pytest.raises(ValueError, match="num_sealed"):
        gen.generate_arithmetic(8, 8, num_sealed=4, **kw)
    with pytest.raises(ValueError, match="sealed_fraction"):
        gen.generate_arithmetic(8, 8, sealed_fraction=0.8, **kw)


def test_fewshot_examples_are_checked_and_never_drawn():
    for name in gen.FEWSHOT:
        turns = gen.fewshot_turns(name)
        assert len(turns) == len(gen.FEWSHOT[name])
        keys = set(gen.fewshot_keys(name))
        data = gen.generate_arithmetic(400, 200, seed=1, steps=(2,), templates=STEPS2,
                                       exclude=keys)
        drawn = {gen.content_key(p.meta["template"], p.meta["operands"])
                 for ps in data.values() for p in ps}
        assert not drawn & keys
    assert gen.fewshot_turns("") == () and gen.fewshot_keys("") == ()
    with pytest.raises(ValueError, match="fewshot='nope'"):
        gen.fewshot_turns("nope")


def test_fewshot_turns_come_first_in_the_chat_prompt(tok):
    turns = gen.fewshot_turns("steps_short")
    problem = MathProblem("What is 3 + 4 - 2?", "5")
    task = math_task.MathTask({"eval": [problem]}, tok, template="steps", chat=True,
                              max_new_tokens=8, fewshot=turns)
    text = tok.decode(task.prompt_tokens("eval", [0])[0])
    first = text.index(turns[0][0])
    assert first < text.index(turns[0][1]) < text.index("What is 3 + 4 - 2?")
    assert text.endswith("What is 3 + 4 - 2? Show the steps on one line.<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert text.count("<|im_start|>assistant") == len(turns) + 1
    with pytest.raises(ValueError, match="chat=True"):
        math_task.MathTask({"eval": [problem]}, tok, chat=False, fewshot=turns)


def test_outcome_classes_truncated_first_then_correct_then_no_answer():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 0.0])
    truncated = np.array([False, False, False, True, True])
    answers = ["5", "6", None, "5", None]
    np.testing.assert_array_equal(eval_lib.outcome_classes(rewards, truncated, answers),
                                  [0, 1, 2, 3, 3])
    # a task without answers has no "no answer" class
    np.testing.assert_array_equal(eval_lib.outcome_classes(rewards, truncated, None),
                                  [0, 1, 1, 3, 3])
    rec = outcome_fields(np.array([[0, 1], [2, 3]]), np.array([[3, 4], [5, 6]]))
    assert rec["outcomes"] == ["01", "23"] and rec["lengths"] == [[3, 4], [5, 6]]
    assert rec["outcome_fractions"] == {"correct": 0.25, "wrong": 0.25, "no_answer": 0.25,
                                        "truncated": 0.25}
    np.testing.assert_array_equal(parse(rec["outcomes"]), [[0, 1], [2, 3]])
