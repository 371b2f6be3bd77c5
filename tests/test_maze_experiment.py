"""End-to-end maze experiment on 5x5 mazes with a tiny policy: SFT -> RL (uniform, SERA)
-> eval; files written; killing mid-RL and re-running continues the run exactly."""

import json
import os

import numpy as np
import pytest

from experiments import maze as exp
from sera_jax import config_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name):
    return config_files.get_config(os.path.join(ROOT, "configs", "maze", f"{name}.py"))


def test_configs_are_consistent():
    paper = load_config("maze17_paper")
    assert paper.task.size == 17 and paper.task.num_train == 7424
    assert (paper.rl.prompts_per_step, paper.rl.rollouts_per_prompt) == (256, 128)
    assert (paper.rl.n_min, paper.rl.n_max, paper.rl.num_steps) == (2, 512, 3000)
    assert paper.rl.optimizer.learning_rate == 1e-4 and paper.eval.num_samples == 2048
    assert paper.task.max_new_tokens == 180
    model_cfg = exp.get_model_config(paper.model.preset, **dict(paper.model.overrides))
    assert (model_cfg.num_layers, model_cfg.hidden_size, model_cfg.intermediate_size) == (
        4, 256, 1024)
    assert (model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.rope_theta) == (4, 2, 1e6)
    cpu = load_config("cpu")
    assert cpu.task.max_new_tokens >= exp.maze_lib.max_answer_length(cpu.task.size)
    assert len(cpu.compare.seeds.split(",")) >= 3
    assert {"uniform", "sera"} <= set(cpu.compare.methods.split(","))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """SFT, then uniform uninterrupted and SERA killed after step 1 and re-run."""
    cfg = load_config("tiny")
    work = str(tmp_path_factory.mktemp("maze"))
    exp.run_stage(cfg, work, "sft", ["uniform", "sera"], [0])
    mesh = exp.make_mesh(cfg)
    exp.stage_rl(cfg, work, "uniform", 0, mesh)
    exp.stage_rl(cfg, work, "sera", 0, mesh, stop_after=1)  # "killed" after step 1
    killed = exp.read_jsonl(os.path.join(exp.run_dir(work, "sera", 0), "train.jsonl"))
    exp.stage_rl(cfg, work, "sera", 0, mesh)  # the same command again
    table = exp.run_stage(cfg, work, "eval", ["uniform", "sera"], [0])
    return cfg, work, table, killed


def test_files_and_matched_budgets(finished):
    cfg, work, table, _ = finished
    for name in ("comparison.md", "comparison.json", "pass_at_k.png", "training_curves.png",
                 "sft_pass1_hist.png"):
        assert os.path.getsize(os.path.join(work, "results", name)) > 0
    budget = cfg.rl.prompts_per_step * cfg.rl.rollouts_per_prompt
    for method in ("uniform", "sera"):
        e = table["methods"][method]
        assert e["rollouts"]["mean"] == cfg.rl.num_steps * budget  # matched generated rollouts
        train = exp.read_jsonl(os.path.join(exp.run_dir(work, method, 0), "train.jsonl"))
        assert [r["step"] for r in train] == [1, 2, 3]
        assert e["tokens"]["mean"] == sum(r["generated_tokens"] for r in train) > 0
        evals = exp.read_jsonl(os.path.join(exp.run_dir(work, method, 0), "eval.jsonl"))
        assert [r["step"] for r in evals] == [0, 2, 3]
        assert list(evals[-1]["pass_at_k"]) == ["1", "2", "4", "8"]
        values = list(evals[-1]["pass_at_k"].values())
        assert values == sorted(values)  # pass@k is nondecreasing in k
    sft_eval = json.load(open(os.path.join(work, "sft", "eval.json")))
    assert sum(sft_eval["pass1_distribution"]["histogram"].values()) == cfg.eval.num_prompts
    md = open(os.path.join(work, "results", "comparison.md")).read()
    assert "| sera | 1 |" in md and "| uniform | 1 |" in md and "pass@8" in md


def test_allocations_respect_the_config(finished):
    cfg, work, _, _ = finished
    train = exp.read_jsonl(os.path.join(exp.run_dir(work, "sera", 0), "train.jsonl"))
    uniform = exp.read_jsonl(os.path.join(exp.run_dir(work, "uniform", 0), "train.jsonl"))
    n0 = cfg.rl.rollouts_per_prompt
    assert all(r["rollouts_min"] == r["rollouts_max"] == n0 for r in uniform)
    # Epoch 1 (step 1) has no history: SERA gives every (unseen) prompt N0.
    assert train[0]["rollouts_min"] == train[0]["rollouts_max"] == n0
    assert all(cfg.rl.n_min <= r["rollouts_min"] <= r["rollouts_max"] <= cfg.rl.n_max
               for r in train)
    saved = json.load(open(os.path.join(exp.run_dir(work, "sera", 0), "config.json")))
    assert saved["allocation"]["name"] == "sera" and saved["seed"] == 0


@pytest.mark.slow
def test_resume_after_kill_reproduces_the_run(finished, tmp_path):
    cfg, work, _, killed = finished
    assert [r["step"] for r in killed] == [1]
    resumed = exp.read_jsonl(os.path.join(exp.run_dir(work, "sera", 0), "train.jsonl"))
    # The uninterrupted SERA run, in a fresh workdir sharing the SFT stage.
    os.symlink(os.path.join(work, "sft"), tmp_path / "sft")
    exp.stage_rl(cfg, str(tmp_path), "sera", 0, exp.make_mesh(cfg))
    straight = exp.read_jsonl(os.path.join(exp.run_dir(str(tmp_path), "sera", 0),
                                           "train.jsonl"))
    for a, b in zip(straight, resumed):
        for key in ("reward_mean", "loss", "generated_tokens", "rollouts_max", "grad_norm"):
            assert a[key] == b[key], (a["step"], key)
    ev_a = exp.read_jsonl(os.path.join(exp.run_dir(str(tmp_path), "sera", 0), "eval.jsonl"))
    ev_b = exp.read_jsonl(os.path.join(exp.run_dir(work, "sera", 0), "eval.jsonl"))
    np.testing.assert_array_equal(ev_a[-1]["num_correct"], ev_b[-1]["num_correct"])


def test_bad_arguments():
    cfg = load_config("tiny")
    with pytest.raises(ValueError, match="stage"):
        exp.run_stage(cfg, "/tmp/unused", "train", ["sera"], [0])
    with pytest.raises(ValueError, match="methods contains"):
        exp.run_stage(cfg, "/tmp/unused", "rl", ["nope"], [0])
