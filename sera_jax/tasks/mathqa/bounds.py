"""Time and size bounds of what the math grader evaluates; exact comparison of long numerals.

Why: SymPy evaluates an answer's numbers exactly, and a few LaTeX characters describe numbers
no machine can write down (`9^{9^{9^{9}}}`, `{10^{6}}!`). Python computes such a number in
one C call that no timeout can interrupt, so the grader refuses it *before* SymPy touches it.
Three gates, all linear in the answer's size:

* `screen(text)`, before parsing: brackets nested deeper than `MAX_NESTING` (the parser's
  time grows with the depth); constructs the LaTeX parser computes while it parses: matrix
  operators (`\\operatorname{eye}`, `\\det`) always, `\\binom`, `\\Gamma`, `\\gcd`,
  `\\max` with an integer of 4+ digits, a power or a factorial inside.
* `within_bounds(expr)`, after parsing: an upper bound of every number the expression's
  evaluation can produce, from its tree alone (`a^b` has about |b| log10|a| digits, `n!`
  about n log10 n, ...), must stay within `MAX_VALUE_DIGITS` digits; a power of a symbolic
  base within `MAX_SYMBOLIC_EXPONENT` (SymPy's simplification expands it); at most
  `MAX_NODES` nodes.
* `canonical_numeral(text)`: a plain decimal numeral (`-12,345.600`) longer than the
  grader's parsing cap is compared as a string (`-12345.6`), never handed to SymPy, up to
  `MAX_NUMERAL_CHARS` characters.

What is refused grades 0 (a response) or is keyed as its string (majority voting); a gold
answer refused here raises ValueError in the grader (no response could ever match it).
Within the bounds, `deadline` limits the time of each parse, comparison and key.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

import sympy
from math_verify.errors import TimeoutException

#: Most decimal digits of any number an answer's evaluation may produce (10^9999, the largest
#: scientific-notation answer, has 10,000; Python multiplies 20,000-digit integers in < 1 ms).
MAX_VALUE_DIGITS = 20_000
#: Largest |exponent| of a power with a symbolic base: `simplify` expands `(x+1)^n` into n+1
#: terms (n = 1000 took 6 s on one core, n = 100 0.14 s).
MAX_SYMBOLIC_EXPONENT = 100
#: Most nodes of a parsed answer (a 400-character answer has a few hundred).
MAX_NODES = 5_000
#: Longest plain numeral compared exactly (as a string) beyond the parsing cap.
MAX_NUMERAL_CHARS = 1_000_000
#: Most terms of a `\\sum` / `\\prod` with numeric limits (SymPy adds them one by one).
MAX_TERMS = 10_000

# Python refuses int <-> decimal str conversions past this many digits (CVE-2020-10735).
_STR_DIGITS = 4_000
_LOG10_2 = math.log10(2.0)
_LOG10_E = math.log10(math.e)

# Constructs the LaTeX parser evaluates while parsing (latex2sympy2_extended 1.11).
_MATRIX_OPS = re.compile(
    r"\\det(?![A-Za-z])|\\operatorname\s*\{\s*(?!(?:arsinh|arcosh|artanh|arcsinh|arccosh"
    r"|arctanh|floor|ceil|gcd|lcm)\s*\})")
_EAGER = re.compile(r"\\(?:[dt]?binom|choose|Gamma|gamma|gcd|lcm|max|min|operatorname)"
                    r"(?![A-Za-z])")
_BIG_LITERAL = re.compile(r"\d{4}")
#: Deepest nesting of brackets `( [ {` the parser is given: its time grows with the depth
#: (parentheses 0.06 s a level, bare braces 0.1 s; math answers nest a few levels).
MAX_NESTING = 16


def _nesting(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def screen(text: str) -> bool:
    """False when parsing `text` could itself compute something unbounded (see the module
    docstring): brackets nested deeper than `MAX_NESTING`, a matrix operator, or an eager
    construct with a power, a factorial or an integer of 4+ digits inside."""
    if _nesting(text) > MAX_NESTING or _MATRIX_OPS.search(text):
        return False
    if _EAGER.search(text):
        return not (_BIG_LITERAL.search(text) or "^" in text or "!" in text)
    return True


class _TooBig(Exception):
    pass


def _int_log10(n: int) -> float:
    """log10 max(|n|, 1), exact enough (bit length beyond floats)."""
    n = abs(n)
    if n < 2:
        return 0.0
    return math.log10(n) if n.bit_length() < 1000 else n.bit_length() * _LOG10_2


class _Walk:
    """Upper bounds of log10 |value| over an expression tree (see `within_bounds`)."""

    def __init__(self) -> None:
        self.nodes = 0

    def check(self, size: float) -> float:
        if not size <= MAX_VALUE_DIGITS:  # also NaN
            raise _TooBig
        return size

    def number_value(self, e: sympy.Basic) -> float | None:
        """|e| for a plain rational number (tight), else None."""
        if isinstance(e, sympy.Rational):
            return abs(e.p) / e.q if _int_log10(e.p) < 300 else math.inf
        return None

    def size(self, e: object, symbol_size: float = 1.0) -> float:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise _TooBig
        if isinstance(e, sympy.Rational):  # Integer too: both numerator and denominator exist
            return self.check(max(_int_log10(e.p), _int_log10(e.q)))
        if isinstance(e, sympy.Float):
            _, man, exp, bc = e._mpf_
            return self.check(abs(exp + bc) * _LOG10_2 if man else 0.0)
        if isinstance(e, sympy.MatrixBase):
            return max((self.size(x, symbol_size) for x in e), default=0.0)
        if not isinstance(e, sympy.Basic):
            return 0.0  # strings and other leaves math-verify keeps
        if e.is_Atom:
            # Free symbols stand for numbers of `symbol_size` digits (a bound variable of a
            # sum for its largest value); constants (pi, E, I, oo) are small.
            return symbol_size if isinstance(e, sympy.Symbol) else 1.0
        if isinstance(e, sympy.Pow):
            return self.power(*e.args, symbol_size)
        if isinstance(e, (sympy.Sum, sympy.Product)):
            return self.series(e, symbol_size)
        if isinstance(e, sympy.Derivative):
            if any(count > 100 for _, count in e.variable_count):
                raise _TooBig
        args = [self.size(a, symbol_size) for a in e.args]
        if isinstance(e, sympy.Mul):
            return self.check(sum(args))
        if isinstance(e, sympy.Add):
            return self.check(max(args) + math.log10(len(args)))
        if isinstance(e, sympy.exp):
            return self.check(10.0 ** min(args[0], 400.0) * _LOG10_E)
        # Undefined functions (`a(0)`) are classes built at parse time with no module.
        if (getattr(e.func, "__module__", None) or "").startswith(
                "sympy.functions.combinatorial"):
            # factorial, binomial, subfactorial, fibonacci, ...: at most n! for the largest
            # argument n (binomial(n, k) <= 2^n, fib(n) < 2^n, n!! <= n!).
            return self.factorial(max(args, default=0.0))
        if isinstance(e, sympy.gamma):
            return self.factorial(args[0])
        return self.check(max(args, default=0.0))

    def factorial(self, arg_size: float) -> float:
        if arg_size > 7:
            raise _TooBig
        n = 10.0 ** arg_size
        return self.check(math.lgamma(n + 2) / math.log(10))

    def power(self, base: sympy.Basic, exponent: sympy.Basic, symbol_size: float) -> float:
        base_size = self.size(base, symbol_size)
        exp_size = self.size(exponent, symbol_size)
        value = self.number_value(exponent)
        magnitude = value if value is not None else 10.0 ** min(exp_size, 400.0)
        if getattr(base, "free_symbols", None) and magnitude > MAX_SYMBOLIC_EXPONENT:
            raise _TooBig
        # a^b has |b| log10|a| digits; |a| < 1 (a rational) has a denominator of that size.
        return self.check(magnitude * max(base_size, _LOG10_2))

    def series(self, e: sympy.Basic, symbol_size: float) -> float:
        body, *limits = e.args
        bound = symbol_size
        terms = 1.0
        for limit in limits:
            sizes = [self.size(x, symbol_size) for x in limit.args[1:]]
            if len(limit.args) < 3 or any(not x.is_number for x in limit.args[1:]):
                terms = math.inf
                break
            bound = max(bound, *sizes)
            terms *= 10.0 ** min(max(sizes), 400.0) * 2 + 1
        if terms > MAX_TERMS:
            raise _TooBig
        body_size = self.size(body, bound)
        if isinstance(e, sympy.Product):
            return self.check(terms * body_size)
        return self.check(body_size + math.log10(terms))


def within_bounds(expr: object) -> bool:
    """Whether evaluating `expr` (a parsed answer: SymPy expression, matrix or string) stays
    within `MAX_VALUE_DIGITS` digits, `MAX_SYMBOLIC_EXPONENT` and `MAX_NODES`; decided from
    the tree alone, in time linear in its size."""
    try:
        _Walk().size(expr)
    except (_TooBig, RecursionError, OverflowError):
        return False
    return True


# --------------------------------------------------------------------------- time

#: After the deadline the timeout is raised again every this many seconds, until it lands.
_REFIRE_S = 0.05


@contextlib.contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise math-verify's `TimeoutException` (a BaseException: SymPy's `except Exception`
    cannot swallow it) in the body after `seconds`; a no-op off the main thread (only it may
    take signals) or for None.

    Why not math-verify's own `signal.alarm`: it fires once, and a signal handler's exception
    raised while a GC callback runs (JAX registers one) is printed as "Exception ignored"
    and lost, so a parse went on for 48 s past a 1 s timeout. Here the timer re-fires every
    50 ms until the body stops, and those lost exceptions are not printed.
    """
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    live = [True]

    def fire(signum, frame):
        if live:
            raise TimeoutException(f"over the grader's {seconds} s deadline")

    def unraisable(info, previous=sys.unraisablehook):
        if not isinstance(info.exc_value, TimeoutException):
            previous(info)

    old_handler, old_hook = signal.signal(signal.SIGALRM, fire), sys.unraisablehook
    sys.unraisablehook = unraisable
    signal.setitimer(signal.ITIMER_REAL, float(seconds), _REFIRE_S)
    try:
        yield
    finally:
        while True:  # a re-fire may land in here: stop the timer until that has succeeded
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                live.clear()
                break
            except TimeoutException:
                continue
        signal.signal(signal.SIGALRM, old_handler)
        sys.unraisablehook = old_hook


