"""The maze binary as a user runs it: the smoke config runs every stage of `all` out of the
box as an exploration (every output says so), one more RL run after its SFT, and the refusals
that keep an exploration from passing as a pre-registered result."""

import json
import os
import subprocess
import sys

import pytest

from tests import util

ROOT = util.ROOT


def _maze(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "experiments.maze", *args], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_tiny_runs_every_stage_as_an_exploration_from_the_command_line(tmp_path):
    work = str(tmp_path / "w")
    out = _maze("--config=configs/maze/tiny.py", f"--workdir={work}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exploratory (not pre-registered)" in out.stderr  # the log says so
    table = json.load(open(os.path.join(work, "results", "comparison.json")))
    assert table["exploratory"] is True and table["preregistration"]["exploratory"]
    assert set(table["methods"]) == {"uniform", "sera", "sera_evidence", "null", "aa"}
    md = open(os.path.join(work, "results", "comparison.md")).read()
    assert md.startswith("**Exploratory (not pre-registered)**")
    assert "Primary endpoint** (fixed in the config before the run; exploratory (not " \
           "pre-registered))" in md
    # The docstring's second command: one more run after its SFT, one step.
    out = _maze("--config=configs/maze/tiny.py", f"--workdir={tmp_path / 'w2'}", "--stage=sft")
    assert out.returncode == 0, out.stderr[-3000:]
    out = _maze("--config=configs/maze/tiny.py", f"--workdir={tmp_path / 'w2'}", "--stage=rl",
                "--methods=sera", "--seeds=0", "--config.rl.num_steps=1")
    assert out.returncode == 0, out.stderr[-3000:]
    train = os.path.join(tmp_path, "w2", "rl", "sera", "seed0", "train.jsonl")
    assert [json.loads(line)["step"] for line in open(train)] == [1]
    # An exploration is not exported as a result, and cannot be declared pre-registered.
    for args, match in (
            (["--stage=export"], "exploratory results are not exported"),
            (["--stage=rl", "--config.compare.exploratory=False"], "no pre-registration at"),
            (["--stage=preregister"], "an exploratory config is not pre-registered")):
        out = _maze("--config=configs/maze/tiny.py", f"--workdir={work}", *args, timeout=300)
        assert out.returncode == 1, (args, out.stderr[-2000:])
        assert match in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr


def test_exploratory_false_on_the_smoke_config_is_refused_before_any_work(tmp_path):
    out = _maze("--config=configs/maze/tiny.py", f"--workdir={tmp_path}", "--stage=all",
                "--config.compare.exploratory=False", timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    last = out.stderr.splitlines()[-1]
    assert "no pre-registration at" in last and "results/maze/maze_tiny" in last
    assert not os.path.exists(os.path.join(tmp_path, "sft"))  # nothing half-done


def test_the_default_config_is_the_read_the_maze_default():
    from tests.test_docs import _binary_default

    assert _binary_default("maze") == "configs/maze/cpu_read.py"
    assert _binary_default("math_rl") == "configs/math/smollm2_arith.py"
