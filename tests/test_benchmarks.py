"""The benchmark scripts run end to end at a tiny size (their numbers are not checked here:
speed is measured by running them, see docs/results_allocation.md)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_allocation_bench_runs_and_matches_numpy():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "allocation_bench.py"), "--sizes", "256",
         "--reps", "1", "--numpy_budget_s", "1"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 256 |")]
    assert len(rows) == 2, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[9] == "yes", row  # leximin objective >= NumPy's on one active set
