"""notebooks/math.ipynb executes top to bottom in its smoke setting: the real SmolLM2 start on
two-step arithmetic, the stages sft / rl (uniform, SERA, the null) / eval at toy size, the
format vs correctness table and the pass@k / outcome-class figure."""

import pytest

from tests import util

# Slow: the notebook runs the math study with SmolLM2-135M in a kernel (its pieces are tested
# at tiny size in tests/studies/paired/kinds/test_lm_steps.py); `make test-slow` runs it.
pytestmark = pytest.mark.slow


def test_math_notebook_executes(monkeypatch, tmp_path):
    monkeypatch.setenv("MATH_WORKDIR", str(tmp_path / "math"))
    # One host device in the kernel: the suite's 8 forced CPU devices would each hold a copy
    # of SmolLM2's parameters and optimiser state (the kernel died of memory with them).
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    outputs = util.execute_notebook("math.ipynb", monkeypatch)
    assert not any(o.get("output_type") == "error" for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert "what the start writes" in text and "exploratory" in text.lower()
    assert "format" in text and "correctness" in text  # the outcome decomposition's table
    assert "sera − uniform (test)" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
