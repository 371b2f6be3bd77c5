"""The grader's size bounds (`sera_jax.tasks.mathqa.bounds`): pathological answers are
refused fast, at every entry point, and long numerals compare exactly."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sera_jax.tasks.mathqa import bounds, grader

# Answers whose exact value no machine can write down, or that SymPy would take minutes on:
# power towers, factorials, huge exponents, parse-time evaluation, deep nesting, long digits.
ADVERSARIAL = [
    "9^{9^{9^{9}}}", "9^{9^{9}}", "2^{2^{2^{2^{2^{2}}}}}", "10^{10^{10}}", "2^{10^{6}}",
    "{10^{6}}!", "100000!", "(10!)!", "((5!)!)!", "9!!!!!!!!", "{-1}^{10^{100}}",
    "0.5^{10^{9}}", "\\frac{10^{10^{5}}}{3}", "\\sqrt{10^{10^{7}}}", "e^{e^{e^{100}}}",
    "\\lfloor 10^{10^{10}} \\rfloor", "(x+1)^{10^{6}}", "x^{10^{9}}", "(x+1)^{1000}",
    "\\binom{1000000}{500000}", "\\binom{10^{6}}{5 \\cdot 10^{5}}", "\\Gamma(100000)",
    "\\operatorname{eye}(100000)", "\\operatorname{zeros}(10^{5}, 10^{5})",
    "\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\gcd(9^{9^{9}}, 6)",
    "\\max(9^{9^{9^{9}}}, 1)", "\\sum_{i=1}^{10^{9}} i!", "\\prod_{i=1}^{10^{6}} i",
    "1e9999 \\cdot 1e9999", "2^{1e4}", "(" * 150 + "1" + ")" * 150,
    "\\frac{1}{" * 60 + "2" + "}" * 60, "\\sqrt{" * 100 + "2" + "}" * 100,
    "2^{" * 60 + "2" + "}" * 60, "9" * 401, "7" * 100_000, "1," * 300 + "1",
]


def _generated(n: int, seed: int = 0) -> list[str]:
    """Random nests of the growth operators (towers, factorials, binomials, fractions)."""
    rng = random.Random(seed)

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.2:
            return rng.choice(["2", "9", "10", "99", "x", "10^{6}", "1e300",
                               str(rng.randint(1, 10**6))])
        a, b = expr(depth - 1), expr(depth - 1)
        return rng.choice([f"{a}^{{{b}}}", f"{{{a}}}!", f"\\binom{{{a}}}{{{b}}}",
                           f"\\frac{{{a}}}{{{b}}}", f"({a})({b})", f"{a}+{b}",
                           f"\\sqrt{{{a}}}", f"\\Gamma({a})", f"({a})^{{{b}}}!"])

    return [expr(rng.randint(2, 5)) for _ in range(n)]


# The child grades every answer at every entry point and reports its slowest call: a hang
# there fails the test at the subprocess timeout instead of blocking the suite.
_CHILD = """
import json, sys, time
from sera_jax.tasks.mathqa import grader
from sera_jax.tasks.mathqa.task import MathTask  # noqa: F401 -- loads JAX, as a trainer does

answers = json.load(sys.stdin)
worst = (0.0, None)
for answer in answers:
    for response in ("\\\\boxed{" + answer + "}", "so it is $" + answer + "$"):
        for call in (lambda: grader.grade(response, "1", timeout_s=1),
                     lambda: grader.grade(response, "x^{2}", timeout_s=1),
                     lambda: grader.answer_key(response, timeout_s=1),
                     lambda: grader.grade_batch([response], ["7"], timeout_s=1)):
            start = time.perf_counter()
            call()
            worst = max(worst, (time.perf_counter() - start, response[:80]))
    start = time.perf_counter()
    try:
        grader.check_gold(answer, timeout_s=1)
    except ValueError:
        pass
    worst = max(worst, (time.perf_counter() - start, "gold " + answer[:80]))
print(json.dumps({"worst": worst}))
"""


def test_pathological_answers_are_bounded_in_time_at_every_entry_point():
    """Power towers, factorials, huge exponents, deep nesting and long digit strings (a fixed
    list plus generated nests): every grader entry point returns within a bound per call
    (grade 0 or a string key); a gold among them is accepted or refused with a ValueError."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    answers = ADVERSARIAL + _generated(40)
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(answers),
                             cwd=root, env={**os.environ, "PYTHONPATH": root},
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a grader call hung on an adversarial answer (child killed after 120 s)")
    assert out.returncode == 0, out.stderr[-3000:]
    seconds, where = json.loads(out.stdout.strip().splitlines()[-1])["worst"]
    assert seconds < 4.0, f"{where!r} took {seconds:.1f} s"


@pytest.mark.parametrize("answer", ["9^{9^{9^{9}}}", "{10^{6}}!", "2^{10^{6}}", "(x+1)^{1000}",
                                    "\\binom{1000000}{500000}", "\\Gamma(100000)"])
def test_pathological_answers_grade_zero_and_key_as_their_text(answer):
    response = f"The answer is \\boxed{{{answer}}}."
    assert grader.grade(response, "1") == 0.0
    assert grader.answer_key(response) == answer
    with pytest.raises(ValueError, match="beyond the grader's size bounds"):
        grader.check_gold(answer)


def test_bounded_answers_still_evaluate():
    """The bounds keep what a math answer can reasonably be: 100!, 2^{1000}, \\binom{10}{3},
    sums of a few terms, x^{2}, 10^{9999} (the largest scientific-notation answer)."""
    assert grader.grade("\\boxed{2^{10}}", "1024") == 1.0
    assert grader.grade("\\boxed{\\binom{10}{3}}", "120") == 1.0
    assert grader.grade("\\boxed{\\sum_{i=1}^{100} i}", "5050") == 1.0
    assert grader.grade("\\boxed{(x+1)^{2}}", "x^2+2x+1") == 1.0
    assert grader.answer_key("\\boxed{5!}") == "120"
    assert grader.answer_key("\\boxed{2^{1000}}") == str(2**1000)
    assert grader.answer_key("\\boxed{10^{9999}}") == "1" + "0" * 9999  # past str()'s limit
    for answer in ("100!", "2^{1000}", "x^{100}", "10^{9999}", "\\frac{1}{2^{60}}"):
        (expr, _) = grader._parse(answer, 5)
        assert bounds.within_bounds(expr), answer


def test_within_bounds_reads_the_tree_not_the_value():
    import sympy

    x = sympy.Symbol("x")
    big = lambda a, b: sympy.Pow(a, b, evaluate=False)  # noqa: E731
    assert not bounds.within_bounds(big(9, big(9, big(9, 9))))
    assert not bounds.within_bounds(big(2, 70_000))  # 21,072 digits
    assert bounds.within_bounds(big(2, 60_000))  # 18,062 digits
    assert not bounds.within_bounds(sympy.factorial(10**6, evaluate=False))
    assert bounds.within_bounds(sympy.factorial(5000, evaluate=False))  # 16,326 digits
    assert not bounds.within_bounds(big(x + 1, 101))
    assert bounds.within_bounds(big(x + 1, 100))
    assert bounds.within_bounds("some string")


def test_a_deadline_whose_first_timeout_is_swallowed_still_stops_the_body():
    """A timeout raised inside a GC callback is lost (JAX registers one; a 1 s parse ran
    48 s): the deadline re-fires until the body stops, then never fires again."""
    import signal
    import time

    from math_verify.errors import TimeoutException

    before, swallowed, start = signal.getsignal(signal.SIGALRM), [], time.perf_counter()
    with pytest.raises(TimeoutException):
        with bounds.deadline(0.1):
            while True:
                try:
                    time.sleep(0.01)
                except TimeoutException:
                    if not swallowed:  # lost once, as in a GC callback
                        swallowed.append(time.perf_counter() - start)
                        continue
                    raise
    assert swallowed and time.perf_counter() - start < 1.0
    time.sleep(0.2)  # no stray re-fire after the body
    assert signal.getsignal(signal.SIGALRM) is before


# ------------------------------------------------------------------------- long numerals

def test_long_numeric_answers_grade_against_their_own_gold():
    """A correct 401-digit or 100,000-digit answer is 1 against its own gold (exact string
    comparison past MAX_ANSWER_CHARS), whatever the formatting; one digit off is 0."""
    for digits in ("9" + "3" * 400, "".join(random.Random(1).choices("0123456789", k=100_000))):
        digits = digits.lstrip("0")
        assert grader.grade(f"\\boxed{{{digits}}}", digits) == 1.0
        assert grader.grade(f"The answer is {digits}.", digits) == 1.0
        assert grader.grade(f"\\boxed{{-{digits}}}", "-" + digits) == 1.0
        assert grader.grade(f"\\boxed{{-{digits}}}", digits) == 0.0
        off = digits[:-1] + str((int(digits[-1]) + 1) % 10)
        assert grader.grade(f"\\boxed{{{off}}}", digits) == 0.0
        assert grader.grade(f"\\boxed{{{digits}0}}", digits) == 0.0
        assert grader.grade(f"\\boxed{{00{digits}.000}}", digits) == 1.0
        assert grader.answer_key(f"\\boxed{{{digits}}}") == digits
    long = "1" + "0" * 400
    assert grader.grade("\\boxed{10^{400}}", long) == 1.0  # a short form of a long gold
    assert grader.grade(f"\\boxed{{{long}}}", "10^{400}") == 1.0
    assert grader.grade(f"\\boxed{{{long}}}", "1e400") == 1.0
    assert grader.grade("\\boxed{10^{400}+1}", long) == 0.0
    assert grader.answer_key("\\boxed{10^{400}}") == grader.answer_key(f"so {long}") == long
    assert grader.grade("\\boxed{0.5" + "0" * 500 + "}", "1/2") == 1.0
    assert grader.answer_key("\\boxed{0.5" + "0" * 500 + "}") == grader.answer_key("0.5")
    assert grader.grade("\\boxed{" + "1" * (bounds.MAX_NUMERAL_CHARS + 1) + "}", "1") == 0.0


@settings(max_examples=60, deadline=None)
@given(value=st.integers(-10**600, 10**600), scale=st.integers(0, 5),
       lead=st.integers(0, 2), trail=st.integers(0, 3), groups=st.booleans())
def test_canonical_numeral_is_the_value(value, scale, lead, trail, groups):
    """Leading zeros, trailing decimal zeros, a '+' and thousands groups never change the
    canonical form; the canonical form has the value."""
    from fractions import Fraction

    digits = f"{abs(value):,}" if groups else str(abs(value))
    text = ("-" if value < 0 else "") + "0" * lead * (not groups) + digits
    if scale:
        whole, frac = divmod(abs(value), 10**scale)
        body = f"{whole:,}" if groups else str(whole)
        text = ("-" if value < 0 else "") + body + "." + str(frac).zfill(scale) + "0" * trail
    canonical = bounds.canonical_numeral(text)
    p, q = bounds.numeral_fraction(canonical)
    assert Fraction(p, q) == Fraction(value, 10**scale)
    assert canonical == bounds.canonical_numeral(canonical)


@pytest.mark.parametrize("n", [0, 7, -12, 10**4000, -(10**4300) - 1, 3**20_000, -(7**9000)],
                         ids=["0", "7", "-12", "1e4000", "-1e4300-1", "3^20000", "-7^9000"])
def test_int_to_str_round_trips_past_pythons_digit_limit(n):
    text = bounds.int_to_str(n)
    assert bounds.str_to_int(text.lstrip("-")) * (-1 if n < 0 else 1) == n
    assert text[0] != "0" or n == 0
    if abs(n) < 10**4000:
        assert text == str(n)
