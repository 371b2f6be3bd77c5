"""Answer extraction and math-verify grading: tricky equivalent forms, totality (fuzz)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.tasks.mathqa import grader

# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} first, then \\boxed{2}", "2"),  # the last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces balanced
        ("\\boxed{\\text{\\{a\\}}}", "\\text{\\{a\\}}"),
        ("\\boxed{7} and then \\boxed{3", "7"),  # an unclosed box is skipped
        ("\\fbox{5}", "5"),
        ("hence \\boxed 9.", "9"),  # brace-less LaTeX form
        ("\\boxedx{3} but the total is 4", "4"),  # \boxedx is another macro -> fallback
        ("He pays 1,250 dollars", "1,250"),  # fallback: last number, commas kept
        ("the temperature drops to -5 degrees", "-5"),
        ("a share of 3/4 of the cake", "3/4"),
        ("roughly 2.75 km, not 3", "3"),
        ("no numbers here", None),
        ("", None),
        ("\\boxed{}", None),
    ],
)
def test_extract_answer(text, expected):
    assert grader.extract_answer(text) == expected


def test_gold_from_gsm8k():
    assert grader.gold_from_gsm8k("48/2 = <<48/2=24>>24\n#### 1,024") == "1024"
    with pytest.raises(ValueError, match="####"):
        grader.gold_from_gsm8k("the answer is 4")


# ------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{42}", "42"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac12}", "1/2"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{1,000}", "1000"),
        ("The total is \\boxed{\\$1,000}.", "1000"),
        ("\\boxed{18 \\text{ dollars}}", "18"),
        ("\\boxed{12\\text{ cm}}", "12"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{25\\%}", "25"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("The answer is 1,234 apples.", "1234"),  # fallback to the final number
        ("So she has -7 left", "-7"),
        ("\\boxed{x = 5}", "5"),
    ],
)
def test_equivalent_forms_are_correct(response, gold):
    assert grader.grade(response, gold) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{41}", "42"),
        ("\\boxed{-3}", "3"),
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("\\boxed{1,001}", "1000"),
        ("I don't know", "42"),
        ("42 is what I first thought, but \\boxed{43}", "42"),  # the box beats prose
    ],
)
def test_wrong_answers_are_wrong(response, gold):
    assert grader.grade(response, gold) == 0.0


def test_truncated_is_wrong():
    assert grader.grade("\\boxed{42}", "42", truncated=False) == 1.0
    assert grader.grade("\\boxed{42}", "42", truncated=True) == 0.0


def test_grade_batch_and_its_errors():
    rewards = grader.grade_batch(["\\boxed{2}", "\\boxed{3}", "2"], ["2", "2", "2"], [0, 0, 1])
    np.testing.assert_array_equal(rewards, np.array([1.0, 0.0, 0.0], np.float32))
    assert rewards.dtype == np.float32
    with pytest.raises(ValueError, match="same length"):
        grader.grade_batch(["1"], ["1", "2"])
    with pytest.raises(ValueError, match="truncated"):
        grader.grade_batch(["1"], ["1"], [False, True])


def test_answer_key_groups_equivalent_answers():
    keys = [
        grader.answer_key(r)
        for r in ("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}", "it is 1/2", "\\boxed{\\dfrac{2}{4}}")
    ]
    assert len(set(keys)) == 1, keys
    assert grader.answer_key("\\boxed{1,000}") == grader.answer_key("so 1000") == "1000"
    assert grader.answer_key("\\boxed{7}") != grader.answer_key("\\boxed{-7}")
    assert grader.answer_key("nothing") is None
    assert grader.answer_key("\\boxed{7}", truncated=True) is None


def test_pathological_inputs_are_fast_and_wrong():
    import time

    start = time.perf_counter()
    for text in ("\\boxed{" * 20_000, "\\boxed . " * 20_000, "{" * 50_000 + "}" * 49_999):
        assert grader.grade(text, "1") == 0.0
    assert time.perf_counter() - start < 10.0


# ------------------------------------------------------------------------------- fuzzing

# LaTeX-ish strings built from math tokens: they reach the SymPy parser, plain text rarely does.
_MATHY = st.lists(
    st.sampled_from(list("0123456789-+*/^.,{}()[]$%\\ abcxyz=") + [
        "\\boxed{", "\\frac", "\\sqrt", "\\text{", "\\fbox", "\\left(", "\\right)", "\\infty",
        "\\pi", "\\cup", "\\le", "####", "\n",
    ]),
    max_size=40,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(response=st.one_of(st.text(max_size=200), _MATHY), gold=st.one_of(_MATHY, st.text()),
       truncated=st.booleans())
def test_grader_is_total(response, gold, truncated):
    reward = grader.grade(response, gold, truncated=truncated)
    assert reward in (0.0, 1.0)
    if truncated:
        assert reward == 0.0
    key = grader.answer_key(response, truncated=truncated)
    assert key is None or isinstance(key, str)
