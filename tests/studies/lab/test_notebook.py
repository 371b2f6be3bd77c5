"""notebooks/allocation_lab.ipynb executes top to bottom (tiny settings)."""

from tests import util


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
