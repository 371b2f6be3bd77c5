"""The allocation demo end to end: the binary on a small batch, and its input checks."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_demo_writes_table_and_plot(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "experiments.allocation_demo", f"--workdir={tmp_path}",
         "--config.rl.prompts_per_step=24", "--config.rl.rollouts_per_prompt=8",
         "--config.rl.allocation.n_max=32", "--config.rows=6"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    png = (tmp_path / "allocation_demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    table = (tmp_path / "allocation_demo.md").read_text()
    assert "| method |" in out.stdout
    # The last line says where the files are (every study binary: `common.outputs_line`).
    assert out.stdout.splitlines()[-1] == (
        f"outputs in {tmp_path}: allocation_demo.md, allocation_demo.png")
    # Per-prompt rows: 6 prompts, sorted by p̂, each with N / κ / w for three allocators.
    rows = [r for r in table.splitlines() if re.match(r"^\| \d+ \|", r)]
    assert len(rows) == 6
    p_hat = [float(eval(r.split("|")[2])) for r in rows]  # "0.41" or "1-1e-06"
    assert p_hat == sorted(p_hat)
    uniform_n = [int(r.split("|")[3]) for r in rows]
    assert uniform_n == [8] * 6
    # Summary: SERA equalised raises the smallest κ over uniform (leximin optimum over a
    # set that contains the uniform allocation), and uses every prompt.
    summary = {r.split("|")[1].strip(): r.split("|")[2:-1] for r in table.splitlines()
               if r.startswith("| uniform |") or r.startswith("| sera")}
    assert set(summary) == {"uniform", "sera", "sera_equalized"}
    min_kappa = {k: float(v[0]) for k, v in summary.items()}
    assert min_kappa["sera_equalized"] >= min_kappa["uniform"]
    assert int(summary["sera_equalized"][4]) == 24 and int(summary["uniform"][4]) == 24
    assert 0 < int(summary["sera"][4]) <= 24
    assert np.isfinite(list(min_kappa.values())).all()


def test_demo_refuses_bad_input_in_one_line(tmp_path):
    for args, match in ((["--config.rl.rollouts_per_prompt=1"], "rl.rollouts_per_prompt"),
                        (["--config.compare.methods=('uniform','serra')"], "did you mean 'sera'"),
                        (["--config.compare.methods=('sera_sequential',)"], "one-shot"),
                        (["--config.rl.prompts_per_step=0"], "rl.prompts_per_step"),
                        (["--config.num_prompts=8"], "no field 'num_prompts'")):
        out = subprocess.run([sys.executable, "-m", "experiments.allocation_demo",
                              f"--workdir={tmp_path}", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 1 and match in out.stderr.splitlines()[-1], out.stderr[-2000:]
        assert "Traceback" not in out.stderr
