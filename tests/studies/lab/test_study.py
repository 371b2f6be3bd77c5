"""The study end to end on a tiny config, the CPU default config, validation and renames."""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from sera_jax import methods, optim
from sera_jax.config_files import get_config
from sera_jax.studies import common, compare
from sera_jax.studies.lab import cells, study, train
from tests import util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CPU = os.path.join(ROOT, "configs", "allocation_lab", "cpu.py")


def _tiny():
    c = get_config(CPU)
    c.compare.seeds = (0, 1, 2)
    c.compare.methods = ("uniform", "sera_equalized")
    c.task.num_train, c.task.num_test, c.task.num_answers = 8, 8, 6
    c.task.feature_dim, c.task.num_skills = 4, 2
    c.rl.prompts_per_step, c.rl.rollouts_per_prompt, c.rl.allocation.n_max = 4, 4, 8
    c.rl.num_steps, c.eval.every = 4, 2
    c.eval.ks = (1, 4, 16)
    c.report.table_ks, c.report.fig_ks = (1, 16), (1, 16)
    c.report.challengers = ("sera_equalized",)
    c.report.challenge_reference = "uniform"
    c.maze_cell.prompts_per_step, c.maze_cell.rollouts_per_prompt, c.maze_cell.n_max = 4, 4, 8
    c.maze_cell.num_steps, c.maze_cell.eval_every = 4, 2
    c.maze_cell.table_ks = (1, 4)
    c.maze_cell.enabled = True  # off in the CPU default (no maze long-horizon config yet)
    c.maze_cell.methods = ("uniform", "sera_equalized")  # compiled once, shared by all cells
    c.regime.shapes = ((4, 4, 8),)
    c.regime.difficulties = ("maze", "hard")
    c.regime.methods = ("uniform", "sera_equalized")
    c.regime.subject = "sera_equalized"
    c.regime.seeds, c.regime.num_steps, c.regime.eval_every = (0, 1, 2), 4, 2
    c.regime.ks = (1, 16)
    c.maze_family.methods = ("uniform", "sera_equalized")
    c.maze_family.maze_size, c.maze_family.horizon = 3, 4
    c.maze_family.num_train, c.maze_family.num_test = 8, 8
    c.maze_family.prompts_per_step, c.maze_family.rollouts_per_prompt = 4, 4
    c.maze_family.n_max, c.maze_family.num_steps, c.maze_family.eval_every = 8, 4, 2
    return c


def test_study_end_to_end(tmp_path):
    c = _tiny()
    c.maze_family.window = 1  # the window table of the family (the maze cell's: below)
    out = study.run(c, str(tmp_path))
    for f in ("summary.md", "final.csv", "regime.csv", "results.npz", "pass_at_k_training.png",
              "pass_at_k_delta.png", "regime_map_pass16.png"):
        assert (tmp_path / f).exists(), f
    s = out["summary"]
    assert "Paired differences vs uniform" in s and "Regime map" in s and "Maze default" in s
    assert "Student t" in s and "2 methods × 3 paired seeds" in s and "AdamW lr 0.002" in s
    # laws x ks x (method, reference) pairs: sera − uniform, uniform/sera − null
    assert len(out["regime"]) == 2 * 2 * 3
    assert set(out["main"]) == {"uniform", "sera_equalized", study.NULL, study.AA}
    assert set(out["maze_family"]) == {"uniform", "sera_equalized", study.NULL, study.AA}
    assert "**Gate, lr 0.002:** uniform − null pass@1 = " in s and "| method − null |" in s
    assert "Maze family: Controls" in s and "A/A: aa − uniform has a CI" in s
    assert "Δ vs the null" in s  # the regime map's controls
    assert isinstance(out["gate"]["admissible"], bool) and out["maze_gate"] is not None
    assert out["main"]["uniform"]["pass_at_k"].shape[0] == 3  # one row per seed
    assert "## Maze family: Window: held-out pass@k averaged over steps 4 (the last 1" in s
    assert set(out["window"]) == {"maze_family"} and out["window"]["maze_family"]["gate"]

    # A re-run resumes: every finished arm (every cell: main, maze family and cell, regime)
    # is loaded from arms/, nothing is compiled or trained, and the report is the same.
    def no_runs(*args, **kwargs):
        raise AssertionError("a finished arm was trained again")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(train, "Runner", no_runs)
        m.setattr(train, "check_first_step", no_runs)
        again = study.run(c, str(tmp_path))
    for cell in ("main", "maze_family"):
        for arm, res in out[cell].items():
            for key, value in res.items():
                np.testing.assert_array_equal(again[cell][arm][key], value)
    assert again["summary"].split("Wall time")[0] == s.split("Wall time")[0]
    # A changed config trains only the arms it changes (here one method of the main cell).
    built, real = [], train.Runner

    def recording(method, *args, **kwargs):
        built.append(method.name)
        return real(method, *args, **kwargs)

    c.compare.methods = ("uniform", "sera")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(train, "Runner", recording)
        changed = study.run(c, str(tmp_path))
    assert built == ["sera"] and set(changed["main"]) == {"uniform", "sera", study.NULL, study.AA}
    np.testing.assert_array_equal(changed["main"]["uniform"]["pass_at_k"],
                                  out["main"]["uniform"]["pass_at_k"])


