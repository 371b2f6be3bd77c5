"""Checked mode on the lab's first step (issue 24): `train.check_first_step` runs step 0
under `checks.jit_checked` and names the first bad value; the plain runner does not check."""

import os

import jax.numpy as jnp
import ml_collections
import pytest

from sera_jax import checks
from sera_jax import history as history_lib
from sera_jax.config_files import get_config
from sera_jax.studies.lab import cells, study, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _setup():
    c = get_config(os.path.join(ROOT, "configs", "allocation_lab", "cpu.py"))
    c.task.num_train, c.task.num_test, c.task.num_answers = 8, 8, 6
    c.task.feature_dim, c.task.num_skills = 4, 2
    c.rl.prompts_per_step, c.rl.rollouts_per_prompt, c.rl.allocation.n_max = 4, 4, 8
    c.rl.num_steps, c.eval.every, c.eval.ks = 2, 2, (1, 4)
    setup = train.setup_from_config(c)
    return setup, train.seed_keys(0, (0, 1)), train.make_tasks(setup, 0, (0, 1))


def test_a_clean_first_step_passes_the_checks():
    setup, keys, tasks = _setup()
    for name in ("uniform", "sera"):
        train.check_first_step(cells.method_for(name), setup, keys, tasks)


def test_a_bad_p_hat_is_named_under_jit_and_missed_without_checks(monkeypatch):
    """A history that returns p̂ = 1.5 (a corrupt estimate): the plain compiled runner
    allocates with it silently; the checked first step raises naming the value."""
    setup, keys, tasks = _setup()
    real = history_lib.lookup
    monkeypatch.setattr(history_lib, "lookup", lambda h, ids: jnp.full(ids.shape, 1.5)
                        + 0 * jnp.nan_to_num(real(h, ids)))
    out = train.Runner(cells.method_for("sera"), setup)(keys, tasks)
    assert out["counts"].sum(-1).min() == setup.budget  # ran, unchecked
    with pytest.raises(checks.CheckError, match=r"seed 0: history.lookup: p\[0\]=1.5 is outside"):
        train.check_first_step(cells.method_for("sera"), setup, keys, tasks)


def test_the_study_checks_the_configured_methods_first(monkeypatch, tmp_path):
    """`compare.checked_methods` reaches run_cell (only the listed methods are checked), and
    the field is validated before any work."""
    setup, keys, tasks = _setup()
    seen = []
    monkeypatch.setattr(train, "check_first_step",
                        lambda method, *a: seen.append(method.name))
    # Any two methods show the plumbing; sera_equalized's runner compiles in a third of
    # sera's time (no dynamic active-set search).
    cells.run_cell(["uniform", "sera_equalized"], setup, 0, (0, 1), {"maze": "maze"},
                   checked=("sera_equalized",))
    assert seen == ["sera_equalized"]
    c = get_config(os.path.join(ROOT, "configs", "allocation_lab", "cpu.py"))
    assert tuple(c.compare.checked_methods) == ("sera",)
    # Not type-safe: a user's own config file may hold a string where the default has a tuple.
    c = ml_collections.ConfigDict(c.to_dict(), type_safe=False)
    c.compare.checked_methods = "sera"
    with pytest.raises(study.common.StudyError, match="compare.checked_methods"):
        study.run(c, str(tmp_path / "w"))
