"""Run records on disk: JSON written atomically, JSONL appended and read kill-tolerantly.

Experiment binaries log metrics and evaluations here; a run killed mid-write leaves at most
a torn last JSONL line, which readers drop, so a restarted command resumes cleanly. In a
multi-process job only process 0 writes (every process computes the same records).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _primary() -> bool:
    """False on processes other than 0 of a multi-process JAX job (they do not write)."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


def append_jsonl(path: str, record: dict[str, Any]) -> None:
    """Append one JSON record as a line."""
    if not _primary():
        return
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Records of a JSONL file ([] when missing).

    A torn *last* line (a kill mid-append) is dropped; anything else unreadable -- a bad
    line followed by more records, a line that is not a JSON object, bytes that are not
    UTF-8 -- raises ValueError naming `path:line`, never silently losing what follows.
    """
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); it is not a "
                         "record file of this project -- move it away and re-run") from None
    out = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == last and not line.endswith("}"):
                break  # torn by a kill: the step is redone on resume
            raise ValueError(f"{path}:{i + 1}: not a JSON record; repair or remove the line "
                             "(records after it would otherwise be lost)") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{i + 1}: a record must be a JSON object, got "
                             f"{type(record).__name__}")
        out.append(record)
    return out


def write_jsonl(path: str, records: list[dict[str, Any]]) -> None:
    """Replace a JSONL file atomically (write to a temporary file, then rename)."""
    if not _primary():
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
    """Write JSON atomically, so a reader never sees half a file."""
    if not _primary():
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def log_timing(workdir: str, what: str, seconds: float) -> None:
    """Append a wall-time record to `<workdir>/timings.jsonl`."""
    append_jsonl(os.path.join(workdir, "timings.jsonl"),
                 {"what": what, "seconds": round(seconds, 2), "utc": time.time()})
