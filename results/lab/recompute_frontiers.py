"""Recompute a lab learning-rate frontier run's tables from its committed data:

    python results/lab/recompute_frontiers.py results/lab/frontiers_answers [docs/results_lab.md]

`<folder>/sweep.json` (or `sweep.json.gz`) holds, per lr, every method's per-seed final
held-out pass@1 and pass@K (K = `frontier_k`) and the gate; `<folder>/summary.md` is the
study's own summary. The frontier-gap table is rebuilt with the study's code
(`sera_jax.studies.lab.sweep.frontier_gap_lines`: `compare.frontier_gap`, paired seed
bootstrap, the run's seed) and each lr's per-method mean points from the per-seed values;
every rebuilt line must stand in summary.md, and each frontier-gap row in the page given as
the second argument. Exit status 1 on a difference, with the lines that differ.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from sera_jax.studies.lab.sweep import frontier_gap_lines  # noqa: E402


def rebuild(folder: str) -> list[str]:
    """The frontier-gap table and one line of mean points per lr, from `sweep.json`."""
    path = os.path.join(folder, "sweep.json")
    with (gzip.open(path + ".gz", "rt") if not os.path.exists(path) else open(path)) as f:
        data = json.load(f)
    k, names, rows = int(data["frontier_k"]), list(data["methods"]), data["rows"]
    lines = frontier_gap_lines(rows, names, k, seed=int(data["seed"]))
    for r in rows:  # each method's mean point, as the sweep table prints it (two decimals)
        for n in names:
            x, y = r["per_seed"][n]["pass@1"], r["per_seed"][n][f"pass@{k}"]
            mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
            if abs(mean_x - r[n][0]["mean"]) > 1e-6 or abs(mean_y - r[n][1]["mean"]) > 1e-6:
                lines.append(f"lr {r['lr']} {n}: per-seed mean ({mean_x}, {mean_y}) != "
                             f"the table's ({r[n][0]['mean']}, {r[n][1]['mean']})")
    return lines


def main(folder: str, doc: str | None = None) -> int:
    with open(os.path.join(folder, "summary.md")) as f:
        summary = set(f.read().splitlines())
    lines = [line for line in rebuild(folder) if line]
    bad = [line for line in lines if line not in summary]
    if doc is not None:  # the page quotes the frontier-gap rows
        with open(doc) as f:
            page = set(f.read().splitlines())
        bad += [f"{doc}: {line}" for line in lines if line.startswith("| ")
                and not line.startswith(("| method", "|---")) and line not in page]
    for line in lines:
        print(line)
    if bad:
        print(f"\n{len(bad)} lines differ from the data:")
        print("\n".join(bad))
        return 1
    print(f"\nevery one of {len(lines)} lines matches the data ({folder}/summary.md"
          f"{'' if doc is None else ', ' + doc})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "results/lab/frontiers_answers",
                  sys.argv[2] if len(sys.argv) > 2 else None))
