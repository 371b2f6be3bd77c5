"""notebooks/allocation_lab.ipynb executes top to bottom (tiny settings)."""

import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_notebook_executes(monkeypatch):
    monkeypatch.setenv("SERA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "allocation_lab.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "3 methods × 8 paired seeds done in" in text
    assert "paired Δ vs uniform" in text and "sera_sequential" in text
    assert "rows in final.csv" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "Paired differences vs uniform" in markdown
