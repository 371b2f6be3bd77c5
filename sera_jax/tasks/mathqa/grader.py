"""Answer extraction and verified grading for math responses.

The verifier is the `math-verify` library: every answer string below is handed to its
LaTeX normalisation (units, `\\text{}`, `\\$`, `\\%`, malformed operators, ...) and SymPy
parser, then to its equivalence check (numeric within tolerance, symbolic simplification,
sets, intervals, equations `x = 5`), never to string matching. This module decides *which*
substring of a response is the answer, by these rules (each pinned by a test in
`tests/tasks/test_math_grader.py`; the table is in `docs/robustness.md`):

Normalisation (`normalize_text`, applied to responses and gold answers alike):

* N1. Unicode minus signs (U+2212, U+2796, U+FE63, U+FF0D, U+02D7) become `-`; an en dash
  or figure dash in unary position before a digit (`–3`) too.
* N2. Full-width digits and `．／＋` become ASCII.
* N3. A thin / narrow / no-break space between digit groups is dropped (`1 234` -> `1234`);
  other exotic spaces become a plain space, zero-width characters are removed.
* N4. A leading-dot decimal gets its zero: `.5` -> `0.5`, `-.5` -> `-0.5`.

Answer selection (`extract_answer`):

* A1. The content of the last *complete*, non-empty `\\boxed{...}` / `\\fbox{...}`
  (balanced braces; `\\boxed 5`, legal LaTeX, gives the following token).
* A2. Without one, the text before the first *unclosed* box is searched, empty boxes
  (`\\boxed{}`, an echoed instruction) blanked: nothing written inside an unclosed
  `\\boxed{...` (a cut-off or malformed answer) is ever read.
* A3. In that text the answer is the *rightmost mathematical item*, one of:
  (a) delimited math `$$...$$`, `\\[...\\]`, `\\(...\\)`, `$...$` (a `$...$` whose content
  has prose words is two currency signs, not math), read as a whole: `$\\frac{1}{2}$` is 1/2,
  `$2^{10}$` is 1024, never 2 or 10;
  (b) bare LaTeX (a run of tokens with `\\cmd`, braces or a numeric power `2^10`, joined by
  numbers and operators): `2^{10}`, `5 \\times 3`, `\\frac{3}{4}`;
  (c) a prose number: optional unary `-`, digits with optional `,ddd` thousands groups,
  optional decimals (or a leading-dot decimal), optional exponent `e3`, optional
  `/denominator` (`1,250`, `-3`, `0.5`, `3/4`, `1.5e3`, `3e2.` at a sentence end). A number
  glued to a word (`x2`) or written as an exponent / subscript (`cm^2`, `x_1`) is not an
  answer.
  If the rightmost item cannot be parsed the response has no answer: the grader never falls
  back to an earlier number.
* A4. Trailing sentence punctuation and LaTeX spacing are stripped from the answer
  (`\\boxed{5.}` is 5, `\\boxed{3\\,}` is 3); `!` (factorial) is kept.

Parsing (`_parse`, the one door to SymPy, for answers and gold answers alike, wherever the
answer came from: a box, `$...$`, prose):

* P1. Scientific notation is a number, never Euler's e: a token `<mantissa>e<exponent>` /
  `E` (mantissa `3`, `1.5`, `.5`; exponent optionally signed; not glued to a word or a
  decimal point) is written `<mantissa>\\times10^{<exponent>}` before SymPy sees it, so
  `\\boxed{3e2}` is 300 and `1.5e3` is 1500 (math-verify alone reads `3*E*2`). `6e`, `e^2`,
  `2e^{3}` have no digits right after the `e` and keep Euler's e. An exponent beyond
  +-`MAX_EXPONENT` makes the answer unparsable (no answer): SymPy would build the number.

Input type: a response must be `str`. Anything else (`bytes`, None, a token array) raises
TypeError naming the type and the fix (decode first) rather than grading 0. So must a gold
answer; a gold no response could ever match raises ValueError (`check_gold`): empty, longer
than `MAX_ANSWER_CHARS` without being a plain number, or beyond the size bounds below. A gold
that SymPy cannot parse is logged once (every response to it grades 0).

Bounds (`sera_jax.tasks.mathqa.bounds`): SymPy never sees an answer whose evaluation could
exceed `bounds.MAX_VALUE_DIGITS` digits (`9^{9^{9^{9}}}`, `{10^{6}}!`), a symbolic power
beyond `bounds.MAX_SYMBOLIC_EXPONENT`, or a construct the LaTeX parser computes while parsing
(`\\binom` of large numbers, matrix operators): such a response grades 0 and is keyed by its
string. Python computes a huge number in one C call that no timeout interrupts, so these are
decided from the expression tree before anything is evaluated. A plain numeral longer than
`MAX_ANSWER_CHARS` (up to `bounds.MAX_NUMERAL_CHARS` characters; a 100,000-digit integer) is
compared exactly, as a canonical decimal string (`012,300.50` = `12300.5`), or with an
expression's exact value when the other side is short (`10^{400}` = 1 and 400 zeros).

Not handled (by design): decimal commas (`2,5` outside a box is the two numbers 2 and
5), mixed numbers (`1 1/2` reads 1/2), numbers written as words.

Why not math-verify's own extraction (`parse(response)`): measured on math-verify 0.9 it
reads a number from inside an unclosed box (`\\boxed{\\frac{1}{2}` -> 1/2), takes an early
number after the word "answer" over the final one ("To answer this, note that 3 apples cost
6 dollars. In total she pays 40." -> 3), misses `total:12` and `(12)`, reads `1,2,3` as 1.2
and a bare `2^{10}` as 2, and its regexes are super-linear on some inputs (`"\\\\[" * 5000`
takes 1.6 s). Its normalisation and its parser are used for every answer.

Everything here is total and time-bounded: any `str` (random bytes, unbalanced braces,
10^6 characters) yields a grade in {0, 1} without raising; extraction is linear in the
response length; SymPy sees at most `MAX_ANSWER_CHARS` characters under `timeout_s` per
parse, comparison and key (`bounds.deadline`, a re-firing `SIGALRM`: on the main thread only;
off it only the size bounds hold), and every number it evaluates is within the bounds above.
A response that hit the length cap is wrong whatever it contains (the spec's "truncated =
wrong" rule).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

# `math_verify` signals timeouts with a BaseException subclass; it must be caught explicitly.
from math_verify import parse, verify
from math_verify.errors import TimeoutException

from sera_jax.tasks.mathqa import bounds

# math-verify warns on every timeout / unparsable string; a policy early in RL produces
# thousands of those per step.
logging.getLogger("math_verify").setLevel(logging.ERROR)
_log = logging.getLogger(__name__)

#: Longest answer string handed to SymPy: longer "answers" are garbage and only cost time,
#: except plain numerals, which are compared exactly as strings (`bounds.canonical_numeral`).
#: The data loaders refuse other gold answers longer than this (they could never be matched).
MAX_ANSWER_CHARS = 400
#: Largest |exponent| of scientific notation read as a number (rule P1).
MAX_EXPONENT = 9999


def _require_text(response: object, name: str = "response") -> str:
    """`response` itself if it is a `str`; TypeError otherwise (a bytes / None / token
    response is a caller's bug, not a wrong answer)."""
    if not isinstance(response, str):
        if isinstance(response, (bytes, bytearray)):
            fix = f" (decode it first: {name}.decode('utf-8'))"
        elif isinstance(response, (int, float)):
            fix = f" (pass it as text: str({name}))"
        else:
            fix = " (pass the decoded text)"
        raise TypeError(f"{name} must be a str, got {type(response).__name__}{fix}")
    return response


# ------------------------------------------------------------------------ normalisation

_TRANSLATE = str.maketrans(
    {
        **{c: "-" for c in "\u2212\u2796\ufe63\uff0d\u02d7"},  # N1: minus signs
        **{chr(0xFF10 + d): str(d) for d in range(10)},  # N2: full-width digits
        "\uff0e": ".", "\uff0f": "/", "\uff0b": "+",
        **{c: " " for c in "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2008\u3000"},  # N3
        **{c: "" for c in "\u200b\u200c\u200d\u2060\ufeff"},
    }
)
# N1: an en dash / figure dash used as a unary minus ("–3", "(–3)", "= –0.5").
_UNARY_DASH = re.compile(r"(?<![\w)\]}.])[\u2012\u2013](?=\.?\d)")
# N3: digit-group separators that are never word spaces.
_GROUP_SPACE = re.compile(r"(?<=\d)[\u00a0\u2007\u2009\u202f](?=\d{3}(?!\d))")
_OTHER_SPACE = re.compile(r"[\u00a0\u2007\u2009\u202f]")
# N4: ".5" -> "0.5" (not after a word, a '.', a closing bracket or a backslash).
_LEADING_DOT = re.compile(r"(?<![\w.)\]}\\])\.(?=\d)")


def normalize_text(text: str) -> str:
    """Rules N1-N4 of the module docstring (Unicode minus, full-width digits, digit-group
    spaces, leading-dot decimals); the input of every other step, gold answers included."""
    text = _UNARY_DASH.sub("-", text.translate(_TRANSLATE))
    text = _OTHER_SPACE.sub(" ", _GROUP_SPACE.sub("", text))
    return _LEADING_DOT.sub("0.", text)


# Trailing sentence punctuation and LaTeX spacing (A4); "!" is a factorial, so it stays.
_TRAILING_CHARS = " \t\r\n.,;:~"
_TRAILING_MACROS = ("\\quad", "\\qquad", "\\!")


def _clean(answer: str) -> str:
    """Rule A4 (linear time: each round is one `rstrip`, and rounds are capped)."""
    for _ in range(32):
        stripped = answer.rstrip(_TRAILING_CHARS)
        if len(stripped) < len(answer):
            backslashes = len(stripped) - len(stripped.rstrip("\\"))
            if backslashes % 2:  # "\\," "\\;" "\\:" "\\~": LaTeX spacing, not a backslash
                stripped = stripped[:-1]
        for macro in _TRAILING_MACROS:
            if stripped.endswith(macro):
                stripped = stripped[: -len(macro)]
                break
        if len(stripped) == len(answer):
            break
        answer = stripped
    return answer.strip()


# ------------------------------------------------------------------------------ boxes

# `\\boxed` / `\\fbox` not followed by a letter (`\\boxedx` would be another macro).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_TOKEN = re.compile(r"\S*")


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty `\\boxed{...}` / `\\fbox{...}` in `text`, or
    None (A1).

    Braces are balanced (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); an unclosed box (the
    model ran out of tokens mid-answer) or an empty one (`\\boxed{}`, an echoed instruction)
    is skipped in favour of an earlier complete one. `\\boxed 5` (no braces, legal LaTeX)
    gives the following token.
    """
    _require_text(text, "text")
    for _, _, content in reversed(_boxes(text)):
        if content is not None and content.strip():
            return content.strip()
    return None


def _boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Every box command `(start, end, content)`, left to right; content None = unclosed
    (its span then runs to the end of the text). Linear: one regex pass, one brace pass."""
    boxes: list[tuple[int, int, str | None]] = []
    matches: dict[int, int] | None = None  # computed on first need
    for found in _BOX_RE.finditer(text):
        i = found.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            matches = _brace_matches(text) if matches is None else matches
            if i in matches:
                boxes.append((found.start(), matches[i] + 1, text[i + 1 : matches[i]]))
            else:
                boxes.append((found.start(), len(text), None))
        elif i > found.end():  # "\\boxed 5": the next whitespace-delimited token
            token = _TOKEN.match(text, i).group()
            boxes.append((found.start(), i + len(token), token.rstrip(".$")))
        else:
            boxes.append((found.start(), found.end(), ""))
    return boxes


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


# ------------------------------------------------------------- the fallback (A2, A3)

_OPENERS = {"$$": "$$", "\\[": "\\]", "\\(": "\\)", "$": "$"}
# `\\text{...}`-like groups hold prose legitimately; they are dropped before the word test.
_TEXT_GROUP = re.compile(r"\\(?:text|textbf|textit|mathrm|mbox|operatorname)\s*\{[^{}]*\}")
_PROSE_WORD = re.compile(r"(?:^|\s)[A-Za-z]{2,}(?=$|\s|[.,;:!?])")


def _opener_re(kinds: Sequence[str]) -> re.Pattern:
    alts = []
    for kind in kinds:
        if kind == "$$":
            alts.append(r"(?<!\\)\$\$")
        elif kind == "$":
            alts.append(r"(?<![\\\d])\$")  # "5$" ends a price, it opens no math
        else:
            alts.append(re.escape(kind))
    return re.compile("|".join(alts))


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    """Delimited math `(start, end, content)`, left to right, in one linear pass (A3a).

    An opener whose closer never comes is plain text, and so is every later opener of its
    kind (so the scan stays linear: no quadratic rescans of unclosed `\\[`).
    """
    spans: list[tuple[int, int, str]] = []
    live = ["$$", "\\[", "\\(", "$"]
    opener = _opener_re(live)
    i = 0
    while live:
        found = opener.search(text, i)
        if found is None:
            break
        kind, start = found.group(), found.start()
        body = found.end()
        if kind == "$":  # inline: same line, unescaped closer
            end = body
            while True:
                end = text.find("$", end)
                if end == -1 or text[end - 1] != "\\":
                    break
                end += 1
            if end == -1:
                live.remove("$")
                opener = _opener_re(live) if live else opener
                continue
            newline = text.find("\n", body, end)
            content = text[body:end]
            if newline != -1 or not content.strip() or _is_prose(content):
                i = body  # not math; the closing '$' may open the next span
                continue
            spans.append((start, end + 1, content))
            i = end + 1
            continue
        end = text.find(_OPENERS[kind], body)
        if end == -1:
            live.remove(kind)
            opener = _opener_re(live) if live else opener
            i = start
            continue
        if text[body:end].strip():
            spans.append((start, end + len(_OPENERS[kind]), text[body:end]))
        i = end + len(_OPENERS[kind])
    return spans


def _is_prose(content: str) -> bool:
    """`$12 and then $` holds words: two currency signs, not math."""
    return bool(_PROSE_WORD.search(_TEXT_GROUP.sub(" ", content)))


_WORD = re.compile(r"\S+")
# A token that is LaTeX: a command, a brace, or a power / subscript of a number or group.
_LATEX_TOKEN = re.compile(r"\\[A-Za-z$%{}]|[{}]|[\d)\]}][\^_]")
# A token that may sit inside a LaTeX run: numbers and operators only.
_MATH_TOKEN = re.compile(r"[\d.,+\-*/=()\[\]<>|]+")

# A prose number (A3c): not glued to a word / decimal point / exponent on its left.
_NUMBER = re.compile(
    r"(?<![\w.^])(?:(?<![\w)\]}])-)?"
    r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:[eE][-+]?\d+(?!\w|\.\d))?"
    r"(?:\s*/\s*(?:\d+(?:\.\d+)?))?"
    r"(?![\d^])"
)


