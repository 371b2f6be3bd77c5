"""Bad data files for the math loaders (`sera_jax.tasks.mathqa.data`): every row that can
never be graded, and every unreadable file, is refused with `file:line` (or `file[index]`)
and the fix -- never loaded as a problem that silently grades 0, never a raw traceback.
The table of inputs is in docs/robustness.md."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_jax.tasks.mathqa import data, grader
from sera_jax.tasks.mathqa.bounds import canonical_numeral


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


_GOOD_GSM8K = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"}
_GOOD_MATH = {"problem": "Compute 1/2 + 1/4.", "solution": "It is $\\boxed{\\frac{3}{4}}$."}
# Long and not a plain number (a long numeral is compared exactly, so it loads).
_LONG = "1+" * (grader.MAX_ANSWER_CHARS // 2) + "1"


@pytest.mark.parametrize(
    ("bad_row", "match"),
    [
        # GSM8K: an empty gold after the marker.
        ({"question": "q", "answer": "so 7\n#### "}, "nothing after its last '####'"),
        ({"question": "q", "answer": "####\t \n"}, "nothing after its last '####'"),
        ({"question": "q", "answer": "#### ,"}, "nothing after"),
        # A null / non-string / blank question (never the string "None").
        ({"question": None, "answer": "#### 7"}, "field 'question' must be a non-empty string"),
        ({"question": 12, "answer": "#### 7"}, "field 'question' must be a non-empty string"),
        ({"question": "   ", "answer": "#### 7"}, "field 'question' must be a non-empty string"),
        # A null / non-string answer field.
        ({"question": "q", "answer": None}, "not a string"),
        ({"question": "q", "answer": ["#### 7"]}, "not a string"),
        # A gold longer than the grader will ever parse.
        ({"question": "q", "answer": "#### " + _LONG}, "MAX_ANSWER_CHARS=400"),
        # A gold a boxed response can never match.
        ({"question": "q", "answer": "#### {5"}, "unbalanced braces"),
        # Level that is not a whole number.
        ({"question": "q", "answer": "#### 7", "level": True}, "not a whole number"),
        ({"question": "q", "answer": "#### 7", "level": 2.5}, "not a whole number"),
        ({"question": "q", "answer": "#### 7", "level": [3]}, "must be a number"),
    ],
)
def test_ungradable_gsm8k_rows_are_refused_with_file_and_line(tmp_path, bad_row, match):
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", [_GOOD_GSM8K, bad_row])
    with pytest.raises(ValueError, match=match) as e:
        data.load_problems(path)
    assert f"{path}:2:" in str(e.value)


@pytest.mark.parametrize(
    ("bad_row", "match"),
    [
        ({"problem": None, "answer": "7"}, "field 'problem' must be a non-empty string"),
        ({"problem": "p", "answer": "   "}, "no 'answer'"),  # blank answer, no solution
        ({"problem": "p", "answer": None, "solution": "no box"}, "no \\\\boxed"),
        ({"problem": "p", "solution": "\\boxed{}"}, "no \\\\boxed"),
        ({"problem": "p", "solution": "\\boxed{ . }"}, "gold answer is empty"),
        ({"problem": "p", "solution": 5}, "'solution' must be a string"),
        ({"problem": "p", "answer": _LONG}, "MAX_ANSWER_CHARS"),
        ({"problem": "p", "solution": "\\boxed{" + _LONG + "}"}, "MAX_ANSWER_CHARS"),
        ({"problem": "p", "answer": True}, "must be a string or a number"),
        ({"problem": "p", "answer": {"value": 3}}, "must be a string or a number"),
        ({"problem": "p", "answer": "\\frac{1}{"}, "unbalanced braces"),
    ],
)
def test_ungradable_math_rows_are_refused_with_file_and_line(tmp_path, bad_row, match):
    path = _write_jsonl(tmp_path / "math.jsonl", [_GOOD_MATH, bad_row])
    with pytest.raises(ValueError, match=match) as e:
        data.load_problems(path)
    assert f"{path}:2:" in str(e.value)


def test_non_finite_numbers_are_refused(tmp_path):
    # JSON has no NaN, but Python's json writes and reads it; Parquet stores it natively.
    path = tmp_path / "nan.jsonl"
    path.write_text('{"problem": "p", "answer": NaN}\n')
    with pytest.raises(ValueError, match=r"nan.jsonl:1: the answer is nan"):
        data.load_problems(str(path))
    path.write_text('{"problem": "p", "answer": "3", "level": NaN}\n')
    with pytest.raises(ValueError, match="level=nan is not a whole number"):
        data.load_problems(str(path))


def test_numeric_answers_and_level_forms_still_load(tmp_path):
    rows = [{"problem": "p", "answer": 42, "level": "Level 3"},
            {"problem": "p", "answer": 0.5, "level": 4.0},
            {"problem": "p", "answer": "\\{1, 2\\}", "level": "Level ?"}]
    loaded = data.load_problems(_write_jsonl(tmp_path / "m.jsonl", rows))
    assert [(p.answer, p.level) for p in loaded] == [("42", 3), ("0.5", 4), ("\\{1, 2\\}", None)]


@pytest.mark.parametrize("row", [5, [1, 2], "text", None, True])
def test_a_row_that_is_not_an_object_names_file_and_line(tmp_path, row):
    path = _write_jsonl(tmp_path / "rows.jsonl", [row])
    with pytest.raises(ValueError, match=r"rows.jsonl:1: a row must be a JSON object"):
        data.load_problems(path)
    # Also when it is not the first row (the format is decided from the first one).
    path = _write_jsonl(tmp_path / "rows.jsonl", [_GOOD_GSM8K, row])
    with pytest.raises(ValueError, match=r"rows.jsonl:2: a row must be a JSON object"):
        data.load_problems(path)


def test_line_numbers_count_blank_lines(tmp_path):
    path = tmp_path / "gaps.jsonl"
    path.write_text(json.dumps(_GOOD_GSM8K) + "\n\n\n" + json.dumps({"question": None,
                                                                    "answer": "#### 1"}))
    with pytest.raises(ValueError, match=r"gaps.jsonl:4:"):
        data.load_problems(str(path))


def test_non_utf8_files_name_file_line_and_fix(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(_GOOD_GSM8K).encode() + b"\n"
                     + '{"question": "caf\u00e9?", "answer": "#### 1"}'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.jsonl:2: not UTF-8 text.*re-encode"):
        data.load_problems(str(path))
    path = tmp_path / "latin1.json"
    path.write_bytes('[{"question": "caf\u00e9?", "answer": "#### 1"}]'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.json: not UTF-8 text"):
        data.load_problems(str(path))


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_GOOD_GSM8K).encode() + b"\r\n")
    assert [p.answer for p in data.load_problems(str(path))] == ["7"]


def test_bad_json_and_parquet_files(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[\n{"question": "q",\n "answer": }\n]')
    with pytest.raises(ValueError, match=r"bad.json:3: not valid JSON"):
        data.load_problems(str(path))
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}))
    with pytest.raises(ValueError, match="must hold a list of objects, got dict"):
        data.load_problems(str(path))
    path.write_text(json.dumps([_GOOD_GSM8K, 3]))
    with pytest.raises(ValueError, match=r"bad.json\[1\]: a row must be a JSON object"):
        data.load_problems(str(path))
    parquet = tmp_path / "bad.parquet"
    parquet.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ValueError, match=r"bad.parquet: not a readable Parquet file"):
        data.load_problems(str(parquet))


def test_parquet_rows_are_located_by_index(tmp_path):
    rows = [{"problem": "p", "answer": "1"}, {"problem": None, "answer": "2"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    with pytest.raises(ValueError, match=r"m.parquet\[1\]: field 'problem'"):
        data.load_problems(str(tmp_path / "m.parquet"))


def test_bad_path_types(tmp_path):
    for path in (None, "", 3):
        with pytest.raises(ValueError, match="must be a data file or a directory"):
            data.load_problems(path)


# ------------------------------------------------------------------------------- fuzzing

_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=30),
    st.sampled_from(["#### ", "####", "#### 7", "x\n#### 1,234", "\\boxed{5}", "{", "}",
                     "Level 3", "Level ?", _LONG, "#### " + _LONG]),
    st.lists(st.integers(), max_size=2),
)
_ROWS = st.one_of(
    st.dictionaries(st.sampled_from(["question", "answer", "problem", "solution", "level"]),
                    _VALUES, max_size=5),
    _VALUES,
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_ROWS, min_size=1, max_size=4), fmt=st.sampled_from(data.FORMATS))
def test_loader_fuzz_gradable_or_clear_error(tmp_path, rows, fmt):
    """Any rows: either every loaded problem is gradable (a non-empty question, a non-empty
    gold within MAX_ANSWER_CHARS that its own boxed form grades correct) or a ValueError
    that names the file; never another exception."""
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        loaded = data.load_problems(str(path), fmt=fmt)
    except ValueError as e:
        assert "fuzz.jsonl" in str(e)
        return
    texts = [v for r in rows if isinstance(r, dict) for v in r.values() if isinstance(v, str)]
    for p in loaded:
        assert p.question.strip() and p.question in texts  # never str(None) or str(12)
        assert grader.normalize_gold(p.answer) and (
            len(p.answer) <= grader.MAX_ANSWER_CHARS
            or canonical_numeral(grader.normalize_gold(p.answer)) is not None)
        assert p.level is None or (isinstance(p.level, int) and not isinstance(p.level, bool))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(st.integers(-10**6, 10**6),
                       st.fractions(max_denominator=50).filter(lambda f: f.denominator > 1)))
def test_loaded_numeric_golds_grade_their_own_answer(tmp_path, value):
    """Every numeric gold that loads is matched by a response that states it."""
    text = f"{value:,}" if isinstance(value, int) else f"{value.numerator}/{value.denominator}"
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": f"work\n#### {text}"}])
    (problem,) = data.load_problems(path)
    assert grader.grade(f"The answer is \\boxed{{{text}}}.", problem.answer) == 1.0
    assert grader.grade(f"so the total is {text}.", problem.answer) == 1.0


def test_a_long_numeric_gold_loads_and_grades_its_own_answer(tmp_path):
    """A 401-digit gold (more than MAX_ANSWER_CHARS) is a plain number: it loads, and the
    grader compares it exactly (its own answer 1, one digit off 0)."""
    digits = "9" + "3" * grader.MAX_ANSWER_CHARS
    path = _write_jsonl(tmp_path / "long.jsonl", [{"problem": "p", "answer": digits}])
    (problem,) = data.load_problems(path)
    assert problem.answer == digits
    assert grader.grade(f"\\boxed{{{digits}}}", problem.answer) == 1.0
    assert grader.grade(f"\\boxed{{{digits[:-1]}4}}", problem.answer) == 0.0
