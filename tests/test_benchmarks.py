"""The benchmark scripts run end to end at a tiny size (their numbers are not checked here:
speed is measured by running them, see docs/results_allocation.md, docs/results_speed.md)."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# In the fast suite (one 256-prompt batch: compiles the allocator, ~10 s of one worker).
def test_allocation_bench_runs_and_matches_numpy():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "allocation_bench.py"), "--sizes", "256",
         "--reps", "1", "--numpy_budget_s", "1"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 256 |")]
    assert len(rows) == 2, out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[9] == "yes", row  # leximin objective >= NumPy's on one active set


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def plain_cpu_env() -> dict[str, str]:
    """This environment without the tests' 8 fake CPU devices: the benchmark as it is run."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "xla_force_host_platform_device_count" not in f)
    return env


#: rl_step_bench's default variants and the suffix of their table rows (the paired test
#: below runs the `shared` one).
VARIANTS = {"plain": "", "packed_shared": " (packed_shared)"}


@pytest.fixture(scope="module")
def rl_step_report(tmp_path_factory) -> tuple[str, str]:
    """(stdout, markdown report) of `rl_step_bench.py --smoke` on one plain CPU device."""
    out = tmp_path_factory.mktemp("rl_step") / "report.md"
    env = plain_cpu_env()
    stdout = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rl_step_bench.py"), "--smoke",
         f"--out={out}"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=900, env=env,
    ).stdout
    return stdout, out.read_text()


def _section_rows(report: str, side: str) -> dict[str, list[str]]:
    """{task: cells of the `side` row} over the report's task sections."""
    rows, task = {}, None
    for line in report.splitlines():
        if line.startswith("### "):
            task = line[4:].split(":")[0]
        elif line.startswith(f"| {side} |"):
            rows[task] = _cells(line)
    return rows


# Slow: a benchmark script end to end (minutes of compiles); `make test-slow` runs it in CI.
@pytest.mark.slow
def test_rl_step_bench_jax_side(rl_step_report):
    """The sera_jax side (Trainer.step, uniform and SERA) runs on both tasks and reports
    positive times and a breakdown; torch or not."""
    stdout, report = rl_step_report
    expected = {"maze", "math"}
    if "math skipped" in report:  # no embedded SmolLM2 GGUF (its tokenizer)
        expected.discard("math")
    for side in (f"sera_jax {m}{v}" for m in ("uniform", "sera") for v in VARIANTS.values()):
        rows = _section_rows(report, side)
        assert set(rows) == expected, report
        for cells in rows.values():
            assert float(cells[1]) > 0 and float(cells[3]) > 0, cells  # step, first step
            assert float(cells[6].split()[0]) > 0 and float(cells[8].split()[0]) > 0, cells
    assert "Scoring vs sampling" in report


@pytest.mark.slow
def test_rl_step_bench_torch_side(request):
    """The PyTorch step runs next to it, with the same model (log-probs agree)."""
    pytest.importorskip("torch", reason="torch is not installed: the PyTorch side of "
                        "rl_step_bench is skipped (install it with `make hf-deps`)")
    pytest.importorskip("transformers", reason="transformers is not installed (make hf-deps)")
    # Requested after the skips: without torch this test costs nothing, not a smoke run.
    stdout, report = request.getfixturevalue("rl_step_report")
    rows = _section_rows(report, "PyTorch uniform")
    assert "maze" in rows, report
    for suffix in VARIANTS.values():
        assert set(_section_rows(report, f"PyTorch uniform{suffix}")) == set(rows), report
    # The sera_jax rows are compared with the PyTorch step of their variant:
    # "<wall>x / <cpu>x", both > 0; live / trained rows are percentages.
    for side in (f"sera_jax uniform{suffix}" for suffix in VARIANTS.values()):
        for workload, cells in _section_rows(report, side).items():
            ratios = re.fullmatch(r"([0-9.]+)x / ([0-9.]+)x", cells[-1])
            assert ratios and min(map(float, ratios.groups())) > 0, (workload, report)
            assert all(0 <= float(c.rstrip("%")) <= 100 for c in cells[10:12]), cells
    assert "x PyTorch uniform (packed_shared) (wall)" in report
    # Both train phases on one identical batch, every row live: positive CPU seconds.
    same = re.findall(r"sera_jax ([0-9.]+) CPU-s, PyTorch ([0-9.]+) CPU-s", report)
    assert len(same) == len(rows) and all(float(x) > 0 for pair in same for x in pair), report
    diffs = re.findall(r"max \|diff\| ([0-9.e+-]+)\.", report)
    assert len(diffs) == len(rows) and all(float(d) < 1e-4 for d in diffs), report


