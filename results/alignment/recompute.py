"""Regenerate the measured tables of docs/results_alignment.md from the committed run and check
them against the page:

    python results/alignment/recompute.py [results/alignment/digits] [docs/results_alignment.md]

Reads the run's folder alone -- `alignment.csv.gz` (every paired draw), `stages.json` (each
snapshot's p statistics), `fingerprint.json` (the measurement config), `stamp.json` (commit,
command, machine, date, wall time) -- and rebuilds the tables with the study's own arithmetic
(`sera_jax.studies.alignment.report.aggregate` and `summary_markdown`). Prints them, then
compares every line of the page's "Measured tables" section with them: the set-up line up to
its wall time, each caption and each table line. Exit status 1 when any line differs (a
unified diff says which), 0 when all match.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

FOLDER = os.path.join(ROOT, "results", "alignment", "digits")
DOC = os.path.join(ROOT, "docs", "results_alignment.md")
#: The page's section the tables live in (its heading starts so); it ends at the next `## `.
SECTION = "## Measured tables"
#: The set-up line is compared up to here: the wall time is the run's, not the table's.
WALL = "; wall time"

_INT = ("stage_step", "budget", "draw", "seed")
_STR = ("stage", "method")


def load(folder: str = FOLDER) -> dict[str, Any]:
    """The run's files: {'rows': typed CSV rows, 'stages', 'fingerprint', 'stamp'}."""
    with gzip.open(os.path.join(folder, "alignment.csv.gz"), "rt", newline="") as f:
        rows = [{k: (v if k in _STR else int(v) if k in _INT else float(v))
                 for k, v in r.items()} for r in csv.DictReader(io.StringIO(f.read()))]
    out: dict[str, Any] = {"rows": rows}
    for name in ("stages", "fingerprint", "stamp"):
        with open(os.path.join(folder, f"{name}.json")) as f:
            out[name] = json.load(f)
    out["fingerprint"] = out["fingerprint"]["fingerprint"]
    return out


def table(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-cell aggregate (mean cosine ± se, paired differences, κ, cos(E)) of the run."""
    from sera_jax.studies.alignment.report import aggregate

    return aggregate(data["rows"])


def summary(data: dict[str, Any]) -> str:
    """The study's `summary.md`, rebuilt from the run's files."""
    import ml_collections

    from sera_jax.studies.alignment.report import summary_markdown

    fp = data["fingerprint"]
    config = ml_collections.ConfigDict({
        "seed": fp["seed"], "data": fp["data"], "model": fp["model"],
        "measure": fp["measure"], "rl": {"allocation": fp["allocation"]}})
    return summary_markdown(table(data), data["stages"], fp["methods"],
                            data["stamp"]["wall_time_s"], config)


def _lines(text: str) -> list[str]:
    """Non-blank lines, the set-up line cut at its wall time."""
    return [ln.split(WALL)[0] if WALL in ln else ln for ln in text.splitlines() if ln.strip()]


def doc_section(doc_text: str) -> str:
    """The page's "Measured tables" section, without its heading."""
    lines = doc_text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(SECTION)), None)
    if start is None:
        raise ValueError(f"no section starting {SECTION!r}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    return "\n".join(lines[start + 1:end])


def check(folder: str = FOLDER, doc: str = DOC) -> tuple[str, list[str]]:
    """(regenerated summary, unified diff page -> data: empty when every line matches)."""
    text = summary(load(folder))
    with open(doc) as f:
        page = _lines(doc_section(f.read()))
    regenerated = _lines(text)[1:]  # the summary's title is the page's heading's business
    diff = list(difflib.unified_diff(page, regenerated, os.path.relpath(doc, ROOT),
                                     f"regenerated from {os.path.relpath(folder, ROOT)}",
                                     lineterm="", n=0))
    return text, diff


def main(argv: list[str]) -> int:
    folder = argv[1] if len(argv) > 1 else FOLDER
    doc = argv[2] if len(argv) > 2 else DOC
    text, diff = check(folder, doc)
    print(text)
    stamp = load(folder)["stamp"]
    print(f"data: {folder} (commit {stamp['commit'][:7]}, {stamp['date']}, {stamp['machine']})")
    if diff:
        print("\n".join(diff))
        print(f"{sum(ln.startswith('-') and not ln.startswith('---') for ln in diff)} line(s) "
              f"of {doc} differ from the data")
        return 1
    print(f"every line of the {SECTION!r} section of {doc} matches the data")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
