"""Export a finished allocation-lab run to small, committed files (`results/lab/<run>/`).

    python -m sera_jax.studies.lab.export --workdir=/tmp/allocation_lab \
        --config=configs/allocation_lab/cpu.py --out=results/lab/cpu_default

Reads the run's stored arms (`<workdir>/arms/`, `cells.load_arm`: every arm's arrays under
the fingerprint of what it depends on; nothing is trained -- a missing arm is an error) and
writes what `results/lab/recompute.py` needs to rebuild every table of the run's
`summary.md` with numpy alone:

* `curves.csv.gz` -- every arm's exact pass@k (and mean log p, mean p) per seed, evaluation
  step and split: the main cell and the maze family at every evaluation, the regime map's
  cells at their final evaluation (the only one the map reads);
* `diagnostics.csv.gz` -- per arm and seed, the sum and the count (non-NaN) over steps of
  each per-step metric and of the spread (std over prompts) of the rollout counts, for the
  main cell and the maze family (the diagnostics table is their pooled mean);
* `initial_p.csv.gz` -- each held-out prompt's initial success probability per seed: the
  answer task's p0 (the task's target) and the maze family's (exact DP) with the maze's
  shortest-path length L;
* `config.json` -- the run's config; `summary.md` -- the study's own summary, as written.

Values are written as the shortest decimal that reads back to the same float32.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from sera_jax.studies.lab import cells, train

SPLITS = ("train", "held-out")


def _f32(x: Any) -> str:
    return np.format_float_positional(np.float32(x), unique=True, trim="-")


def load_config(path: str):
    spec = importlib.util.spec_from_file_location("lab_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def load_cell(names: Sequence[str], setup: train.Setup, seed: int, seeds: Sequence[int],
              laws: dict[str, Any], controls: bool, threshold, arms_dir: str
              ) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """results[law][arm] of one cell, from the stored arms only."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = {law: {} for law in laws}
    for arm, method, stream, null in cells._arms(names, threshold, controls):
        for law, spec in laws.items():
            fp = cells.arm_fingerprint(arm, method, setup, seed, seeds, spec, stream, null)
            stored = cells.load_arm(arms_dir, fp)
            if stored is None:
                raise FileNotFoundError(f"arm {arm} on {law} ({setup.prompts_per_step}, "
                                        f"{setup.n0}, {setup.n_max}) is not in {arms_dir}")
            out[law][arm] = stored
    return out


def _gz_csv(path: str, header: Sequence[str], rows) -> int:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    n = 0
    for row in rows:
        w.writerow(row)
        n += 1
    with open(path, "wb") as f:  # gzip -9 -n: no name, no time stamp
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as g:
            g.write(buf.getvalue().encode())
    return n


