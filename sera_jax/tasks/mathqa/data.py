"""Math problem sets from user files: GSM8K-style and MATH-style, JSONL or Parquet.

Two record layouts are understood (extra fields are ignored):

* **GSM8K** (also GSM8K-Platinum): `question`, `answer` where `answer` ends with
  `#### <final answer>`.
* **MATH** (also MATH-500, POLARIS, DAPO-style sets): `problem` and either `answer` (the
  final answer) or `solution` (worked solution with a `\\boxed{...}` answer); optional `level`
  (`"Level 3"` or `3`), used by the `levels` filter.

Prompt ids are stable: the position of a problem after loading the files of a directory in
sorted file-name order, rows in file order, after the deterministic `levels` filter. The same
files and arguments always give the same ids (the success-history tracker relies on it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sera_jax.tasks.mathqa.bounds import canonical_numeral
from sera_jax.tasks.mathqa.grader import (
    MAX_ANSWER_CHARS,
    gold_from_gsm8k,
    last_boxed,
    normalize_gold,
)

#: The spec's instruction suffixes (SERA_SPEC §7), keyed by model family.
PROMPT_TEMPLATES: dict[str, str] = {
    # SmolLM2 runs (GSM8K).
    "smollm": "{question} Let's think step by step and output the final answer within \\boxed{{}}.",
    # Qwen2.5-Math / Qwen3 runs (MATH, POLARIS).
    "qwen": "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    # No instruction (e.g. few-shot prompts already in the question).
    "none": "{question}",
    # Short answers for CPU RL of a small model (the grader reads the rightmost number).
    "number": "{question} Answer with the number only.",
    # One worked line ending "The answer is N." (the few-shot set shows the format).
    "worked": "{question} Show the steps on one line and end with \"The answer is N.\"",
    # The steps on one line, the last result being the answer.
    "steps": "{question} Show the steps on one line.",
}

FORMATS = ("auto", "gsm8k", "math")
_SUFFIXES = (".jsonl", ".json", ".parquet")
_GSM8K_FIELDS = ("question", "answer")
_MATH_FIELDS = ("problem", "answer or solution")


@dataclasses.dataclass(frozen=True)
class MathProblem:
    """One problem: question text, gold final answer (a string math-verify can parse)."""

    question: str
    answer: str
    #: Difficulty: MATH level 1-5, the number of steps of a generated problem, or None.
    level: int | None = None
    #: Where it came from ("data/gsm8k.jsonl:17" = file:line, "data/math.parquet[3]",
    #: "arithmetic/train", ...), for logs only.
    source: str = ""
    #: Free-form extra data (template name and operands of generated problems, ...).
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


def format_prompt(question: str, template: str = "smollm") -> str:
    """The user-turn text of a problem: `PROMPT_TEMPLATES[template]` with the question in it."""
    if template not in PROMPT_TEMPLATES:
        raise ValueError(
            f"template={template!r} is not one of {sorted(PROMPT_TEMPLATES)}"
        )
    return PROMPT_TEMPLATES[template].format(question=question)


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith(_SUFFIXES)
        )
        if not files:
            raise ValueError(
                f"path={path!r} is a directory without any {'/'.join(_SUFFIXES)} file"
            )
        return files
    if not os.path.exists(path):
        raise ValueError(f"path={path!r} does not exist (give a data file or a directory)")
    if not path.endswith(_SUFFIXES):
        raise ValueError(f"path={path!r} must end with one of {_SUFFIXES}")
    return [path]


def _read_rows(path: str) -> list[tuple[str, Any]]:
    """`(where, row)` pairs of one file; `where` is `path:line` (JSONL, 1-based) or
    `path[index]` (JSON list, Parquet; 0-based), the location every later error names."""
    name = path
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # optional heavy import, only for Parquet files

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 -- pyarrow raises several types for bad files
            raise ValueError(
                f"{path}: not a readable Parquet file ({type(e).__name__}: {e}); re-export it "
                "or convert it to JSONL"
            ) from e
        return [(f"{name}[{i}]", row) for i, row in enumerate(rows)]
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors)
        data = data[3:]
    if path.endswith(".json"):
        text = _decode(data, path)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from e
        if not isinstance(rows, list):
            raise ValueError(
                f"{path}: a .json file must hold a list of objects, got {type(rows).__name__} "
                "(use .jsonl for one object per line)"
            )
        return [(f"{name}[{i}]", row) for i, row in enumerate(rows)]
    out = []
    for line_no, raw in enumerate(data.split(b"\n"), 1):
        line = _decode(raw, f"{path}:{line_no}")
        if line.strip():
            try:
                out.append((f"{name}:{line_no}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e})") from e
    return out


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{where}: not UTF-8 text (byte {e.start}: {data[e.start:e.start + 4]!r}); "
            "re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
        ) from e


def _detect_format(row: Any, where: str) -> str:
    _check_object(row, where)
    if "question" in row and "answer" in row:
        return "gsm8k"
    if "problem" in row and ("answer" in row or "solution" in row):
        return "math"
    raise ValueError(
        f"{where}: cannot tell the format from fields {sorted(row)}; expected GSM8K fields "
        f"{_GSM8K_FIELDS} (answer ending in '#### <answer>') or MATH fields {_MATH_FIELDS}"
    )


def _check_object(row: Any, where: str) -> None:
    if not isinstance(row, Mapping):
        raise ValueError(
            f"{where}: a row must be a JSON object with the problem's fields, got "
            f"{type(row).__name__} {str(row)[:60]!r}"
        )


def _parse_level(value: Any, where: str) -> int | None:
    """`3`, `3.0` or `"Level 3"` -> 3; None or a string without a number (MATH's
    `"Level ?"`) -> None; anything else is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or (
        isinstance(value, float) and not (math.isfinite(value) and value.is_integer())
    ):
        raise ValueError(f"{where}: level={value!r} is not a whole number")
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        match = re.search(r"\d+", value)
        return int(match.group()) if match else None
    raise ValueError(f"{where}: level={value!r} must be a number or a 'Level N' string")


