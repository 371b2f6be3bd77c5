"""notebooks/gradient_alignment.ipynb executes top to bottom (tiny settings)."""

from tests import util


def test_notebook_executes(monkeypatch):
    outputs = util.execute_notebook("gradient_alignment.ipynb", monkeypatch)
    text = "".join(o.get("text", "") for o in outputs)
    assert "min κ: uniform" in text and "done in" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
