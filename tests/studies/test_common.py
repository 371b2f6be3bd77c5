"""What every study shares: list parsing, workdirs, cached records, the flag parser."""

import os
import subprocess
import sys

import ml_collections
import pytest

from sera_jax.studies import common
from tests import util


def test_lists_and_methods_are_parsed_or_refused_by_name():
    assert common.parse_list("0, 1,2", int, "--seeds") == [0, 1, 2]
    with pytest.raises(common.StudyError, match=r"--seeds='abc': expected a comma-separated"):
        common.parse_list("abc", int, "--seeds")
    with pytest.raises(common.StudyError, match="--seeds is empty"):
        common.parse_list(" , ", int, "--seeds")
    assert common.parse_methods("uniform,sera") == ["uniform", "sera"]
    with pytest.raises(common.StudyError, match="did you mean 'sera'"):
        common.parse_methods("uniform,serra")
    with pytest.raises(common.StudyError, match="twice"):
        common.parse_methods("sera,sera")


def test_workdir_must_be_a_writable_directory(tmp_path):
    assert common.prepare_workdir(tmp_path / "a" / "b") == str(tmp_path / "a" / "b")
    (tmp_path / "f").write_text("")
    with pytest.raises(common.StudyError, match="not a directory"):
        common.prepare_workdir(tmp_path / "f")
    with pytest.raises(common.StudyError, match="cannot create workdir"):
        common.prepare_workdir(tmp_path / "f" / "sub")
    with pytest.raises(common.StudyError, match="--workdir is required"):
        common.prepare_workdir(None)


def test_cached_json_recomputes_when_the_fingerprint_changes(tmp_path):
    path, calls = str(tmp_path / "r.json"), []

    def compute():
        calls.append(1)
        return {"value": len(calls)}

    assert common.cached_json(path, {"a": 1}, compute)["value"] == 1
    assert common.cached_json(path, {"a": (1,)[0]}, compute)["value"] == 1  # cached
    assert common.cached_json(path, {"a": 2}, compute)["value"] == 2  # recomputed


def test_unknown_override_names_the_nearest_key():
    c = ml_collections.ConfigDict({"rl": {"num_steps": 1, "optimizer": {"learning_rate": 1.0}}})
    assert common.unknown_override(["--config.rl.num_steps=3"], c) is None
    msg = common.unknown_override(["--workdir=x", "--config.rl.optimizer.learning_rat=1"], c)
    assert "did you mean --config.rl.optimizer.learning_rate?" in msg


@pytest.mark.parametrize("args, match", [
    (["--seeds=abc"], "--seeds='abc': expected a comma-separated list"),
    (["--methods=sera,nope"], "--methods has 'nope'"),
    (["--stage=eval"], "run --stage=sft first"),
])
def test_maze_binary_refuses_bad_arguments_in_one_line(tmp_path, args, match):
    out = subprocess.run([sys.executable, "-m", "experiments.maze",
                          "--config=configs/maze/tiny.py", f"--workdir={tmp_path}", *args],
                         cwd=util.ROOT, env={**os.environ, "PYTHONPATH": util.ROOT},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert match in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr
