"""Answer extraction and verified grading for math responses.

The verifier is the `math-verify` library (parse to SymPy, then equivalence: numeric within
tolerance, symbolic simplification, sets, intervals, ...), not string matching. This module
only decides *which* substring of a response is the answer:

1. the content of the last `\\boxed{...}` (or `\\fbox{...}`), with balanced braces;
2. otherwise the last number in the text (`1,234.5`, `-3`, `3/4`), the usual fallback for
   models that forget the box.

Everything here is total: any string (random bytes, unbalanced braces, 10^6 characters)
yields a grade in {0, 1} without raising. A response that hit the length cap is wrong
whatever it contains (the spec's "truncated = wrong" rule).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

# `math_verify` signals timeouts with a BaseException subclass; it must be caught explicitly.
from math_verify import parse, verify
from math_verify.errors import TimeoutException

# math-verify warns on every timeout / unparsable string; a policy early in RL produces
# thousands of those per step.
logging.getLogger("math_verify").setLevel(logging.ERROR)

#: Longest answer string handed to SymPy: longer "answers" are garbage and only cost time.
MAX_ANSWER_CHARS = 400

# `\\boxed` / `\\fbox` not followed by a letter (`\\boxedx` would be another macro).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TOKEN = re.compile(r"\S*")
# A number as written in prose: optional sign, digits with optional thousands commas,
# optional decimals, optional "/denominator" (3/4).
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?")


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` in `text`, or None.

    Braces are balanced (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); an unclosed box (the
    model ran out of tokens mid-answer) is skipped in favour of an earlier complete one.
    `\\boxed 5` (no braces, legal LaTeX) gives the following token.
    """
    if not isinstance(text, str):
        return None
    matches: dict[int, int] | None = None  # computed on first need
    # All command positions in one regex pass, then right to left: linear in len(text).
    for found in reversed(list(_BOX_RE.finditer(text))):
        i = found.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            matches = _brace_matches(text) if matches is None else matches
            if i in matches:
                return text[i + 1 : matches[i]].strip()
        elif i > found.end():  # "\\boxed 5": the next whitespace-delimited token
            token = _TOKEN.match(text, i).group().rstrip(".$")
            if token:
                return token
        # An unclosed box is no answer: keep looking left.
    return None


def _brace_matches(text: str) -> dict[int, int]:
    """Position of each '{' that closes -> position of its '}' (one O(len) stack pass)."""
    stack: list[int] = []
    matches: dict[int, int] = {}
    for j, ch in enumerate(text):
        if ch == "{":
            stack.append(j)
        elif ch == "}" and stack:
            matches[stack.pop()] = j
    return matches


def last_number(text: str) -> str | None:
    """The last number written in `text` (commas kept, fractions `a/b` kept), or None."""
    if not isinstance(text, str):
        return None
    matches = _NUMBER.findall(text)
    return matches[-1].replace(" ", "") if matches else None


def extract_answer(text: str) -> str | None:
    """The answer string of a response: last boxed content, else the last number, else None."""
    boxed = last_boxed(text)
    if boxed:
        return boxed
    return last_number(text)


def gold_from_gsm8k(answer_field: str) -> str:
    """The gold answer of a GSM8K `answer` field: the text after the last '####', commas out.

    Raises ValueError when the field has no '####' marker.
    """
    if "####" not in answer_field:
        raise ValueError(
            f"answer field {answer_field[-80:]!r} has no '#### <answer>' marker "
            "(GSM8K format: '<reasoning>\\n#### 42')"
        )
    return answer_field.rsplit("####", 1)[1].strip().replace(",", "")


def _in_main_thread() -> bool:
    # math-verify's timeout uses signal.alarm, which only the main thread may set.
    return threading.current_thread() is threading.main_thread()


def _parse(answer: str, timeout_s: int) -> list:
    """Parse one extracted answer into math-verify's [sympy, str] form ([] on failure)."""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return []
    try:
        return parse(
            "\\boxed{" + answer + "}",
            parsing_timeout=timeout_s if _in_main_thread() else None,
        )
    except (Exception, TimeoutException):  # noqa: BLE001 -- the grader is total by contract
        return []


@lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout_s: int) -> tuple:
    # Gold answers repeat across the N rollouts of a prompt: parse each once.
    return tuple(_parse(gold, timeout_s))


def is_equivalent(gold: str, answer: str | None, *, timeout_s: int = 5) -> bool:
    """Whether the answer string is mathematically equivalent to the gold one (math-verify).

    `timeout_s` bounds parsing and comparison each (whole seconds: math-verify uses
    `signal.alarm`; off the main thread no timeout can be set and none is used).
    """
    if answer is None:
        return False
    try:
        gold_parsed = list(_parse_gold(str(gold), int(timeout_s)))
        pred = _parse(answer, int(timeout_s))
        if not gold_parsed or not pred:
            return False
        return bool(
            verify(gold_parsed, pred, timeout_seconds=timeout_s if _in_main_thread() else None)
        )
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return False


def grade(response: str, gold: str, *, truncated: bool = False, timeout_s: int = 5) -> float:
    """Binary reward of a response: 1.0 iff not truncated and its answer is equivalent to gold.

    The answer is `extract_answer(response)` (last `\\boxed{}`, else the final number).
    Never raises, whatever `response` holds.
    """
    if truncated:
        return 0.0
    try:
        return float(is_equivalent(gold, extract_answer(response), timeout_s=timeout_s))
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return 0.0


def grade_batch(
    responses: Sequence[str],
    golds: Sequence[str],
    truncated: Sequence[bool] | np.ndarray | None = None,
    *,
    timeout_s: int = 5,
) -> np.ndarray:
    """`grade` over a batch: float32 `[len(responses)]` in {0, 1}."""
    if len(responses) != len(golds):
        raise ValueError(
            f"responses and golds must have the same length, got {len(responses)} and "
            f"{len(golds)}"
        )
    if truncated is None:
        truncated = np.zeros(len(responses), dtype=bool)
    if len(truncated) != len(responses):
        raise ValueError(
            f"truncated must have one flag per response ({len(responses)}), got {len(truncated)}"
        )
    return np.asarray(
        [
            grade(r, g, truncated=bool(t), timeout_s=timeout_s)
            for r, g, t in zip(responses, golds, truncated)
        ],
        dtype=np.float32,
    )


def answer_key(response: str, *, truncated: bool = False, timeout_s: int = 5) -> str | None:
    """A canonical key of a response's answer for majority voting (None = abstain).

    Equivalent numbers get the same key (`0.5`, `\\frac{1}{2}`, `1/2` -> `'1/2'`; `1,000` and
    `1000` -> `'1000'`): a rational value is written as SymPy's exact `p/q`, a float is
    rationalised at 1e-9 first. Non-numeric answers use SymPy's string form, unparsable
    ones the stripped text. Truncated or answerless responses abstain.
    """
    if truncated:
        return None
    try:
        answer = extract_answer(response)
        if not answer:
            return None
        parsed = _parse(answer, timeout_s)
        if not parsed:
            return answer.strip()
        expr = parsed[0]
        if isinstance(expr, str):
            return expr.strip()
        import sympy  # math-verify depends on it; imported here to keep module import light

        if isinstance(expr, sympy.Number):
            value = sympy.nsimplify(expr, rational=True, tolerance=1e-9)
            return str(value)
        return str(expr)
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return None