def _text_field(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"{where}: field {key!r} must be a non-empty string, got {value!r}; fix or drop "
            "the row"
        )
    return value


def _checked_gold(gold: Any, where: str) -> str:
    """The gold answer as a string the grader can match, or ValueError naming the row."""
    if isinstance(gold, bool) or not isinstance(gold, str | int | float):
        raise ValueError(
            f"{where}: the answer must be a string or a number, got {type(gold).__name__} "
            f"{str(gold)[:60]!r}"
        )
    if isinstance(gold, float) and not math.isfinite(gold):
        raise ValueError(f"{where}: the answer is {gold!r}, not a finite number")
    text = str(gold).strip()
    if not normalize_gold(text):
        raise ValueError(
            f"{where}: the gold answer is empty (got {str(gold)!r}); no response could "
            "ever be graded correct. Fix or drop the row"
        )
    # A long plain number is compared exactly by the grader; anything else long never is.
    if len(text) > MAX_ANSWER_CHARS and canonical_numeral(normalize_gold(text)) is None:
        raise ValueError(
            f"{where}: the gold answer has {len(text)} characters, more than the grader's "
            f"MAX_ANSWER_CHARS={MAX_ANSWER_CHARS}, and is not a plain number (longer answers "
            "are never parsed, so no response could be graded correct): "
            f"{text[:60]!r}...; shorten or drop the row"
        )
    if not _balanced_braces(text):
        raise ValueError(
            f"{where}: the gold answer {text[:80]!r} has unbalanced braces, so a boxed "
            "response could never match it; fix or drop the row"
        )
    return text


def _balanced_braces(text: str) -> bool:
    depth = 0
    for ch in re.sub(r"\\[{}\\]", "", text):  # escaped braces are literal characters
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _to_problem(row: Any, fmt: str, where: str) -> MathProblem:
    _check_object(row, where)
    if fmt == "gsm8k":
        missing = [k for k in _GSM8K_FIELDS if k not in row]
        if missing:
            raise ValueError(
                f"{where}: GSM8K rows need fields {_GSM8K_FIELDS}, missing {missing} "
                f"(found {sorted(row)})"
            )
        question = _text_field(row, "question", where)
        try:
            gold = gold_from_gsm8k(row["answer"])
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        return MathProblem(question, _checked_gold(gold, where),
                           _parse_level(row.get("level"), where), where)
    if "problem" not in row or not ("answer" in row or "solution" in row):
        raise ValueError(
            f"{where}: MATH rows need fields {_MATH_FIELDS}, found {sorted(row)}"
        )
    question = _text_field(row, "problem", where)
    gold = row.get("answer")
    if gold is None or (isinstance(gold, str) and not gold.strip()):
        solution = row.get("solution")
        if solution is not None and not isinstance(solution, str):
            raise ValueError(
                f"{where}: field 'solution' must be a string, got {type(solution).__name__}"
            )
        gold = last_boxed(solution or "")
        if not gold:
            raise ValueError(
                f"{where}: MATH row has no 'answer' and its 'solution' has no \\boxed{{...}}"
            )
    return MathProblem(question, _checked_gold(gold, where),
                       _parse_level(row.get("level"), where), where)


def load_problems(
    path: str,
    *,
    fmt: str = "auto",
    levels: Sequence[int] | None = None,
    limit: int | None = None,
) -> list[MathProblem]:
    """Problems from a file or a directory of `.jsonl` / `.json` / `.parquet` files.

    `fmt` is 'gsm8k', 'math' or 'auto' (decided per file from its first row). `levels` keeps
    only problems whose level is listed (rows without a level are dropped then); `limit`
    keeps the first `limit` problems.

    Every row must be gradable, or loading stops with a ValueError naming `file:line` (JSONL)
    or `file[index]` (JSON, Parquet) and the fix: a file that is not UTF-8 / JSON / Parquet,
    a row that is not an object or lacks the format's fields, a question that is not a
    non-empty string (a null `question` is refused, never read as "None"), a gold answer
    that is empty (`"#### "`), not a string or finite number, longer than the grader's
    `MAX_ANSWER_CHARS` (unless a plain number, which the grader compares exactly) or with
    unbalanced braces, a level that is not a whole number.
    Also raises when nothing is left after filtering.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {FORMATS}")
    if not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise ValueError(f"path={path!r} must be a data file or a directory")
    path = os.fspath(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit} must be >= 1 (or None for all problems)")
    keep = None if levels is None else {int(v) for v in levels}
    problems: list[MathProblem] = []
    for file in _files(path):
        rows = _read_rows(file)
        file_fmt = fmt
        if rows and fmt == "auto":
            file_fmt = _detect_format(rows[0][1], rows[0][0])
        for where, row in rows:
            problem = _to_problem(row, file_fmt, where)
            if keep is None or problem.level in keep:
                problems.append(problem)
    if not problems:
        raise ValueError(
            f"no problems loaded from path={path!r} (levels={levels}); check the files"
        )
    return problems[:limit] if limit is not None else problems