@pytest.mark.slow
def test_rl_step_bench_isolated_sides_merge_into_one_table(tmp_path):
    """--isolate_sides: each framework in its own process, one merged table in which every
    sera_jax row has its speed-up against the PyTorch row of its variant."""
    pytest.importorskip("torch", reason="torch is not installed (make hf-deps)")
    pytest.importorskip("transformers", reason="transformers is not installed (make hf-deps)")
    out = tmp_path / "report.md"
    env = plain_cpu_env()
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rl_step_bench.py"), "--smoke",
                    "--isolate_sides", "--tasks=maze", "--methods=uniform", f"--out={out}"],
                   capture_output=True, text=True, check=True, cwd=ROOT, timeout=600, env=env)
    report = out.read_text()
    assert "each framework in its own process" in report
    for side in ("sera_jax uniform", "sera_jax uniform (packed_shared)"):  # the defaults
        (task, cells), = _section_rows(report, side).items()
        assert task.startswith("maze"), report
        ratios = re.fullmatch(r"([0-9.]+)x / ([0-9.]+)x", cells[-1])
        assert ratios and min(map(float, ratios.groups())) > 0, report
    assert _section_rows(report, "PyTorch uniform (packed_shared)"), report
    assert "x PyTorch uniform (packed_shared) (wall)" in report


@pytest.mark.slow
def test_rl_step_bench_paired_rollouts_give_both_sides_the_same_batch(tmp_path):
    """--pair_rollouts runs in one process and with each framework in its own (the
    rollouts handed over in a file): the PyTorch side's step k takes the sera_jax uniform
    side's step-k rollouts (the script asserts their prompt ids match its own data order)
    and reports their live / trained rows. At smoke size the random policy has no live row,
    so the equal-rows assertion is only a plumbing check here; the measured runs in
    docs/results_speed.md show equal non-zero rows (maze 66 %, math 25 % in the 4 Dec run)."""
    pytest.importorskip("torch", reason="torch is not installed (make hf-deps)")
    pytest.importorskip("transformers", reason="transformers is not installed (make hf-deps)")
    out = tmp_path / "report.md"
    env = plain_cpu_env()
    cmd = [sys.executable, str(ROOT / "benchmarks" / "rl_step_bench.py"), "--smoke",
           "--tasks=maze", "--methods=uniform", "--variants=plain,shared", "--pair_rollouts"]
    for extra in ([], ["--isolate_sides"]):
        subprocess.run(cmd + extra + [f"--out={out}"], capture_output=True, text=True,
                       check=True, cwd=ROOT, timeout=600, env=env)
        report = out.read_text()
        assert "(--pair_rollouts)" in report
        for suffix in ("", " (shared)"):
            (ours,), (theirs,) = (_section_rows(report, f"{side}{suffix}").values()
                                  for side in ("sera_jax uniform", "PyTorch uniform"))
            assert ours[10:12] == theirs[10:12], report  # live rows, trained rows
        if not extra:  # equal work in one process: strided and contiguous micro-batches
            assert len(re.findall(r"sera_jax [0-9.]+ CPU-s, PyTorch [0-9.]+ CPU-s", report)) \
                == 2, report
    refused = subprocess.run(cmd + ["--methods=sera"], capture_output=True, text=True,
                             cwd=ROOT, timeout=600, env=env)
    assert refused.returncode != 0 and "--pair_rollouts" in refused.stderr


