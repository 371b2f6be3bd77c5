"""Recompute the GPU maze table of docs/results_maze.md ("GPU, 17x17, one H200") from the raw
summary the device command brought back:

    python results/device/recompute_maze.py results/device/2026-12-04_h200/maze.json.gz

Prints held-out pass@k (percent) of the blind control, the SFT start and each arm's last
evaluation point, the start / blind ratios, and the primary endpoint's point value.
"""

from __future__ import annotations

import gzip
import json
import sys

KS = ("1", "4", "16", "64", "128")


def main(path: str) -> None:
    with gzip.open(path, "rt") as f:
        d = json.load(f)
    blind = d["blind"]["blind_pass_at_k"]
    start = d["comparison"]["sft"]["pass_at_k"]  # scored with the last point's keys
    rows = {"maze-blind control (exact)": blind, "SFT start (last point's keys)": start}
    for run, v in sorted(d["runs"].items()):
        last = max(v["eval"], key=lambda r: r["step"])
        rows[f"{run}, step {last['step']}"] = last["pass_at_k"]
    print("| policy | " + " | ".join(f"pass@{k}" for k in KS) + " |")
    for name, pk in rows.items():
        print(f"| {name} | " + " | ".join(f"{100 * pk[k]:.2f}" for k in KS) + " |")
    for k in ("1", "64"):
        print(f"start / blind at pass@{k}: {start[k] / blind[k]:.0f}x")
    v = d["blind"]
    print(f"distinct held-out answers {v['distinct_answers']} of {v['num_mazes']}, seen in SFT "
          f"{100 * v['seen_in_sft']:.1f} %, median moves {v['median_moves']:.0f}")
    p = d["comparison"]["primary"]
    print(f"primary {p['comparison']} held-out pass@{p['k']}, last {p['window']} points: "
          f"{100 * p['estimate']['mean']:+.1f} pp, {p['estimate']['seeds']} seed(s), "
          f"CI {p['estimate']['lo']}..{p['estimate']['hi']}; {p['outcome']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/device/2026-12-04_h200/maze.json.gz")
