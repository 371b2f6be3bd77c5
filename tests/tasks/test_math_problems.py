"""The embedded arithmetic generator and the GSM8K / MATH file loaders."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sera_jax.tasks.mathqa import data, grader, problems

# ---------------------------------------------------------------------------- generator

# The operand order in which each template's numbers appear in its question text, and the
# answer computed from those numbers -- written independently of the generator's solvers.
_RECOMPUTE = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda total, b: total / b,
    "bags": lambda a, b, c: a * b - c,
    "wage": lambda a, b, c: a * (b + c),
    "more_than": lambda a, b: a + (a + b),
    "change": lambda a, b, c, d, e: e - a * b - c * d,
    "farm": lambda a, b, c: a + b * a - c,
    "pages": lambda d, a, b, c: d - a * b - c,
    "bare_add": lambda a, b: a + b,
    "bare_sub": lambda a, b: a - b,
    "bare_mul": lambda a, b: a * b,
    "small_add": lambda a, b: a + b,
    "small_sub": lambda a, b: a - b,
    "small_mul": lambda a, b: a * b,
}


@pytest.fixture(scope="module")
def generated():
    return problems.generate_arithmetic(600, 200, seed=3)


def test_generator_is_deterministic(generated):
    again = problems.generate_arithmetic(600, 200, seed=3)
    assert [p.question for p in again["train"]] == [p.question for p in generated["train"]]
    assert [p.answer for p in again["test"]] == [p.answer for p in generated["test"]]
    other = problems.generate_arithmetic(600, 200, seed=4)
    assert [p.question for p in other["train"]] != [p.question for p in generated["train"]]


def test_sizes_levels_and_templates(generated):
    assert len(generated["train"]) == 600 and len(generated["test"]) == 200
    assert {p.level for p in generated["train"]} == {1, 2, 3}
    # Without `templates`: the word problems only (bare arithmetic is drawn when named).
    assert {p.meta["template"] for p in generated["train"]} == set(
        problems.WORD_TEMPLATE_NAMES)
    assert len(problems.WORD_TEMPLATE_NAMES) >= 6
    assert set(problems.TEMPLATE_NAMES) == (set(problems.WORD_TEMPLATE_NAMES)
                                            | set(problems.BARE_TEMPLATE_NAMES))
    only_one_step = problems.generate_arithmetic(20, 5, seed=0, steps=(1,))
    assert {p.level for p in only_one_step["train"] + only_one_step["test"]} == {1}
    sums = problems.generate_arithmetic(20, 5, seed=0, templates=("add", "mul"))
    assert {p.meta["template"] for p in sums["train"] + sums["test"]} == {"add", "mul"}


def test_splits_are_disjoint_in_arithmetic_content(generated):
    def keys(ps):
        return {problems.content_key(p.meta["template"], p.meta["operands"]) for p in ps}

    train, test = keys(generated["train"]), keys(generated["test"])
    assert len(train) == 600 and len(test) == 200  # no duplicates within a split
    assert not train & test
    assert not {p.question for p in generated["train"]} & {p.question for p in generated["test"]}
    # The split is a property of the content: another seed never moves a test item to train.
    other = problems.generate_arithmetic(600, 200, seed=11)
    assert not keys(other["train"]) & test


def test_answers_recomputed_from_the_question_text(generated):
    for p in generated["train"] + generated["test"]:
        numbers = [int(x) for x in re.findall(r"\d+", p.question)]
        expected = _RECOMPUTE[p.meta["template"]](*numbers)
        assert float(p.answer) == expected, p
        assert expected >= 0 and float(expected).is_integer(), p


_WIDE = ("bare_add", "bare_sub", "bare_mul")
_SMALL = ("small_add", "small_sub", "small_mul")


@pytest.fixture(scope="module", params=[_WIDE, _SMALL], ids=["bare", "small"])
def bare(request):
    return problems.generate_arithmetic(128, 128, seed=0, steps=(1,), templates=request.param)


def _keys(ps):
    return {problems.content_key(p.meta["template"], p.meta["operands"]) for p in ps}


def test_bare_arithmetic_templates(bare):
    assert problems.BARE_TEMPLATE_NAMES[:6] == _WIDE + _SMALL  # then the two-step ones
    names = {p.meta["template"] for p in bare["train"]}
    assert names in ({*_WIDE}, {*_SMALL})
    again = problems.generate_arithmetic(128, 128, seed=0, steps=(1,), templates=sorted(names))
    assert [p.question for p in again["train"] + again["test"]] == [
        p.question for p in bare["train"] + bare["test"]]  # deterministic
    assert len(bare["train"]) == len(bare["test"]) == 128
    assert {p.level for p in bare["train"] + bare["test"]} == {1}
    train, test = _keys(bare["train"]), _keys(bare["test"])
    assert len(train) == len(test) == 128 and not train & test
    assert not {p.question for p in bare["train"]} & {p.question for p in bare["test"]}
    symbol = {"add": "+", "sub": "-", "mul": "x"}
    for p in bare["train"] + bare["test"]:
        a, b = (int(x) for x in re.findall(r"\d+", p.question))
        assert p.question == f"What is {a} {symbol[p.meta['template'][-3:]]} {b}?", p
        assert int(p.answer) == _RECOMPUTE[p.meta["template"]](a, b) >= 1, p
        assert a >= b >= 1, p  # larger first: no content is another with its operands swapped
    # The split follows the content, whatever the seed.
    other = problems.generate_arithmetic(128, 128, seed=5, templates=sorted(names))
    assert not _keys(other["train"]) & test and not _keys(other["test"]) & train


def test_wide_bare_templates_each_supply_128_held_out():
    for name in _WIDE:
        one = problems.generate_arithmetic(128, 128, seed=1, templates=(name,))
        assert not _keys(one["train"]) & _keys(one["test"])
        ops = [p.meta["operands"] for p in one["train"] + one["test"]]
        assert min(o["a"] for o in ops) >= 5 and min(o["b"] for o in ops) >= 2  # not trivial
    with pytest.raises(ValueError, match="distinct"):  # the small ones only together
        problems.generate_arithmetic(128, 128, templates=("small_mul",))


def test_bare_answers_grade(bare):
    p = next(q for q in bare["test"] if q.meta["template"].endswith("_mul"))
    a, b = p.meta["operands"]["a"], p.meta["operands"]["b"]
    right, wrong = p.answer, str(int(p.answer) + 1)
    for text in (right, right + "\n", f"{right}.", f"{a} x {b} = {right}\n",
                 f"{a} \\times {b} = {right}", f"The answer is {right}."):
        assert grader.grade(text, p.answer) == 1.0, text
    for text in (wrong, f"{a} x {b} = {wrong}", f"{right} x 2 = {2 * int(right)}", ""):
        assert grader.grade(text, p.answer) == 0.0, text
    assert grader.grade(right + "\n", p.answer, truncated=True) == 0.0


def test_generator_bad_arguments():
    with pytest.raises(ValueError, match="num_train"):
        problems.generate_arithmetic(-1, 2)
    with pytest.raises(ValueError, match="test_fraction"):
        problems.generate_arithmetic(1, 1, test_fraction=1.0)
    with pytest.raises(ValueError, match="steps"):
        problems.generate_arithmetic(1, 1, steps=(4,))
    with pytest.raises(ValueError, match="templates"):
        problems.generate_arithmetic(1, 1, templates=("add", "integrals"))
    with pytest.raises(ValueError, match="select no template"):
        problems.generate_arithmetic(1, 1, steps=(3,), templates=("add",))
    with pytest.raises(ValueError, match="distinct"):
        problems.generate_arithmetic(100_000, 0, steps=(1,))  # only a few hundred exist


# ------------------------------------------------------------------------------ loaders

_GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
    {"question": "What is 1000 + 234?", "answer": "#### 1,234"},
]
_MATH_ROWS = [
    {"problem": "Compute $1/2 + 1/4$.", "solution": "It is $\\boxed{\\frac{3}{4}}$.",
     "level": "Level 3", "type": "Algebra"},
    {"problem": "What is $2^{10}$?", "solution": "$\\boxed{1024}$", "level": "Level 1"},
    {"problem": "Solve $x+1=3$.", "answer": "2", "level": "Level 5"},
]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_gsm8k_jsonl(tmp_path):
    _write_jsonl(tmp_path / "train.jsonl", _GSM8K_ROWS)
    loaded = data.load_problems(str(tmp_path / "train.jsonl"))
    assert [p.answer for p in loaded] == ["7", "1234"]
    assert loaded[0].question == _GSM8K_ROWS[0]["question"]


def test_math_parquet_with_level_filter(tmp_path):
    columns = sorted({k for row in _MATH_ROWS for k in row})  # absent fields become nulls
    rows = [{k: row.get(k) for k in columns} for row in _MATH_ROWS]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "math.parquet")
    loaded = data.load_problems(str(tmp_path / "math.parquet"))
    assert [(p.answer, p.level) for p in loaded] == [("\\frac{3}{4}", 3), ("1024", 1), ("2", 5)]
    hard = data.load_problems(str(tmp_path / "math.parquet"), levels=[3, 4, 5])
    assert [p.answer for p in hard] == ["\\frac{3}{4}", "2"]


def test_directory_order_gives_stable_ids(tmp_path):
    _write_jsonl(tmp_path / "b.jsonl", _GSM8K_ROWS[1:])
    _write_jsonl(tmp_path / "a.jsonl", _GSM8K_ROWS[:1])
    (tmp_path / "notes.txt").write_text("ignored")
    first = data.load_problems(str(tmp_path))
    assert [p.answer for p in first] == ["7", "1234"]  # a.jsonl before b.jsonl
    assert data.load_problems(str(tmp_path)) == first
    assert [p.answer for p in data.load_problems(str(tmp_path), limit=1)] == ["7"]


@pytest.mark.parametrize(
    ("rows", "fmt", "match"),
    [
        ([{"prompt": "x", "target": "1"}], "auto", "expected GSM8K fields"),
        ([{"question": "x", "answer": "no marker"}], "auto", "####"),
        ([{"question": "x"}], "gsm8k", "missing \\['answer'\\]"),
        ([{"question": "x", "answer": "1"}], "math", "MATH rows need fields"),
        ([{"problem": "x", "solution": "no box"}], "auto", "boxed"),
    ],
)
def test_bad_rows_name_the_expected_fields(tmp_path, rows, fmt, match):
    _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=match):
        data.load_problems(str(tmp_path / "bad.jsonl"), fmt=fmt)


def test_bad_paths_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        data.load_problems(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="without any"):
        data.load_problems(str(tmp_path))
    (tmp_path / "x.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="x.jsonl:1: not valid JSON"):
        data.load_problems(str(tmp_path / "x.jsonl"))
    _write_jsonl(tmp_path / "x.jsonl", _GSM8K_ROWS)
    with pytest.raises(ValueError, match="fmt="):
        data.load_problems(str(tmp_path / "x.jsonl"), fmt="csv")
    with pytest.raises(ValueError, match="no problems"):
        data.load_problems(str(tmp_path / "x.jsonl"), levels=[3])


def test_prompt_templates():
    q = "What is {2+2}?"  # braces in a question must survive formatting
    assert data.format_prompt(q, "smollm") == (
        q + " Let's think step by step and output the final answer within \\boxed{}."
    )
    assert data.format_prompt(q, "qwen") == (
        q + "\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert data.format_prompt(q, "number") == q + " Answer with the number only."
    assert data.format_prompt(q, "none") == q
    with pytest.raises(ValueError, match="template"):
        data.format_prompt(q, "llama")