# --------------------------------------------------------------------- long numerals

# After `grader.normalize_text` (".5" is "0.5"): sign, digits or thousands groups, decimals.
_NUMERAL = re.compile(r"([-+]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d*))?")


def canonical_numeral(text: str) -> str | None:
    """`text` as a canonical decimal (`-012,345.600` -> `-12345.6`, `-0` -> `0`) when it is
    a plain numeral of at most `MAX_NUMERAL_CHARS` characters, else None."""
    if len(text) > MAX_NUMERAL_CHARS:
        return None
    found = _NUMERAL.fullmatch(text)
    if found is None:
        return None
    whole = found.group(2).replace(",", "").lstrip("0") or "0"
    frac = (found.group(3) or "").rstrip("0")
    body = whole + ("." + frac if frac else "")
    return "-" + body if found.group(1) == "-" and body != "0" else body


def int_to_str(n: int) -> str:
    """`str(n)` for any size (Python refuses more than 4,300 digits): split in halves."""
    if n < 0:
        return "-" + int_to_str(-n)
    if n.bit_length() < _STR_DIGITS * 3:  # < ~3,600 digits
        return str(n)
    half = int(n.bit_length() * _LOG10_2) // 2
    high, low = divmod(n, 10**half)
    return int_to_str(high) + int_to_str(low).zfill(half)