def _latex_runs(text: str, lo: int, hi: int) -> list[tuple[int, int, str]]:
    """Bare LaTeX runs in `text[lo:hi]` (A3b): maximal runs of LaTeX / number / operator
    tokens holding at least one LaTeX token."""
    runs: list[tuple[int, int, str]] = []
    current: list[re.Match] = []
    has_latex = False

    def close():
        if current and has_latex:
            runs.append((current[0].start(), current[-1].end(), ""))
        current.clear()

    for token in _WORD.finditer(text, lo, hi):
        word = token.group()
        if _LATEX_TOKEN.search(word):
            current.append(token)
            has_latex = True
        elif _MATH_TOKEN.fullmatch(word):
            current.append(token)
        else:
            close()
            has_latex = False
    close()
    return [(s, e, text[s:e]) for s, e, _ in runs]


def _last(matches):
    last = None
    for last in matches:  # noqa: B007 -- the loop only finds the last match
        pass
    return last


def _number_text(number: str) -> str:
    return number.replace(" ", "")  # "3 / 4" -> "3/4"; an exponent is read by `_parse` (P1)


def _fallback(text: str) -> str | None:
    """The rightmost mathematical item of `text` (A3), or None."""
    best: tuple[int, str] | None = None
    gaps, pos = [], 0
    for start, end, content in _math_spans(text):
        best = (end, content)
        gaps.append((pos, start))
        pos = end
    gaps.append((pos, len(text)))
    for lo, hi in gaps:
        runs = _latex_runs(text, lo, hi)
        if runs and (best is None or runs[-1][1] > best[0]):
            best = (runs[-1][1], runs[-1][2])
        # Prose numbers after the last run of this gap (earlier ones end before it).
        last = _last(_NUMBER.finditer(text, runs[-1][1] if runs else lo, hi))
        if last is not None and (best is None or last.end() > best[0]):
            best = (last.end(), _number_text(last.group()))
    return None if best is None else best[1]


