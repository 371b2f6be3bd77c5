"""notebooks/gradient_alignment.ipynb executes top to bottom (tiny settings)."""

import pytest

from tests import util

# Slow: the notebook re-runs its study in a kernel (the study itself is tested end to end in
# the fast suite); `make test-slow` runs it in CI.
pytestmark = pytest.mark.slow


def test_notebook_executes(monkeypatch):
    outputs = util.execute_notebook("gradient_alignment.ipynb", monkeypatch)
    text = "".join(o.get("text", "") for o in outputs)
    assert "min κ: uniform" in text and "done in" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