#: Every part of benchmarks/accelerator_check.py, in table order.
ACCELERATOR_PARTS = ("device", "sampler_smollm2", "train_smollm2", "attention",
                     "sampler_qwen25", "train_qwen25", "maze")


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_accelerator_check_smoke_has_every_row_with_finite_numbers(tmp_path):
    report_path = tmp_path / "accelerator_check.json"
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "accelerator_check.py"), "--smoke",
         f"--json_out={report_path}"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=900,
    ).stdout
    assert "device: cpu" in out and ", jax " in out, out
    header = ["part", "model", "shape", "dtype", "mesh", "time (s)", "compile (s)", "tokens/s",
              "TFLOP/s", "MFU (spec peak)", "% of measured matmul peak", "status / notes"]
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    assert [c.strip() for c in lines[0].strip("|").split("|")] == header, out
    rows = {cells[0]: dict(zip(header, cells)) for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}
    assert list(rows) == list(ACCELERATOR_PARTS), out
    for part, row in rows.items():
        assert row["status / notes"].startswith("ok"), row
        numeric = ["time (s)"] + (["tokens/s"] if part != "device" else []) + (
            ["TFLOP/s", "% of measured matmul peak"] if part != "maze" else [])
        for column in numeric:
            value = _number(row[column])
            assert math.isfinite(value) and value > 0, (part, column, row)
        assert row["MFU (spec peak)"] == "–"  # no peak-table entry for a CPU
    report = json.loads(report_path.read_text())
    assert [r["part"] for r in report["parts"]] == list(ACCELERATOR_PARTS)
    for r in report["parts"]:
        assert r["status"] == "ok" and math.isfinite(r["time_s"]), r


def _bench(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args],
                          capture_output=True, text=True, check=True, cwd=ROOT,
                          timeout=600).stdout


@pytest.mark.slow
def test_precision_bench_runs():
    out = _bench("precision_bench.py", "--small", "--batch=8", "--prompt_len=10",
                 "--new_tokens=4", "--train_rows=8", "--repeats=1")  # 8 test devices
    assert "| bfloat16 / bfloat16 |" in out and "state dtypes ['float32']" in out, out


def test_checkpoint_bench_runs():
    out = _bench("checkpoint_bench.py", "--scale=0.01", "--repeats=1")
    assert "| sync |" in out and "| async |" in out, out


@pytest.mark.slow
def test_decoder_compile_bench_smoke():
    """Unrolled vs scanned layers at smoke size: every program compiles and runs in both
    layouts and the layouts agree (the `check` column)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decoder_compile_bench.py"), "--small"],
        capture_output=True, text=True, check=True, cwd=ROOT, timeout=600,
    ).stdout
    assert "load average" in out, out
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("| program"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    assert set(rows) == {"forward", "train step", "decode step", "sampler", "all four"}, out
    for name in ("forward", "train step", "decode step"):
        assert rows[name][7].startswith("max rel diff") and "TOO LARGE" not in rows[name][7]
    assert rows["sampler"][7] == "same tokens", rows["sampler"]
    for cells in rows.values():
        assert float(cells[1].split()[0]) > 0 and float(cells[2].split()[0]) > 0  # compile s


def test_adamw_update_bench_runs():
    """Both updates on small leaves: positive times and a speed-up cell for each row."""
    out = _bench("adamw_update_bench.py", "--elements=4096", "--repeats=1")
    rows = [line for line in out.splitlines() if line.startswith("| optax")
            or line.startswith("| trainer.fused")]
    assert len(rows) == 2, out
    for row in rows:
        cells = _cells(row)
        assert float(cells[1]) > 0 and cells[3].endswith("x"), row


@pytest.mark.slow
def test_smollm2_decode_bench_smoke():
    """The three token draws of the decode benchmark at smoke size (the random maze
    policy): fast == reference tokens, a row each with a number (not checked: at this size
    the decode is a difference of two tiny times) and a speed-up cell."""
    out = _bench("smollm2_decode_bench.py", "--model=maze", "--batch=4", "--prompt_len=8",
                 "--new_tokens=4", "--repeats=1")
    assert "fast and reference draw the same tokens: True" in out, out
    rows = [line for line in out.splitlines()
            if line.startswith(("| reference", "| fast", "| inverse_cdf"))]
    assert len(rows) == 3, out
    for row in rows:
        assert math.isfinite(float(_cells(row)[3])) and _cells(row)[5].endswith("x"), row