def extract_answer(text: str) -> str | None:
    """The answer string of a response (rules A1-A4 of the module docstring), or None."""
    text = normalize_text(_require_text(text))
    boxes = _boxes(text)
    for _, _, content in reversed(boxes):  # A1 (+ A4: "\\boxed{.}" is an empty box)
        if content is not None:
            answer = _clean(content)
            if answer:
                return answer
    # A2: nothing from an unclosed box on; the (empty) complete boxes before it are blanked.
    pieces, pos = [], 0
    for start, end, content in boxes:
        if pos is None or start < pos:  # cut off already, or nested in a blanked box
            continue
        pieces.append(text[pos:start])
        if content is None:
            pos = None
        else:
            pieces.append(" " * (end - start))
            pos = end
    if pos is not None:
        pieces.append(text[pos:])
    answer = _fallback("".join(pieces))
    if answer is None:
        return None
    return _clean(answer) or None


def gold_from_gsm8k(answer_field: str) -> str:
    """The gold answer of a GSM8K `answer` field: the text after the last '####', commas out.

    Raises ValueError when the field has no '####' marker or nothing after it.
    """
    if not isinstance(answer_field, str):
        raise ValueError(
            f"answer field is {type(answer_field).__name__} {answer_field!r}, not a string "
            "(GSM8K format: '<reasoning>\\n#### 42')"
        )
    if "####" not in answer_field:
        raise ValueError(
            f"answer field {answer_field[-80:]!r} has no '#### <answer>' marker "
            "(GSM8K format: '<reasoning>\\n#### 42')"
        )
    gold = answer_field.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise ValueError(
            f"answer field {answer_field[-80:]!r} has nothing after its last '####' "
            "(GSM8K format: '<reasoning>\\n#### 42')"
        )
    return gold


