"""Every config file loads by path; paper configs extend their CPU siblings."""

import glob
import os

import ml_collections
import pytest

from sera_jax import config_files
from sera_jax import methods as methods_lib
from sera_jax.rl import config as rl_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*", "*.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_config_loads(path):
    assert isinstance(config_files.get_config(path), ml_collections.ConfigDict)


def test_paper_configs_extend_their_cpu_sibling():
    paper = config_files.get_config(os.path.join(ROOT, "configs", "maze", "maze17_paper.py"))
    cpu = config_files.get_config(os.path.join(ROOT, "configs", "maze", "cpu.py"))
    assert paper.task.size == 17 and cpu.task.size != 17
    assert sorted(paper.keys()) == sorted(cpu.keys())


@pytest.mark.parametrize("name", sorted(methods_lib.METHODS))
def test_every_method_is_a_valid_trainer_config(name):
    """Every method runs in the LM trainer (two-stage and stateful ones included:
    `sera_jax.rl.collect`); a two-stage method whose pilot does not fit N0 is refused."""
    config = rl_config.for_method(rl_config.get_config(), name)
    preset = methods_lib.get_method(name)
    assert rl_config.validate(config) == preset  # raises ValueError naming a bad field
    if preset.two_stage:  # its pilot is part of the budget B = P·N0
        config.rollouts_per_prompt = config.allocation.n_min = 2
        big = methods_lib.Method(name, preset.label, preset.allocator,
                                 {**preset.options, "pilot": 3})
        config.method = None
        with pytest.raises(ValueError, match=r"rollouts_per_prompt=2 is invalid; allowed: at "
                                             r"least the pilot of method"):
            rl_config.validate(config, big)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config file at"):
        config_files.load_module(tmp_path / "nope.py")


# A config file that cannot be loaded: one error naming the file (and line) and the fix.

_BROKEN = {
    "syntax.py": ("def get_config(:\n    pass\n", r"syntax\.py:1 has a syntax error"),
    "indent.py": ("def get_config():\nreturn 1\n", r"indent\.py:2 has a syntax error"),
    "import.py": ("import ml_collections\nimport no_such_module_xyz\n",
                  r"import\.py:2 failed to load: ModuleNotFoundError"),
    "noget.py": ("X = 1\n", r"noget\.py defines no get_config\(\)"),
    "raises.py": ("def get_config():\n    return 1 / 0\n",
                  r"raises\.py:2: get_config\(\) raised ZeroDivisionError"),
}


@pytest.mark.parametrize("name", sorted(_BROKEN))
def test_a_broken_config_file_is_one_error_naming_file_and_line(tmp_path, name):
    text, match = _BROKEN[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(config_files.ConfigFileError, match=match) as info:
        config_files.get_config(tmp_path / name)
    assert "\n" not in str(info.value) and info.value.__cause__ is None


def test_a_broken_sibling_is_named_not_its_user(tmp_path):
    (tmp_path / "cpu.py").write_text("def get_config(:\n")
    (tmp_path / "paper.py").write_text(
        "from sera_jax import config_files\n"
        "def get_config():\n    return config_files.sibling(__file__, 'cpu.py').get_config()\n")
    with pytest.raises(config_files.ConfigFileError, match=r"cpu\.py:1 has a syntax error"):
        config_files.get_config(tmp_path / "paper.py")


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_config_flag_with_a_missing_or_broken_file_exits_in_one_line(tmp_path, what):
    from sera_jax.studies import common

    path = tmp_path / "nope.py" if what == "missing" else tmp_path
    with pytest.raises(SystemExit) as info:
        common.check_overrides("configs/maze/cpu.py", ["prog", f"--config={path}"])
    message = str(info.value.code)
    assert message.startswith("error: --config: no config file at") and "\n" not in message
    assert "--config=configs/maze/cpu.py" in message  # the fix
    (tmp_path / "bad.py").write_text("def get_config(:\n")
    with pytest.raises(SystemExit, match=r"bad\.py:1 has a syntax error"):
        common.check_overrides(None, ["prog", f"--config={tmp_path / 'bad.py'}"])


def test_binary_with_a_syntax_error_config_prints_one_line(tmp_path):
    import subprocess
    import sys

    (tmp_path / "bad.py").write_text("import ml_collections\ndef get_config(:\n")
    out = subprocess.run([sys.executable, "-m", "experiments.maze", f"--config={tmp_path}/bad.py",
                          f"--workdir={tmp_path}/w"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"error: --config: config file {tmp_path}/bad.py:2 has a syntax "
                               "error") and lines[0].endswith("; fix that line"), lines
