"""notebooks/gradient_alignment.ipynb executes top to bottom (tiny settings)."""

import os

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_notebook_executes(monkeypatch):
    monkeypatch.setenv("SERA_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("PYTHONPATH", ROOT)
    nb = nbformat.read(os.path.join(ROOT, "notebooks", "gradient_alignment.ipynb"), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": ROOT}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "min κ: uniform" in text and "done in" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
    assert not any(o.get("output_type") == "error" for o in outputs)
