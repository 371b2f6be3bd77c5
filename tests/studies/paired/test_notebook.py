"""notebooks/maze.ipynb executes top to bottom: without a finished run it trains a tiny
policy and skips the comparison plot; with one (MAZE_WORKDIR made by MAZE_CONFIG, the path
its text describes) it loads that run's SFT policy, checked against that config."""

import os

import pytest

from sera_jax import config_files
from sera_jax.studies import paired as study
from tests import util

# Slow: the notebook re-runs its study in a kernel (the study itself is tested end to end in
# the fast suite); `make test-slow` runs it in CI.
pytestmark = pytest.mark.slow


def test_notebook_executes(monkeypatch, tmp_path):
    monkeypatch.setenv("MAZE_WORKDIR", str(tmp_path / "no_run_here"))
    outputs = util.execute_notebook("maze.ipynb", monkeypatch)
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "trained a tiny policy" in text and "first sample:" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)


def test_notebook_loads_the_sft_policy_of_a_finished_run(monkeypatch, tmp_path):
    """The documented path: a workdir whose SFT stage ran under the notebook's config (here
    `configs/maze/tiny.py`, standing in for `cpu_16step.py`) loads without a CheckpointError
    (the notebook used to check every run against `cpu.py`'s SFT fingerprint)."""
    config = "configs/maze/tiny.py"
    study.run(config_files.get_config(os.path.join(util.ROOT, config)), str(tmp_path), "sft",
              ["uniform"], [0])
    monkeypatch.setenv("MAZE_WORKDIR", str(tmp_path))
    monkeypatch.setenv("MAZE_CONFIG", config)
    outputs = util.execute_notebook("maze.ipynb", monkeypatch)
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert f"loaded the SFT policy of {tmp_path}" in text and "first sample:" in text
    assert "no finished comparison" in text  # SFT only: the comparison cell says what to run
