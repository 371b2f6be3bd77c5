"""Every config file loads by path; paper configs extend their CPU siblings."""

import glob
import os

import ml_collections
import pytest

from sera_jax import config_files
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
    assert sorted(paper.methods.keys()) == sorted(cpu.methods.keys())


def test_comparison_methods_are_valid_trainer_overrides():
    for overrides in rl_config.comparison_methods().values():
        config = rl_config.get_config()
        config.update_from_flattened_dict(
            {f"allocation.{k}": v for k, v in overrides.get("allocation", {}).items()})
        if "estimator" in overrides:
            config.estimator = overrides.estimator
        rl_config.validate(config)  # raises ValueError naming a bad field


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config file at"):
        config_files.load_module(tmp_path / "nope.py")
