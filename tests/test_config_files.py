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
    config = rl_config.with_method(rl_config.get_config(), name)
    if methods_lib.get_method(name).two_stage:
        with pytest.raises(ValueError, match="in-step pilot"):
            rl_config.validate(config)
        return
    rl_config.validate(config)  # raises ValueError naming a bad field
    assert rl_config.method(config) == methods_lib.get_method(name)  # resolving is idempotent


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config file at"):
        config_files.load_module(tmp_path / "nope.py")
