"""notebooks/maze.ipynb executes top to bottom (without a finished run it trains a tiny
policy and skips the comparison plot)."""

import pytest

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