def str_to_int(digits: str) -> int:
    """`int(digits)` for a digit string of any length (no sign)."""
    if len(digits) <= _STR_DIGITS:
        return int(digits)
    half = len(digits) // 2
    return str_to_int(digits[:half]) * 10 ** (len(digits) - half) + str_to_int(digits[half:])


def numeral_fraction(numeral: str) -> tuple[int, int]:
    """`(p, q)` with value p/q of a canonical numeral (q a power of ten)."""
    sign = -1 if numeral.startswith("-") else 1
    whole, _, frac = numeral.lstrip("-").partition(".")
    return sign * str_to_int(whole + frac), 10 ** len(frac)


def numeral_matches(numeral: str, parsed: Sequence, run: Callable = lambda fn: fn()
                    ) -> bool:
    """Whether a canonical numeral equals the exact value of a parsed answer (math-verify's
    [sympy, str] form, already `within_bounds`); `run(fn)` calls `fn` under a timeout."""
    if len(numeral) > MAX_VALUE_DIGITS + 2:  # a bounded value has fewer digits
        return False
    if not parsed or not isinstance(parsed[0], sympy.Basic) or not parsed[0].is_number:
        return False

    def evaluate() -> sympy.Rational | None:
        value = parsed[0] if isinstance(parsed[0], sympy.Number) else parsed[0].doit()
        if isinstance(value, sympy.Float):  # "0.5" parses to a float: its decimal value
            value = sympy.nsimplify(value, rational=True, tolerance=1e-9)
        return value if isinstance(value, sympy.Rational) else None

    value = run(evaluate)
    if value is None:
        return False
    p, q = numeral_fraction(numeral)
    return value.p * q == p * value.q


__all__ = ["MAX_NESTING", "MAX_NODES", "MAX_NUMERAL_CHARS", "MAX_SYMBOLIC_EXPONENT", "MAX_TERMS",
           "MAX_VALUE_DIGITS", "canonical_numeral", "deadline", "int_to_str", "numeral_fraction",
           "numeral_matches", "screen", "str_to_int", "within_bounds"]
