"""The lab's own report code, run on the committed run (`results/lab/cpu_default`), prints
the tables of that run's summary.md: the statistics it takes from `sera_jax.studies.compare`
give the numbers the run printed (the A/A arm under its current name `cells.AA`)."""

import functools
import importlib.util
import os

import numpy as np

from sera_jax.studies.lab import cells, regime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@functools.cache
def _recompute():
    spec = importlib.util.spec_from_file_location(
        "lab_recompute", os.path.join(ROOT, "results", "lab", "recompute.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _data():
    return _recompute().load()


def _summary() -> str:
    return _recompute().renamed_arms(_data()["summary"])


def test_cells_print_the_committed_tables():
    rc, data = _recompute(), _data()
    c, ks = data["config"], data["ks"]
    table_ks = list(c["report"]["table_ks"])
    for cell, methods, lr, title in (
            ("main", c["compare"]["methods"], c["rl"]["optimizer"]["learning_rate"], ""),
            ("maze_family", c["maze_family"]["methods"], c["maze_family"]["learning_rate"],
             "Maze family: ")):
        results = rc._cell(data, cell)
        assert cells.AA in results and cells.OLD_AA not in results
        lines, gate = cells.report_cell(results, ks, table_ks, c["compare"]["baseline"],
                                        list(methods), c["report"]["ci"], True, lr, title)
        assert "\n".join(lines) in _summary()
        assert gate["aa_false_positives"] == rc.aa_false_positives(results)
        assert gate["admissible"]


def test_regime_prints_the_committed_tables():
    data = _data()
    c, ks = data["config"], data["ks"]
    rg = c["regime"]
    shapes = [tuple(s) for s in rg["shapes"]]
    refs = [c["compare"]["baseline"], c["report"]["challenge_reference"], cells.NULL]
    rows = []
    for shape in shapes:
        by_law = {law: data["cells"][("regime", law, shape)] for law in rg["difficulties"]}
        rows += regime.regime_rows(by_law, shape, ks, list(rg["ks"]), refs, c["report"]["ci"])
    ref = c["compare"]["baseline"]
    for k in rg["ks"]:
        for reference, names in ((ref, [m for m in rg["methods"] if m != ref]),
                                 (cells.NULL, list(rg["methods"]))):
            table = regime.table_regime(rows, list(rg["difficulties"]), shapes, k, reference,
                                        names)
            assert table in _summary()


def test_an_arm_stored_under_the_old_aa_name_is_loaded(tmp_path):
    fp = {"arm": cells.AA, "version": cells.CACHE_VERSION, "seed": 0}
    result = {"pass_at_k": np.arange(6.0).reshape(1, 2, 3)}
    cells.save_arm(str(tmp_path), {**fp, "arm": cells.OLD_AA}, result)
    loaded = cells.load_arm(str(tmp_path), fp)
    assert loaded is not None and np.array_equal(loaded["pass_at_k"], result["pass_at_k"])
    assert cells.load_arm(str(tmp_path), {**fp, "arm": "uniform"}) is None
