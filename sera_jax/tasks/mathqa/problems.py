"""An embedded grade-school arithmetic word-problem set (no download needed).

Ten word-problem templates of one to three arithmetic steps (add, subtract, multiply,
divide exactly, and their compositions) filled with random small numbers, names and objects,
and six bare-arithmetic templates (`bare_add` "What is 48 + 23?", `bare_sub`, `bare_mul`,
and the same with small numbers, `small_add`, `small_sub`, `small_mul`; one step, no story:
a 135M model can answer them in a few tokens). Gold answers are computed
from the sampled operands, never typed; every answer is a non-negative integer.

The bare templates are drawn only when named in `templates` (`WORD_TEMPLATE_NAMES` is the
default set), so the problem lists of existing configs do not change. The `bare_*` operand
ranges are wider than the word templates' (sums of numbers 5-49, differences of numbers up
to 59, two-digit x one-digit products) so that each of them alone supplies well over 128
train + 128 held-out contents; the `small_*` ones (numbers up to 25, times tables to 12 x 9)
supply 128 + 128 only together. The larger operand always comes first, so no content is
another one with its operands swapped.

Determinism and splits: problems are drawn from `numpy.random.default_rng(seed)`. The split
of a problem is decided by a hash of its *arithmetic content* (template + operands, not the
names or objects), `test` when the hash falls below `test_fraction`. So train and test never
share a computation (not even with different names), whatever the seed or the sizes asked.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sera_jax.tasks.mathqa.data import MathProblem

_NAMES = (
    ("Ava", "She"), ("Ben", "He"), ("Chloe", "She"), ("Daniel", "He"), ("Emma", "She"),
    ("Finn", "He"), ("Grace", "She"), ("Henry", "He"), ("Isla", "She"), ("Jack", "He"),
    ("Lily", "She"), ("Mason", "He"), ("Nora", "She"), ("Oscar", "He"), ("Ruby", "She"),
    ("Sam", "He"), ("Tara", "She"), ("Leo", "He"), ("Mia", "She"), ("Noah", "He"),
)
_ITEMS = (
    "apples", "marbles", "stickers", "pencils", "cookies", "cards", "shells", "books",
    "candies", "stamps", "balloons", "oranges",
)


@dataclasses.dataclass(frozen=True)
class _Template:
    name: str
    steps: int
    #: `str.format` text over the operands and `name`, `friend`, `pron`, `item`.
    text: str
    #: Draws the operands (ints) from the generator; derived operands are computed here.
    sample: Callable[[np.random.Generator], dict[str, int]]
    #: The gold answer from the operands.
    solve: Callable[[Mapping[str, int]], int]
    #: "word" (a story; the default set) or "bare" (an arithmetic expression; drawn only
    #: when named).
    family: str = "word"


def _ints(rng: np.random.Generator, **ranges: tuple[int, int]) -> dict[str, int]:
    """One integer per name, uniform on the inclusive range."""
    return {k: int(rng.integers(lo, hi + 1)) for k, (lo, hi) in ranges.items()}


def _sample_sub(rng: np.random.Generator) -> dict[str, int]:
    a = int(rng.integers(10, 41))
    return {"a": a, "b": int(rng.integers(1, a))}


def _sample_div(rng: np.random.Generator) -> dict[str, int]:
    q, b = int(rng.integers(2, 13)), int(rng.integers(2, 10))
    return {"total": q * b, "b": b}


def _sample_bags(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(2, 6), b=(3, 10))
    ops["c"] = int(rng.integers(2, ops["a"] * ops["b"]))
    return ops


def _sample_change(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(2, 5), b=(2, 6), c=(2, 5), d=(1, 3))
    total = ops["a"] * ops["b"] + ops["c"] * ops["d"]
    ops["e"] = next(bill for bill in (20, 50, 100) if bill > total)
    return ops


def _sample_farm(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(2, 10), b=(2, 5))
    ops["c"] = int(rng.integers(2, ops["a"] * ops["b"]))
    return ops


def _sample_pages(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(5, 20), b=(2, 6), c=(1, 20))
    ops["d"] = ops["a"] * ops["b"] + ops["c"] + int(rng.integers(1, 51))
    return ops


def _sample_ordered_add(lo: int, hi: int, rng: np.random.Generator) -> dict[str, int]:
    """a + b with a, b in [lo, hi), larger first (17 + 3, never 3 + 17 as well)."""
    x, y = (int(v) for v in rng.integers(lo, hi, size=2))
    return {"a": max(x, y), "b": min(x, y)}


def _sample_positive_sub(a_lo: int, a_hi: int, b_lo: int, rng: np.random.Generator
                         ) -> dict[str, int]:
    """a − b with a in [a_lo, a_hi) and b in [b_lo, a): a positive difference."""
    a = int(rng.integers(a_lo, a_hi))
    return {"a": a, "b": int(rng.integers(b_lo, a))}


_sample_bare_add = functools.partial(_sample_ordered_add, 5, 50)
_sample_bare_sub = functools.partial(_sample_positive_sub, 10, 60, 2)
_sample_small_add = functools.partial(_sample_ordered_add, 2, 26)
_sample_small_sub = functools.partial(_sample_positive_sub, 3, 26, 1)


def _sample_small_mul(rng: np.random.Generator) -> dict[str, int]:
    # Times tables: a in 2-12, b in 2-9, larger first (7 x 3, never 3 x 7 as well).
    a, b = int(rng.integers(2, 13)), int(rng.integers(2, 10))
    return {"a": max(a, b), "b": min(a, b)}


def _sample_chain_addsub(rng: np.random.Generator) -> dict[str, int]:
    # a + b - c with a, b two-digit and 2 <= c < a + b: a positive answer below 98.
    ops = _ints(rng, a=(10, 48), b=(10, 48))
    ops["c"] = int(rng.integers(2, ops["a"] + ops["b"]))
    return ops


def _sample_chain_subadd(rng: np.random.Generator) -> dict[str, int]:
    # a - b + c with 2 <= b < a: the first step stays positive.
    ops = _sample_positive_sub(20, 60, 2, rng)
    ops["c"] = int(rng.integers(2, 40))
    return ops


def _sample_mul_add(rng: np.random.Generator) -> dict[str, int]:
    return _ints(rng, a=(3, 12), b=(3, 9), c=(2, 40))


def _sample_mul_sub(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(3, 12), b=(3, 9))
    ops["c"] = int(rng.integers(2, ops["a"] * ops["b"]))
    return ops


def _sample_small_chain_addsub(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(3, 25), b=(3, 25))
    ops["c"] = int(rng.integers(2, min(ops["a"] + ops["b"], 26)))
    return ops


def _sample_small_chain_subadd(rng: np.random.Generator) -> dict[str, int]:
    ops = _sample_positive_sub(8, 30, 2, rng)
    ops["c"] = int(rng.integers(2, 21))
    return ops


def _sample_small_mul_sub(rng: np.random.Generator) -> dict[str, int]:
    ops = _ints(rng, a=(2, 9), b=(2, 9))
    ops["c"] = int(rng.integers(1, min(ops["a"] * ops["b"], 21)))
    return ops


TEMPLATES: tuple[_Template, ...] = (
    _Template(
        "add", 1,
        "{name} has {a} {item}. {pron} buys {b} more {item}. "
        "How many {item} does {name} have now?",
        lambda r: _ints(r, a=(2, 20), b=(2, 20)),
        lambda o: o["a"] + o["b"],
    ),
    _Template(
        "sub", 1,
        "{name} had {a} {item} and gave {b} of them to {friend}. "
        "How many {item} does {name} have left?",
        _sample_sub,
        lambda o: o["a"] - o["b"],
    ),
    _Template(
        "mul", 1,
        "A box holds {a} {item}. How many {item} are there in {b} boxes?",
        lambda r: _ints(r, a=(2, 12), b=(2, 9)),
        lambda o: o["a"] * o["b"],
    ),
    _Template(
        "div", 1,
        "{name} shares {total} {item} equally among {b} friends. "
        "How many {item} does each friend get?",
        _sample_div,
        lambda o: o["total"] // o["b"],
    ),
    _Template(
        "bags", 2,
        "{name} buys {a} bags of {item} with {b} {item} in each bag. {pron} gives away {c} "
        "{item}. How many {item} does {name} have left?",
        _sample_bags,
        lambda o: o["a"] * o["b"] - o["c"],
    ),
    _Template(
        "wage", 2,
        "{name} earns {a} dollars per hour. {pron} works {b} hours on Monday and {c} hours on "
        "Tuesday. How many dollars does {name} earn in total?",
        lambda r: _ints(r, a=(5, 15), b=(1, 8), c=(1, 8)),
        lambda o: o["a"] * (o["b"] + o["c"]),
    ),
    _Template(
        "more_than", 2,
        "{name} has {a} {item}. {friend} has {b} more {item} than {name}. "
        "How many {item} do they have together?",
        lambda r: _ints(r, a=(3, 30), b=(1, 20)),
        lambda o: 2 * o["a"] + o["b"],
    ),
    _Template(
        "change", 3,
        "{name} buys {a} notebooks at {b} dollars each and {c} pens at {d} dollars each. "
        "{pron} pays with a {e} dollar bill. How many dollars of change does {name} get?",
        _sample_change,
        lambda o: o["e"] - (o["a"] * o["b"] + o["c"] * o["d"]),
    ),
    _Template(
        "farm", 3,
        "A farm has {a} cows and {b} times as many chickens as cows. The farmer sells {c} "
        "chickens. How many cows and chickens are on the farm now?",
        _sample_farm,
        lambda o: o["a"] + o["a"] * o["b"] - o["c"],
    ),
    _Template(
        "pages", 3,
        "A book has {d} pages. {name} reads {a} pages a day for {b} days and then {c} pages "
        "on the next day. How many pages are left to read?",
        _sample_pages,
        lambda o: o["d"] - (o["a"] * o["b"] + o["c"]),
    ),
    # Bare arithmetic (1035, 1625 and 712 distinct contents: 271, 409 and 174 held-out at
    # the default test fraction 0.25). The larger number comes first, so no two contents are
    # one sum or product with the operands swapped.
    _Template(
        "bare_add", 1, "What is {a} + {b}?",
        _sample_bare_add,
        lambda o: o["a"] + o["b"], family="bare",
    ),
    _Template(
        "bare_sub", 1, "What is {a} - {b}?",
        _sample_bare_sub,
        lambda o: o["a"] - o["b"], family="bare",
    ),
    _Template(
        "bare_mul", 1, "What is {a} x {b}?",
        lambda r: _ints(r, a=(11, 99), b=(2, 9)),
        lambda o: o["a"] * o["b"], family="bare",
    ),
    # Small bare arithmetic (300, 299 and 60 contents: the three together supply 128 + 128,
    # not each alone): sums and differences of numbers up to 25, times tables to 12 x 9.
    _Template(
        "small_add", 1, "What is {a} + {b}?",
        _sample_small_add,
        lambda o: o["a"] + o["b"], family="bare",
    ),
    _Template(
        "small_sub", 1, "What is {a} - {b}?",
        _sample_small_sub,
        lambda o: o["a"] - o["b"], family="bare",
    ),
    _Template(
        "small_mul", 1, "What is {a} x {b}?",
        _sample_small_mul,
        lambda o: o["a"] * o["b"], family="bare",
    ),
    # Two-step bare arithmetic (issue 49: problems a 135M model must work through): a sum
    # then a difference, a difference then a sum, a times-table product then a sum or a
    # difference. Written left to right; the order of operations is the usual one.
    _Template(
        "chain_addsub", 2, "What is {a} + {b} - {c}?",
        _sample_chain_addsub,
        lambda o: o["a"] + o["b"] - o["c"], family="bare",
    ),
    _Template(
        "chain_subadd", 2, "What is {a} - {b} + {c}?",
        _sample_chain_subadd,
        lambda o: o["a"] - o["b"] + o["c"], family="bare",
    ),
    _Template(
        "mul_add", 2, "What is {a} x {b} + {c}?",
        _sample_mul_add,
        lambda o: o["a"] * o["b"] + o["c"], family="bare",
    ),
    _Template(
        "mul_sub", 2, "What is {a} x {b} - {c}?",
        _sample_mul_sub,
        lambda o: o["a"] * o["b"] - o["c"], family="bare",
    ),
    # The same four with small numbers (operands up to 25, times tables to 9 x 9, the
    # second step's number up to 20 or 25): what SmolLM2-135M gets right ~10-40 % of the time.
    _Template(
        "small_chain_addsub", 2, "What is {a} + {b} - {c}?",
        _sample_small_chain_addsub,
        lambda o: o["a"] + o["b"] - o["c"], family="bare",
    ),
    _Template(
        "small_chain_subadd", 2, "What is {a} - {b} + {c}?",
        _sample_small_chain_subadd,
        lambda o: o["a"] - o["b"] + o["c"], family="bare",
    ),
    _Template(
        "small_mul_add", 2, "What is {a} x {b} + {c}?",
        lambda r: _ints(r, a=(2, 9), b=(2, 9), c=(2, 20)),
        lambda o: o["a"] * o["b"] + o["c"], family="bare",
    ),
    _Template(
        "small_mul_sub", 2, "What is {a} x {b} - {c}?",
        _sample_small_mul_sub,
        lambda o: o["a"] * o["b"] - o["c"], family="bare",
    ),
)
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES)
#: The templates drawn when `templates` is not given (the word problems).
WORD_TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES if t.family == "word")
#: Bare arithmetic, drawn only when named.
BARE_TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES if t.family == "bare")


#: Few-shot prompts (issue 49's format-ready start): name -> worked examples, each
#: (template, operands, the worked one-line answer). The start sees them as earlier chat
#: turns, so it answers in their format before any RL; their contents are never drawn into a
#: split (`fewshot_keys`). The numbers are hand-picked; `fewshot_turns` checks every worked
#: line's last number against the template's gold answer.
FEWSHOT: dict[str, tuple[tuple[str, dict[str, int], str], ...]] = {
    "steps": (
        ("chain_addsub", dict(a=14, b=23, c=9), "14 + 23 = 37, and 37 - 9 = 28. The answer is 28."),
        ("mul_add", dict(a=7, b=6, c=15), "7 x 6 = 42, and 42 + 15 = 57. The answer is 57."),
        ("chain_subadd", dict(a=52, b=18, c=11),
         "52 - 18 = 34, and 34 + 11 = 45. The answer is 45."),
        ("mul_sub", dict(a=9, b=4, c=13), "9 x 4 = 36, and 36 - 13 = 23. The answer is 23."),
    ),
    # The same steps in half the tokens (a 135M model on a CPU pays per generated token).
    "steps_short": (
        ("chain_addsub", dict(a=14, b=23, c=9), "14 + 23 = 37, 37 - 9 = 28"),
        ("mul_add", dict(a=7, b=6, c=15), "7 x 6 = 42, 42 + 15 = 57"),
        ("chain_subadd", dict(a=52, b=18, c=11), "52 - 18 = 34, 34 + 11 = 45"),
        ("mul_sub", dict(a=9, b=4, c=13), "9 x 4 = 36, 36 - 13 = 23"),
    ),
}


def _template(name: str) -> _Template:
    return next(t for t in TEMPLATES if t.name == name)


def fewshot_keys(name: str) -> tuple[str, ...]:
    """The content keys of few-shot set `name` ('' = none): excluded from every split."""
    return tuple(content_key(t, ops) for t, ops, _ in FEWSHOT[name]) if name else ()


def fewshot_turns(name: str) -> tuple[tuple[str, str], ...]:
    """(question, worked answer) pairs of few-shot set `name` ('' = none). Raises
    ValueError on an unknown name or a worked answer whose last number is not the gold."""
    if not name:
        return ()
    if name not in FEWSHOT:
        raise ValueError(f"fewshot={name!r} is not one of {sorted(FEWSHOT)} (or '' for none)")
    turns = []
    for template, ops, worked in FEWSHOT[name]:
        t = _template(template)
        last = worked.replace(".", " ").split()[-1]
        if last != str(t.solve(ops)):
            raise ValueError(f"few-shot {name!r}: {worked!r} ends with {last}, gold "
                             f"{t.solve(ops)}")
        turns.append((t.text.format(**ops), worked))
    return tuple(turns)


def content_key(template: str, operands: Mapping[str, int]) -> str:
    """The arithmetic identity of a problem (names and objects excluded)."""
    return template + ":" + ",".join(f"{k}={operands[k]}" for k in sorted(operands))


def in_test_split(key: str, test_fraction: float) -> bool:
    """Whether the problem with this content key belongs to the test split (hash rule)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < test_fraction


