"""One gate rule, registered seeds first (issue 49 item 6): when an amendment added null
seeds, the gate is also read on the seeds registered before it, and that result comes first
in the report; the committed arithmetic study is the worked case (2 registered null seeds,
2 added by its 4 Dec amendment)."""

import os

from sera_jax.studies.paired import recompute, tables
from tests import util

ARITH = os.path.join(util.ROOT, "results", "math", "math_smollm2_arith")


def test_arith_gate_on_registered_seeds_fails_and_the_extension_passes():
    table = recompute.recompute(ARITH)["comparison"]
    reg, full = table["gate_registered"], table["gate"]
    assert reg["null_seeds"] == [0, 1] and reg["added_null_seeds"] == [2, 3]
    assert not reg["passes"] and full["passes"]  # the history the docs tell
    assert round(100 * reg["mean"], 2) == 59.73 and round(100 * reg["lo"], 2) == -20.46
    text = "\n".join(tables.curves_markdown(table))
    assert text.index("Registered seeds first") > text.index("**Gate**")
    assert "null seeds 2, 3 (a labelled extension)" in text


def test_no_amendment_no_registered_gate():
    quick = recompute.recompute(os.path.join(util.ROOT, "results", "math",
                                             "math_smollm2_arith_quick"))["comparison"]
    assert "gate_registered" not in quick
