"""What every study shares: list parsing, workdirs, cached records, the flag parser."""

import os
import subprocess
import sys

import ml_collections
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from tests import util


def test_lists_and_methods_are_parsed_or_refused_by_name():
    assert common.int_list(["0", "2"], "--seeds") == [0, 2]  # absl DEFINE_list strings
    with pytest.raises(common.StudyError, match=r"--seeds='0,x': expected a comma-separated"):
        common.int_list(["0", "x"], "--seeds")
    with pytest.raises(common.StudyError, match=r"compare.seeds='0,1' is a string; write a tuple"):
        common.int_list("0,1", "compare.seeds")
    assert common.method_names(("uniform", "sera"), "compare.methods") == ["uniform", "sera"]
    with pytest.raises(common.StudyError, match="did you mean 'sera'"):
        common.method_names(("uniform", "serra"), "compare.methods")
    with pytest.raises(common.StudyError, match="twice"):
        common.method_names(("sera", "sera"), "compare.methods")
    with pytest.raises(common.StudyError, match="is a string; write a tuple"):
        common.method_names("uniform,sera", "compare.methods")
    # An old method name names its new home, not a misleading nearest name.
    with pytest.raises(common.StudyError, match="'sera_dynamic' was renamed 'sera'; use 'sera'"):
        common.method_names(("sera_dynamic",), "compare.methods")
    with pytest.raises(common.StudyError, match=r"config.x=0 is invalid; allowed: >= 1"):
        common.check(common.positive_int(0), "x", 0, ">= 1")


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


def test_a_moved_field_names_its_new_home():
    """A field under its old block is suggested where its name now lives, not the nearest
    spelling: difflib alone said nothing for `rl.n_max`, `rl.sampling` for `rl.n_min` and
    `sft.learning_rate` for `rl.learning_rate`."""
    c = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "cpu.py"))
    for old, new in (("rl.n_max", "rl.allocation.n_max"), ("rl.n_min", "rl.allocation.n_min"),
                     ("rl.threshold", "rl.allocation.threshold"),
                     ("rl.learning_rate", "rl.optimizer.learning_rate"),
                     ("rl.eps", "rl.optimizer.eps")):
        assert common.unknown_override([f"--config.{old}=1"], c) == (
            f"--config.{old}: the config has no field {old!r}; did you mean --config.{new}?")
    # No block in common: every field of that name (in `config_keys` order), at most three.
    msg = common.unknown_override(["--config.learning_rate=1"], c)
    assert msg.endswith("did you mean --config.rl.optimizer.learning_rate or "
                        "--config.sft.learning_rate?"), msg
    # A misspelt name still gets the nearest spelling.
    assert common.unknown_override(["--config.rl.allocation.nmax=3"], c).endswith(
        "did you mean --config.rl.allocation.n_max?")


@pytest.mark.parametrize("args, match", [
    (["--seeds=abc"], "--seeds='abc': expected a comma-separated list"),
    (["--methods=sera,nope"], "--methods: unknown method 'nope'"),
    (["--stage=eval"], "run --stage=sft first"),
])
def test_maze_binary_refuses_bad_arguments_in_one_line(tmp_path, args, match):
    out = subprocess.run([sys.executable, "-m", "experiments.maze",
                          "--config=configs/maze/tiny.py", f"--workdir={tmp_path}", *args],
                         cwd=util.ROOT, env={**os.environ, "PYTHONPATH": util.ROOT},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    assert match in out.stderr.splitlines()[-1] and "Traceback" not in out.stderr


def test_compilation_cache_keeps_a_directory_the_user_set(tmp_path):
    """A binary persists its compiles under <workdir>/.jax_cache unless a cache directory is
    already set (JAX_COMPILATION_CACHE_DIR: the suite's per-session cache), which it keeps."""
    import jax

    before = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
        common.enable_compilation_cache(str(tmp_path / "w"))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
        jax.config.update("jax_compilation_cache_dir", None)
        common.enable_compilation_cache(str(tmp_path / "w"))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "w" / ".jax_cache")
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