def _timed(fn, timeout_s: int):
    """`fn()` under `bounds.deadline` (main thread only); raises TimeoutException."""
    with bounds.deadline(timeout_s):
        return fn()


# P1: scientific notation (not glued to a word, a decimal point or a backslash command).
_SCIENTIFIC = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([-+]?\d+)(?!\w|\.\d)")


def _scientific_to_latex(answer: str) -> str | None:
    """Rule P1: `1.5e3` -> `1.5\\times10^{3}` (None if an exponent exceeds MAX_EXPONENT)."""
    too_big = False

    def write(found: re.Match) -> str:
        nonlocal too_big
        exponent = int(found.group(2))
        too_big |= abs(exponent) > MAX_EXPONENT
        return f"{found.group(1).rstrip('.')}\\times10^{{{exponent}}}"

    written = _SCIENTIFIC.sub(write, answer)
    return None if too_big else written


def _parse_bounded(answer: str, timeout_s: int) -> tuple[list, bool]:
    """`(parsed, refused)`: math-verify's [sympy, str] form of one extracted answer ([] on
    failure); `refused` when it is beyond the size bounds (`bounds`), not just unparsable."""
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return [], False
    answer = _scientific_to_latex(answer)
    if answer is None or not bounds.screen(answer):
        return [], True
    try:
        with bounds.deadline(timeout_s):  # not math-verify's timeout: see `bounds.deadline`
            parsed = parse("\\boxed{" + answer + "}", parsing_timeout=None)
    except (Exception, TimeoutException):  # noqa: BLE001 -- the grader is total by contract
        return [], False
    if not all(bounds.within_bounds(p) for p in parsed):
        return [], True
    return parsed, False


