"""`stages.run_plan`: seed-major order and what a diverging run does to a sweep."""

import os

import ml_collections
import pytest

from sera_jax import loop
from sera_jax.records import read_json
from sera_jax.studies.paired import stages
from sera_jax.studies.paired.spec import run_dir


@pytest.fixture
def fake_rl(monkeypatch):
    """`stage_rl` replaced by a recorder; (arm, seed) pairs in `fails` raise NonFiniteError."""
    calls, fails = [], set()

    def stage_rl(cfg, workdir, arm, seed, mesh=None, **kwargs):
        calls.append((arm, seed))
        if (arm, seed) in fails:
            raise loop.NonFiniteError(f"{arm} seed {seed}: step 7 was not applied")

    monkeypatch.setattr(stages, "stage_rl", stage_rl)
    return calls, fails


PLAN = [("uniform", [0, 1]), ("sera", [0, 1]), ("null", [0])]


def test_runs_are_seed_major(fake_rl, tmp_path):
    calls, _ = fake_rl
    assert stages.run_plan(ml_collections.ConfigDict(), str(tmp_path), PLAN) == []
    assert calls == [("uniform", 0), ("sera", 0), ("null", 0), ("uniform", 1), ("sera", 1)]


def test_a_diverging_run_stops_the_plan_by_default(fake_rl, tmp_path):
    calls, fails = fake_rl
    fails.add(("sera", 0))
    with pytest.raises(loop.NonFiniteError, match="step 7"):
        stages.run_plan(ml_collections.ConfigDict(), str(tmp_path), PLAN)
    assert calls == [("uniform", 0), ("sera", 0)]
    assert not os.path.exists(os.path.join(run_dir(str(tmp_path), "sera", 0), stages.DIVERGED))


def test_a_sweep_marks_a_diverging_run_goes_on_and_skips_it_later(fake_rl, tmp_path):
    calls, fails = fake_rl
    fails.add(("sera", 0))
    out = stages.run_plan(ml_collections.ConfigDict(), str(tmp_path), PLAN, keep_going=True)
    assert [(d["arm"], d["seed"]) for d in out] == [("sera", 0)]
    assert calls == [("uniform", 0), ("sera", 0), ("null", 0), ("uniform", 1), ("sera", 1)]
    marker = read_json(os.path.join(run_dir(str(tmp_path), "sera", 0), stages.DIVERGED))
    assert "step 7" in marker["error"]
    calls.clear()
    again = stages.run_plan(ml_collections.ConfigDict(), str(tmp_path), PLAN, keep_going=True)
    assert ("sera", 0) not in calls and [(d["arm"], d["seed"]) for d in again] == [("sera", 0)]