def export(workdir: str, config, out: str) -> dict[str, str]:
    """Write the files of the module docstring to `out`; returns {file: what it holds}."""
    os.makedirs(out, exist_ok=True)
    arms_dir = os.path.join(workdir, cells.ARMS)
    ks = [int(k) for k in config.eval.ks]
    seeds = [int(s) for s in config.compare.seeds]
    theta = config.rl.allocation.threshold
    controls = bool(config.compare.controls)
    law = config.difficulty
    setup = train.setup_from_config(config)
    main = load_cell(list(config.compare.methods), setup, config.seed, seeds, {law: law},
                     controls, theta, arms_dir)[law]
    fs = cells.maze_family_setup(config)
    maze = load_cell(list(config.maze_family.methods), fs, config.seed, seeds,
                     {"maze": "maze"}, controls, theta, arms_dir)["maze"]
    rg = config.regime
    shapes = [tuple(int(x) for x in s) for s in rg.shapes]
    regime = {shape: load_cell(list(rg.methods), cells.regime_setup(config, shape),
                               config.seed + 1, [int(s) for s in rg.seeds],
                               {d: d for d in rg.difficulties}, rg.controls, theta, arms_dir)
              for shape in shapes}

    def curve_rows():
        blocks = [("main", law, setup, main, None), ("maze_family", "maze", fs, maze, None)]
        blocks += [("regime", d, cells.regime_setup(config, shape), res, -1)
                   for shape, by_law in regime.items() for d, res in by_law.items()]
        for cell, lw, su, results, only in blocks:
            steps = [int(s) for s in su.eval_steps]
            for arm, r in results.items():
                pk, lp, mp = r["pass_at_k"], r["mean_log_p"], r["mean_p"]
                evals = range(len(steps)) if only is None else [len(steps) + only]
                for s in range(pk.shape[0]):
                    for e in evals:
                        for sp, split in enumerate(SPLITS):
                            yield ([cell, lw, su.prompts_per_step, su.n0, su.n_max, arm, s,
                                    steps[e], split] + [_f32(v) for v in pk[s, e, sp]]
                                   + [_f32(lp[s, e, sp]), _f32(mp[s, e, sp])])

    n_curves = _gz_csv(os.path.join(out, "curves.csv.gz"),
                       ["cell", "law", "P", "N0", "n_max", "arm", "seed", "step", "split"]
                       + [f"pass@{k}" for k in ks] + ["mean_log_p", "mean_p"], curve_rows())

    def diag_rows():
        for cell, results in (("main", main), ("maze_family", maze)):
            for arm, r in results.items():
                st = r["steps"].astype(np.float64)
                c = r["counts"].astype(np.float64)
                spread = np.nanstd(np.where(c > 0, c, np.nan), axis=-1)  # [S, T]
                for s in range(st.shape[0]):
                    for j, metric in enumerate(train.STEP_METRICS):
                        v = st[s, :, j]
                        yield [cell, arm, s, metric, repr(float(np.nansum(v))),
                               int(np.isfinite(v).sum())]
                    v = spread[s]
                    yield [cell, arm, s, "rollouts_std", repr(float(np.nansum(v))),
                           int(np.isfinite(v).sum())]

    n_diag = _gz_csv(os.path.join(out, "diagnostics.csv.gz"),
                     ["cell", "arm", "seed", "metric", "sum", "count"], diag_rows())

    import jax

    p0_answers = np.asarray(train.make_tasks(setup, config.seed, seeds, law)[1].p0)
    _, test, params = train.make_tasks(fs, config.seed, seeds)
    family = train.FAMILIES["maze"]
    p0_maze, lengths = [], []
    for s in range(len(seeds)):  # one seed at a time, as the study's summary line computes it
        te, pa = jax.tree.map(lambda x, i=s: x[i], (test, params))
        p0_maze.append(np.asarray(family.success_probs(pa, te)))
        lengths.append(np.asarray(te.length))

    def p0_rows():
        for s in range(len(seeds)):
            for x in range(p0_answers.shape[1]):
                yield ["answers", s, x, _f32(p0_answers[s, x]), ""]
            for x in range(p0_maze[s].shape[0]):
                yield ["maze", s, x, _f32(p0_maze[s][x]), int(lengths[s][x])]

    n_p0 = _gz_csv(os.path.join(out, "initial_p.csv.gz"),
                   ["family", "seed", "prompt", "p0", "shortest_path"], p0_rows())
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(config.to_json(indent=1, sort_keys=True) + "\n")
    shutil.copyfile(os.path.join(workdir, "summary.md"), os.path.join(out, "summary.md"))
    return {
        "curves.csv.gz": f"{n_curves:,} rows: cell x law x (P, N0, n_max) x arm x seed x "
                         "evaluation step x split -> exact pass@k for k in eval.ks, mean log p, "
                         "mean p (main cell and maze family: every evaluation; regime map: "
                         "the final one)",
        "diagnostics.csv.gz": f"{n_diag:,} rows: cell x arm x seed x per-step metric -> sum "
                              "and non-NaN count over the steps (rollouts_std: the std over "
                              "prompts of the rollout counts > 0, per step)",
        "initial_p.csv.gz": f"{n_p0:,} rows: each held-out prompt's initial p per seed "
                            "(answer task: the task's p0; maze family: exact DP, with the "
                            "shortest-path length)",
        "config.json": "the run's config (configs/allocation_lab/cpu.py at the run's commit)",
        "summary.md": "the study's summary.md as the run wrote it",
    }


def main(argv: list[str]) -> int:
    args = dict(a.lstrip("-").split("=", 1) for a in argv[1:])
    config = load_config(args.get("config", "configs/allocation_lab/cpu.py"))
    files = export(args["workdir"], config, args["out"])
    print(json.dumps(files, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
