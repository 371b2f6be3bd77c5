"""notebooks/allocation_lab.ipynb executes top to bottom (tiny settings)."""

import pytest

from tests import util

# Slow: the notebook re-runs its study in a kernel (the study itself is tested end to end in
# the fast suite); `make test-slow` runs it in CI.
pytestmark = pytest.mark.slow


def test_notebook_executes(monkeypatch):
    outputs = util.execute_notebook("allocation_lab.ipynb", monkeypatch)
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "3 methods × 8 paired seeds done in" in text
    assert "paired Δ vs uniform" in text and "sera_sequential" in text
    assert "rows in final.csv" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "Paired differences vs uniform" in markdown