def test_cpu_default_is_valid():
    c = get_config(CPU)
    assert len(c.compare.seeds) >= 64 and c.compare.baseline == "uniform"
    runnable = {n for n, m in methods.METHODS.items() if not m.dynamic_sampling}
    assert runnable <= set(c.compare.methods)  # every non-DAPO method (DAPO: dapo.py)
    assert set(c.rl.optimizer) == set(optim.DEFAULTS)  # the one optimiser block, spelt out
    study.validate(c)
    setup = train.setup_from_config(c)
    # The lrs the issue-25 rule selected (docs/results_lab.md, the two lr sweeps).
    assert (setup.n0, setup.budget, dict(setup.optimizer)["learning_rate"]) == (8, 64, 0.002)
    assert dict(cells.maze_family_setup(c).optimizer)["learning_rate"] == 0.02


@pytest.mark.parametrize("field, value, match", [
    ("compare.methods", ("uniform", "serra"), "did you mean 'sera'"),
    ("compare.methods", "uniform,sera", "a tuple of distinct method names"),
    ("rl.max_rounds", 0, "rl.max_rounds=0 is invalid"),
    ("compare.baseline", "knapsack", "compare.baseline"),
    ("compare.seeds", (0,), "compare.seeds"),
    ("regime.seeds", (1, 1), "regime.seeds"),
    ("report.table_ks", (1, 3), "subset of eval.ks"),
    ("rl.rollouts_per_prompt", 100, "n_min <= n0 <= n_max"),
    ("rl.optimizer.learning_rate", -1.0, "rl.optimizer.learning_rate"),
    ("maze_family.window", 7, r"maze_family.window=7 is invalid; allowed: an integer in \[0, 6\]"),
    ("maze_family.window", -1, "maze_family.window"),
    ("sweep.family", "mazes", "sweep.family"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, field, value, match):
    # Not type-safe: a user's own config file may hold a string where the default has a tuple.
    c = ml_collections.ConfigDict(get_config(CPU).to_dict(), type_safe=False)
    util.set_field(c, field, value)
    with pytest.raises(common.StudyError, match=match):
        study.run(c, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_old_field_names_name_the_new_ones(tmp_path):
    """An override of a renamed field names its new home; so does an old config file."""
    c = get_config(CPU)
    assert (common.unknown_override(["--config.train.n0=4"], c)
            == "--config.train.n0: this field was renamed; use --config.rl.rollouts_per_prompt")
    msg = common.unknown_override(["--config.num_seeds=8"], c)
    assert msg.endswith("use --config.compare.seeds")
    assert common.unknown_override(["--config.history.gamma=0.5"], c).endswith(
        "use --config.rl.history.gamma")
    c.methods = ("uniform", "sera")  # a user's own config file with the old field
    with pytest.raises(common.StudyError, match="'methods' was renamed 'compare.methods'"):
        study.run(c, str(tmp_path / "w"))
    for old, new in study.RENAMED.items():  # every new home is a field of the default
        assert new in common.config_keys(get_config(CPU)), (old, new)
    out = subprocess.run([sys.executable, "-m", "experiments.allocation_lab",
                          f"--workdir={tmp_path}", "--config.train.n_max=16"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        "error: --config.train.n_max: this field was renamed; use "
        "--config.rl.allocation.n_max"), out.stderr[-2000:]


def test_a_new_allocator_runs_as_a_method(tmp_path, monkeypatch):
    """An allocator added the way every one is (`@register` + a `Method`: tests/toy_allocator)
    runs in the lab by name, with no lab code of its own."""
    from tests import toy_allocator

    monkeypatch.setitem(methods.METHODS, "toy", toy_allocator.TOY)
    c = _tiny()
    c.compare.methods = ("uniform", "toy")
    c.report.challengers, c.maze_cell.enabled, c.regime.enabled = (), False, False
    out = study.run(c, str(tmp_path))
    toy, uni = out["main"]["toy"], out["main"]["uniform"]
    setup = train.setup_from_config(c)
    assert (toy["counts"].sum(-1) == setup.budget).all()
    assert toy["counts"].min() >= 2 and (toy["counts"] != setup.n0).any()  # hardest first
    assert not np.array_equal(toy["pass_at_k"], uni["pass_at_k"])
    assert "| toy |" in out["summary"]


def test_the_2026_peers_run_in_the_study(tmp_path):
    """vip, gdro (its state in the carry, checked first step) and pilot_commit (its pilot
    drawn by the lab) run by name in the study's main cell and report."""
    c = _tiny()
    c.compare.methods = ("uniform", "vip", "gdro", "pilot_commit")
    c.compare.checked_methods = ("gdro",)
    c.report.challengers = ()
    c.maze_family.enabled = c.maze_cell.enabled = c.regime.enabled = False
    out = study.run(c, str(tmp_path))
    setup = train.setup_from_config(c)
    for name in ("vip", "gdro", "pilot_commit"):
        counts = out["main"][name]["counts"]
        assert (counts.sum(-1) == setup.budget).all(), name
        assert counts.min() >= setup.n_min and counts.max() <= setup.n_max, name
        assert f"| {name} |" in out["summary"]


# Slow: eight programs (2 lrs × 2 methods, 2 θ, the main cell); the sweep's gate and table
# stay in the fast suite (test_lr_sweep_on_the_maze_family_runs_its_cell).
@pytest.mark.slow
def test_lr_sweep_gates_each_lr_and_tables_theta(tmp_path):
    """The sweep: lr 0 fails the gate (✗), the selected lr is an admissible one, and the θ
    table has one row per θ (configs/allocation_lab/lr_sweep.py is valid)."""
    study.validate(get_config(os.path.join(ROOT, "configs", "allocation_lab", "lr_sweep.py")))
    c = _tiny()
    c.maze_family.enabled = c.maze_cell.enabled = c.regime.enabled = False
    c.sweep.enabled, c.sweep.learning_rates, c.sweep.frontier_k = True, (0.0, 0.5), 16
    c.sweep.methods, c.sweep.thetas = ("uniform", "sera"), (0.05, 0.2)
    c.compare.seeds = tuple(range(8))
    out = study.run(c, str(tmp_path))
    rows = {r["lr"]: r for r in out["sweep"]}
    assert rows[0.0]["admissible"] is False and rows[0.0]["gate"]["mean"] == 0.0
    s = out["summary"]
    assert "| 0.0 | +0.00 [+0.00, +0.00] (n.s.) ✗ |" in s
    # Every method's frontier against uniform's, from the per-seed values the rows keep.
    assert len(rows[0.5]["per_seed"]["sera"]["pass@16"]) == 8
    assert "Frontier gap vs uniform: pass@16 at matched pass@1" in s and "| sera |" in s
    saved = json.load(open(tmp_path / "sweep.json"))  # the frontier's data, as committed
    assert saved["rows"][1]["per_seed"] == rows[0.5]["per_seed"] and saved["frontier_k"] == 16
    script = os.path.join(ROOT, "results", "lab", "recompute_frontiers.py")
    res = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert res.returncode == 0 and "matches the data" in res.stdout, res.stdout + res.stderr
    if rows[0.5]["admissible"]:
        assert "Selected lr (admissible, best uniform pass@16): **0.5**" in s
        assert "| 0.2 |" in s and "θ sensitivity at lr 0.5" in s
    else:
        assert "No lr of the grid is admissible" in s


def test_lr_sweep_on_the_maze_family_runs_its_cell(tmp_path):
    """`sweep.family='maze'` sweeps the maze family's cell (its task and shape): at lr 0 the
    gate is exactly 0, and configs/allocation_lab/maze_lr_sweep.py is valid."""
    study.validate(get_config(os.path.join(ROOT, "configs", "allocation_lab",
                                           "maze_lr_sweep.py")))
    c = _tiny()
    c.maze_family.enabled = c.maze_cell.enabled = c.regime.enabled = False
    c.sweep.enabled, c.sweep.family, c.sweep.frontier_k = True, "maze", 16
    c.sweep.learning_rates, c.sweep.methods, c.sweep.thetas = (0.0, 0.5), ("uniform",), ()
    out = study.run(c, str(tmp_path))
    rows = {r["lr"]: r for r in out["sweep"]}
    assert rows[0.0]["admissible"] is False and rows[0.0]["gate"]["mean"] == 0.0
    assert "## lr sweep (maze)" in out["summary"]
    # The maze cell's p differs from the answer task's: the lr-0 points are the start of a
    # different task (answer task tiny: 6 answers, the maze family: 3×3 mazes, H 4).
    c.sweep.family = "answers"
    ans = {r["lr"]: r for r in study.run(c, str(tmp_path / "a"))["sweep"]}
    assert rows[0.0]["uniform"][0]["mean"] != ans[0.0]["uniform"][0]["mean"]


def test_maze_forecast_config_is_the_registered_driver():
    """configs/allocation_lab/maze_forecast.py is valid and holds the fields of the driver
    that produced docs/results_lab.md "Registered prediction" (window of 3: steps 200/300/400)."""
    c = get_config(os.path.join(ROOT, "configs", "allocation_lab", "maze_forecast.py"))
    study.validate(c)
    assert c.task.num_train == 256 and c.rl.optimizer.learning_rate == 0.005
    assert (c.compare.methods, c.report.challengers, c.rl.num_steps, c.eval.every) == (
        ("uniform",), (), 16, 16)
    assert not c.regime.enabled and not c.sweep.enabled and c.compare.controls
    meths = ("uniform", "sera", "sera_evidence")
    mc, mf = c.maze_cell, c.maze_family
    assert mc.enabled and mf.enabled and mc.methods == mf.methods == meths
    assert (mc.prompts_per_step, mc.rollouts_per_prompt, mc.n_max) == (32, 8, 64)
    assert (mc.num_steps, mc.eval_every, mc.table_ks, mc.window) == (400, 100, (1, 64), 3)
    assert (mf.num_train, mf.prompts_per_step, mf.rollouts_per_prompt, mf.n_max) == (
        256, 32, 8, 64)
    assert (mf.num_steps, mf.eval_every, mf.learning_rate, mf.window) == (400, 100, 0.05, 3)
    assert list(cells.maze_cell_setup(c).eval_steps[-3:]) == [200, 300, 400]
    assert c.rl.allocation.threshold is None and 64 in c.eval.ks and 1 in c.eval.ks
    assert get_config(CPU).maze_cell.window == get_config(CPU).maze_family.window == 0


def test_window_table_averages_the_last_evaluations(tmp_path):
    """`maze_cell.window` adds the window table (the maze family's: the end-to-end test); the
    numbers are the driver's (each seed's pass@k averaged over the last evaluations, then
    paired over seeds)."""
    c = _tiny()
    c.compare.methods, c.report.challengers = ("uniform",), ()
    c.regime.enabled = c.maze_family.enabled = False
    c.maze_cell.num_steps, c.maze_cell.window = 6, 2  # evaluations 0/2/4/6: window 4/6
    out = study.run(c, str(tmp_path))
    s = out["summary"]
    assert "## Maze default cell: Window: held-out pass@k averaged over steps 4/6 (the last 2" in s
    assert "| a − b | Δ pass@1 | Δ pass@4 |" in s and "| start (step 0) |" in s
    assert "| sera_equalized − uniform |" in s and "| uniform − null |" in s
    assert "**Gate, lr 0.002:** uniform − null pass@1 = " in s.split("Window:")[1]
    win = out["window"]["maze_cell"]
    assert list(win["paired"]) == [("sera_equalized", "uniform"), ("uniform", cells.NULL),
                                   ("sera_equalized", cells.NULL)]
    res, i = out["maze_cell"], list(c.eval.ks).index(4)
    w = lambda n: 100 * res[n]["pass_at_k"][:, -2:, 1, i].mean(1)
    assert win["paired"][("sera_equalized", "uniform")][4] == compare.seed_difference(
        w("sera_equalized"), w("uniform"))
    assert np.isclose(win["mean"][cells.NULL][4], w(cells.NULL).mean())
    assert win["gate"]["delta"] == study.gate(res, list(c.eval.ks), "t")["delta"]
    assert set(out["window"]) == {"maze_cell"} and win["steps"] == [4, 6]
