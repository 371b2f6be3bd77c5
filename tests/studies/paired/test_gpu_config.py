"""The GPU maze study config (`configs/maze/gpu17.py`): valid at full size, and its
CPU-sized twin runs end to end on the study's code path, summarised as the device command
summarises it (blind control beside the start)."""

import importlib.util
import json
import os

import pytest

from sera_jax import config_files
from sera_jax.studies.paired import config, prereg, spec, study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _summary_module():
    path = os.path.join(ROOT, "benchmarks", "device_maze_summary.py")
    spec = importlib.util.spec_from_file_location("device_maze_summary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu17_is_the_paper_shape_and_valid():
    cfg = config_files.get_config(os.path.join(ROOT, "configs/maze/gpu17.py"))
    assert cfg.task.size == 17 and cfg.model.preset == "maze_policy"
    assert not dict(cfg.model.overrides).keys() - {"attention_impl"}  # 4 layers x 256
    config.validate(cfg, list(cfg.compare.methods), list(cfg.compare.seeds))
    assert [arm for arm, _ in spec.rl_plan(cfg, list(cfg.compare.methods),
                                            list(cfg.compare.seeds), False)] == [
        "uniform", "sera", "null"]


def test_gpu17_tiny_runs_end_to_end_with_the_blind_control(tmp_path):
    path = os.path.join(ROOT, "configs/maze/gpu17_tiny.py")
    cfg = config_files.get_config(path)
    assert cfg.model.overrides.attention_impl == "dot_product"  # the option on the CPU path
    committed = prereg.preregistration_path(cfg)
    assert os.path.exists(committed)  # the device rehearsal's run needs it
    cfg.compare.preregistration = str(tmp_path / "prereg.json")
    study.run(cfg, str(tmp_path), "preregister")
    with open(committed) as a, open(tmp_path / "prereg.json") as b:
        # The committed file is this config's (what it registers; not the day it was written).
        assert prereg.registered(json.load(a)) == prereg.registered(json.load(b))
    table = study.run(cfg, str(tmp_path), "all")
    assert set(table["methods"]) >= {"uniform", "sera"}
    summary = _summary_module().summarise(path, str(tmp_path))
    assert summary["missing"] == []
    assert set(summary["runs"]) == {"uniform/seed0", "sera/seed0", "null/seed0"}
    assert all(r["steps_done"] == cfg.rl.num_steps for r in summary["runs"].values())
    blind = summary["blind"]["blind_pass_at_k"]
    assert set(blind) == set(summary["start"]["pass_at_k"])
    assert 0.0 <= blind["1"] <= blind["8"] <= 1.0
    assert summary["comparison"]["primary"]["preregistered"] is True


@pytest.mark.parametrize("name", ["gpu17.py", "gpu17_tiny.py"])
def test_gpu_configs_load_without_jax_side_effects(name):
    cfg = config_files.get_config(os.path.join(ROOT, "configs/maze", name))
    assert cfg.name.startswith("maze17_gpu")