def _parse(answer: str, timeout_s: int) -> list:
    """Parse one extracted answer into math-verify's [sympy, str] form ([] on failure or
    beyond the bounds)."""
    return _parse_bounded(answer, timeout_s)[0]


def normalize_gold(gold: str) -> str:
    """A gold answer as the grader compares it (rules N1-N4 and A4 applied)."""
    return _clean(normalize_text(str(gold)))


def check_gold(gold: object, *, timeout_s: int = 5) -> str:
    """The normalised gold answer (`normalize_gold`), or an error naming why no response
    could ever match it: TypeError for a non-`str` gold (bytes, a number), ValueError for an
    empty gold, one longer than `MAX_ANSWER_CHARS` that is not a plain numeral (of at most
    `bounds.MAX_NUMERAL_CHARS` characters), or one beyond the size bounds (`9^{9^{9^{9}}}`)."""
    _require_text(gold, "gold")
    return _gold(gold, int(timeout_s))[0]


@lru_cache(maxsize=4096)
def _gold(gold: str, timeout_s: int) -> tuple[str, str | None, tuple]:
    """`(normalised, canonical numeral or None, parsed)` of a `str` gold, or ValueError.
    Cached: a gold repeats across the N rollouts of a prompt (errors are not cached)."""
    normal = normalize_gold(gold)
    shown = f"{gold[:60]!r}{'...' if len(gold) > 60 else ''}"
    if not normal:
        raise ValueError(f"gold answer {shown} is empty: no response can match it")
    numeral = bounds.canonical_numeral(normal)
    if len(normal) > MAX_ANSWER_CHARS:
        if numeral is None:
            raise ValueError(
                f"gold answer {shown} has {len(normal)} characters, more than "
                f"MAX_ANSWER_CHARS={MAX_ANSWER_CHARS}, and is not a plain number of at most "
                f"{bounds.MAX_NUMERAL_CHARS} characters: no response can match it; shorten it")
        return normal, numeral, ()
    parsed, refused = _parse_bounded(normal, timeout_s)
    if refused:
        raise ValueError(
            f"gold answer {shown} is beyond the grader's size bounds (numbers of at most "
            f"{bounds.MAX_VALUE_DIGITS} digits, powers of a symbol up to "
            f"{bounds.MAX_SYMBOLIC_EXPONENT}, brackets nested up to {bounds.MAX_NESTING} deep, "
            "no large binomial / Gamma / matrix operator: sera_jax.tasks.mathqa.bounds): no "
            "response can match it; write it in a bounded form")
    if not parsed:
        _log.warning("gold answer %s cannot be parsed (or timed out): every response to it "
                     "grades 0", shown)
    return normal, numeral, tuple(parsed)