def generate_arithmetic(
    num_train: int,
    num_test: int,
    *,
    seed: int = 0,
    steps: Sequence[int] = (1, 2, 3),
    templates: Sequence[str] | None = None,
    test_fraction: float = 0.25,
    num_sealed: int = 0,
    sealed_fraction: float = 0.0,
    exclude: Sequence[str] = (),
) -> dict[str, list[MathProblem]]:
    """`{'train': [...], 'test': [...]}` of distinct generated word problems (and
    `'sealed'` when `sealed_fraction > 0`).

    Templates are drawn uniformly among those with a step count in `steps` and a name in
    `templates` (a subset of `TEMPLATE_NAMES`; None = the word templates
    `WORD_TEMPLATE_NAMES`, so bare arithmetic only when named); each problem's
    `level` is its step count and `meta` holds the template name and operands. The same
    arguments always give the same lists. Raises ValueError on bad sizes, steps or fraction,
    or when the templates cannot supply that many distinct problems.

    A content's split is its hash band (`in_test_split`): below `test_fraction` it is test,
    below `test_fraction + sealed_fraction` sealed (a third split, disjoint in content from
    the other two by construction), else train; with `sealed_fraction = 0` the lists are
    those of the two-split rule. Contents in `exclude` (`content_key`s: a few-shot prompt's
    worked examples) are never drawn.
    """
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train={num_train}, num_test={num_test} must be >= 0")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction} must lie in (0, 1)")
    if not 0.0 <= sealed_fraction < 1.0 - test_fraction:
        raise ValueError(f"sealed_fraction={sealed_fraction} must lie in [0, 1 - test_fraction"
                         f" = {1.0 - test_fraction:g})")
    if num_sealed < 0 or (num_sealed and not sealed_fraction):
        raise ValueError(f"num_sealed={num_sealed} must be >= 0, and 0 unless "
                         f"sealed_fraction > 0 (got {sealed_fraction})")
    if templates is not None and not set(templates) <= set(TEMPLATE_NAMES):
        raise ValueError(f"templates={tuple(templates)} has unknown names; allowed: "
                         f"{TEMPLATE_NAMES}")
    names = WORD_TEMPLATE_NAMES if templates is None else tuple(templates)
    chosen = [t for t in TEMPLATES if t.steps in set(steps) and t.name in names]
    if not chosen:
        raise ValueError(f"steps={tuple(steps)} and templates={templates} select no template; "
                         "steps are in (1, 2, 3)")
    rng = np.random.default_rng(seed)
    out: dict[str, list[MathProblem]] = {"train": [], "test": []}
    want = {"train": num_train, "test": num_test}
    if sealed_fraction:
        out["sealed"], want["sealed"] = [], num_sealed
    seen: set[str] = set(exclude)
    # Stop when this many draws in a row add nothing: the content space is used up.
    max_misses, misses = 10_000, 0
    while misses < max_misses and any(len(out[s]) < want[s] for s in out):
        template = chosen[int(rng.integers(len(chosen)))]
        operands = template.sample(rng)
        first, second = rng.choice(len(_NAMES), size=2, replace=False)
        (name, pron), friend = _NAMES[int(first)], _NAMES[int(second)][0]
        item = _ITEMS[int(rng.integers(len(_ITEMS)))]
        key = content_key(template.name, operands)
        split = ("test" if in_test_split(key, test_fraction) else
                 "sealed" if in_test_split(key, test_fraction + sealed_fraction) else "train")
        if key in seen or len(out[split]) >= want[split]:
            misses += 1
            continue
        misses = 0
        seen.add(key)
        question = template.text.format(name=name, friend=friend, item=item, pron=pron, **operands)
        out[split].append(
            MathProblem(
                question=question,
                answer=str(template.solve(operands)),
                level=template.steps,
                source=f"arithmetic/{split}",
                meta={"template": template.name, "operands": dict(operands)},
            )
        )
    if any(len(out[s]) < want[s] for s in out):
        raise ValueError(
            f"could not draw {num_train} train + {num_test} test + {num_sealed} sealed "
            "distinct problems with "
            f"steps={tuple(steps)}; ask for fewer"
        )
    return out
