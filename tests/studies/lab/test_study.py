"""The study end to end on a tiny config, and the CPU default config."""

import os

import pytest

from sera_jax import methods
from sera_jax.config_files import get_config
from sera_jax.studies.lab import study, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CPU = os.path.join(ROOT, "configs", "allocation_lab", "cpu.py")


def _tiny():
    c = get_config(CPU)
    c.num_seeds = 3
    c.methods = ("uniform", "sera_equalized")
    c.task.num_train, c.task.num_test, c.task.num_answers = 8, 8, 6
    c.task.feature_dim, c.task.num_skills = 4, 2
    c.train.prompts_per_step, c.train.n0, c.train.n_max = 4, 4, 8
    c.train.num_steps, c.train.eval_every = 4, 2
    c.report.ks = (1, 4, 16)
    c.report.table_ks, c.report.fig_ks = (1, 16), (1, 16)
    c.report.challengers = ("sera_equalized",)
    c.report.challenge_reference = "uniform"
    c.maze_cell.prompts_per_step, c.maze_cell.n0, c.maze_cell.n_max = 4, 4, 8
    c.maze_cell.num_steps, c.maze_cell.eval_every = 4, 2
    c.maze_cell.table_ks = (1, 4)
    c.maze_cell.methods = ("uniform", "sera_equalized")  # compiled once, shared by all cells
    c.regime.shapes = ((4, 4, 8),)
    c.regime.difficulties = ("maze", "hard")
    c.regime.methods = ("uniform", "sera_equalized")
    c.regime.subject = "sera_equalized"
    c.regime.num_seeds, c.regime.num_steps, c.regime.eval_every = 3, 4, 2
    c.regime.ks = (1, 16)
    return c


def test_study_end_to_end(tmp_path):
    out = study.run(_tiny(), str(tmp_path))
    for f in ("summary.md", "final.csv", "regime.csv", "results.npz", "pass_at_k_training.png",
              "pass_at_k_delta.png", "regime_map_pass16.png"):
        assert (tmp_path / f).exists(), f
    s = out["summary"]
    assert "Paired differences vs uniform" in s and "Regime map" in s and "Maze default" in s
    assert "Student t" in s
    assert len(out["regime"]) == 2 * 2 * 1  # laws x ks x (method, reference) pairs
    assert set(out["main"]) == {"uniform", "sera_equalized"}


def test_cpu_default_is_valid():
    c = get_config(CPU)
    assert c.num_seeds >= 64
    for name in list(c.methods) + list(c.regime.methods) + list(c.maze_cell.methods):
        methods.get_method(name)
    assert set(methods.METHODS) <= set(c.methods)  # every registered method is compared
    setup = train.setup_from_config(c)
    for p, n0, n_max in c.regime.shapes:
        setup.with_(prompts_per_step=p, n0=n0, n_max=n_max, num_steps=c.regime.num_steps,
                    eval_every=c.regime.eval_every)
    with pytest.raises(ValueError, match="unknown method"):
        c.methods = ("uniform", "sera_dynamic")
        study.run(c, "/nonexistent/never-written")