def _equivalent(gold: tuple[str, str | None, tuple], answer: str | None, timeout_s: int
                ) -> bool:
    """Whether an extracted answer matches a checked gold (`_gold`)."""
    if answer is None:
        return False
    gold_normal, gold_numeral, gold_parsed = gold
    answer = _clean(normalize_text(answer))
    if len(answer) > MAX_ANSWER_CHARS or len(gold_normal) > MAX_ANSWER_CHARS:
        # A long plain numeral: exact comparison, never SymPy on the long side.
        numeral = bounds.canonical_numeral(answer)
        if len(answer) > MAX_ANSWER_CHARS and numeral is None:
            return False
        if numeral is not None and gold_numeral is not None:
            return numeral == gold_numeral
        if numeral is None:  # the gold is the long numeral, the answer a short expression
            return bounds.numeral_matches(gold_numeral, _parse(answer, timeout_s),
                                          lambda fn: _timed(fn, timeout_s))
        return bounds.numeral_matches(numeral, gold_parsed, lambda fn: _timed(fn, timeout_s))
    pred = _parse(answer, timeout_s)
    if not gold_parsed or not pred:
        return False
    with bounds.deadline(timeout_s):
        return bool(verify(list(gold_parsed), pred, timeout_seconds=None))


def is_equivalent(gold: str, answer: str | None, *, timeout_s: int = 5) -> bool:
    """Whether the answer string is mathematically equivalent to the gold one (math-verify).

    Both sides are normalised first (rules N1-N4, A4: `−3` is `-3`, `5.` is `5`).
    `timeout_s` bounds parsing and comparison each (`bounds.deadline`: a signal, so on the
    main thread only; the size bounds hold everywhere). The gold is checked first
    (`check_gold`: TypeError / ValueError).
    """
    _require_text(gold, "gold")
    checked = _gold(gold, int(timeout_s))
    if answer is not None:
        _require_text(answer, "answer")
    try:
        return _equivalent(checked, answer, int(timeout_s))
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return False


