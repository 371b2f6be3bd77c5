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
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sera_jax.tasks.mathqa.grader import gold_from_gsm8k, last_boxed

#: The spec's instruction suffixes (SERA_SPEC §7), keyed by model family.
PROMPT_TEMPLATES: dict[str, str] = {
    # SmolLM2 runs (GSM8K).
    "smollm": "{question} Let's think step by step and output the final answer within \\boxed{{}}.",
    # Qwen2.5-Math / Qwen3 runs (MATH, POLARIS).
    "qwen": "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
    # No instruction (e.g. few-shot prompts already in the question).
    "none": "{question}",
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
    #: Where it came from ("gsm8k.jsonl:17", "arithmetic/train", ...), for logs only.
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


def read_records(path: str) -> list[dict[str, Any]]:
    """Rows of one JSONL / JSON (a list of objects) / Parquet file as dicts."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # optional heavy import, only for Parquet files

        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            rows = json.load(f)
            if not isinstance(rows, list):
                raise ValueError(f"{path}: a .json file must hold a list of objects")
            return rows
        rows = []
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e})") from e
        return rows


def _detect_format(row: Mapping[str, Any], where: str) -> str:
    if "question" in row and "answer" in row:
        return "gsm8k"
    if "problem" in row and ("answer" in row or "solution" in row):
        return "math"
    raise ValueError(
        f"{where}: cannot tell the format from fields {sorted(row)}; expected GSM8K fields "
        f"{_GSM8K_FIELDS} (answer ending in '#### <answer>') or MATH fields {_MATH_FIELDS}"
    )


def _parse_level(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return int(value)
    match = re.search(r"\d+", str(value))
    return int(match.group()) if match else None


def _to_problem(row: Mapping[str, Any], fmt: str, where: str) -> MathProblem:
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: a row must be an object, got {type(row).__name__}")
    if fmt == "gsm8k":
        missing = [k for k in _GSM8K_FIELDS if k not in row]
        if missing:
            raise ValueError(
                f"{where}: GSM8K rows need fields {_GSM8K_FIELDS}, missing {missing} "
                f"(found {sorted(row)})"
            )
        try:
            gold = gold_from_gsm8k(str(row["answer"]))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        return MathProblem(str(row["question"]), gold, _parse_level(row.get("level")), where)
    if "problem" not in row or not ("answer" in row or "solution" in row):
        raise ValueError(
            f"{where}: MATH rows need fields {_MATH_FIELDS}, found {sorted(row)}"
        )
    gold = row.get("answer")
    if gold is None or not str(gold).strip():
        gold = last_boxed(str(row.get("solution") or ""))
        if not gold:
            raise ValueError(
                f"{where}: MATH row has no 'answer' and its 'solution' has no \\boxed{{...}}"
            )
    level = _parse_level(row.get("level"))
    return MathProblem(str(row["problem"]), str(gold).strip(), level, where)


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
    keeps the first `limit` problems. Raises ValueError naming the expected fields when a
    row does not fit, and when nothing is left.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {FORMATS}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit} must be >= 1 (or None for all problems)")
    keep = None if levels is None else {int(v) for v in levels}
    problems: list[MathProblem] = []
    for file in _files(path):
        rows = read_records(file)
        name = os.path.basename(file)
        file_fmt = fmt
        if rows and fmt == "auto":
            file_fmt = _detect_format(rows[0], f"{name}:0")
        for i, row in enumerate(rows):
            problem = _to_problem(row, file_fmt, f"{name}:{i}")
            if keep is None or problem.level in keep:
                problems.append(problem)
    if not problems:
        raise ValueError(
            f"no problems loaded from path={path!r} (levels={levels}); check the files"
        )
    return problems[:limit] if limit is not None else problems