def grade(response: str, gold: str, *, truncated: bool = False, timeout_s: int = 5) -> float:
    """Binary reward of a response: 1.0 iff not truncated and its answer is equivalent to gold.

    The answer is `extract_answer(response)` (the last complete `\\boxed{}`, else the
    rightmost number or math expression outside any box). Never raises for a `str`
    `response`, whatever it holds; a non-`str` one (bytes, None) raises TypeError, and so
    does a non-`str` gold; a gold no response can match raises ValueError (`check_gold`).
    """
    _require_text(response)
    _require_text(gold, "gold")
    checked = _gold(gold, int(timeout_s))
    if truncated:
        return 0.0
    try:
        return float(_equivalent(checked, extract_answer(response), int(timeout_s)))
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return 0.0


def grade_batch(
    responses: Sequence[str],
    golds: Sequence[str],
    truncated: Sequence[bool] | np.ndarray | None = None,
    *,
    timeout_s: int = 5,
) -> np.ndarray:
    """`grade` over a batch: float32 `[len(responses)]` in {0, 1}. Every gold is checked
    first (`check_gold`); an error names its index."""
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
    for i, gold in enumerate(golds):
        try:
            check_gold(gold, timeout_s=timeout_s)
        except (TypeError, ValueError) as e:
            raise type(e)(f"golds[{i}]: {e}") from None
    return np.asarray(
        [
            grade(r, g, truncated=bool(t), timeout_s=timeout_s)
            for r, g, t in zip(responses, golds, truncated)
        ],
        dtype=np.float32,
    )


def _key(expr, answer: str) -> str:
    """The majority-vote key of a parsed (bounded) answer; see `answer_key`."""
    import sympy  # math-verify depends on it; imported here to keep module import light

    if expr.is_number and not isinstance(expr, sympy.Number):
        expr = expr.doit()  # P1 gives an unevaluated 1.5*10**3: key it as 1500
    if isinstance(expr, sympy.Number):
        expr = sympy.nsimplify(expr, rational=True, tolerance=1e-9)
    if isinstance(expr, sympy.Rational):  # str() refuses more than 4,300 digits
        return bounds.int_to_str(expr.p) + ("" if expr.q == 1 else
                                            "/" + bounds.int_to_str(expr.q))
    try:
        return str(expr)
    except ValueError:  # a symbolic expression holding a huge integer
        return answer.strip()


def answer_key(response: str, *, truncated: bool = False, timeout_s: int = 5) -> str | None:
    """A canonical key of a response's answer for majority voting (None = abstain).

    Equivalent numbers get the same key (`0.5`, `\\frac{1}{2}`, `1/2` -> `'1/2'`; `1,000` and
    `1000` -> `'1000'`): a rational value is written as SymPy's exact `p/q`, a float is
    rationalised at 1e-9 first. Non-numeric answers use SymPy's string form; unparsable
    ones, those beyond the size bounds (`9^{9^{9^{9}}}`) or whose keying timed out, the
    stripped text; a plain numeral longer than `MAX_ANSWER_CHARS`, its canonical decimal
    (the same key as a short expression of that value). Truncated or answerless responses
    abstain; a non-`str` response raises TypeError.
    """
    _require_text(response)
    if truncated:
        return None
    try:
        answer = extract_answer(response)
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return None
    if not answer:
        return None
    numeral = bounds.canonical_numeral(answer) if len(answer) > MAX_ANSWER_CHARS else None
    if numeral is not None:
        if len(numeral) > MAX_ANSWER_CHARS:
            return numeral
        answer = numeral  # "0.5000...0": short once canonical, keyed like "0.5"
    try:
        parsed = _parse(answer, timeout_s)
        if not parsed:
            return answer.strip()
        if isinstance(parsed[0], str):
            return parsed[0].strip()
        return _timed(lambda: _key(parsed[0], answer), timeout_s)
    except (Exception, TimeoutException):  # noqa: BLE001 -- total by contract
        return answer.strip()
