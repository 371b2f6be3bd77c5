"""The maze study end to end on 5x5 mazes with a tiny policy: SFT -> RL (uniform, SERA) ->
eval; resume after a kill; refused resumes; overrides that take effect; the binary's errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from sera_jax import config_files, loop
from sera_jax.checkpoint import CheckpointError
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.records import read_jsonl
from sera_jax.studies import common
from sera_jax.studies import maze as study
from sera_jax.tasks import maze as maze_lib
from tests import util

ROOT = util.ROOT


def load_config(name):
    return config_files.get_config(os.path.join(ROOT, "configs", "maze", f"{name}.py"))


def test_configs_are_consistent():
    paper = load_config("maze17_paper")
    assert paper.task.size == 17 and paper.task.num_train == 7424
    assert (paper.rl.prompts_per_step, paper.rl.rollouts_per_prompt) == (256, 128)
    assert (paper.rl.allocation.n_min, paper.rl.allocation.n_max, paper.rl.num_steps) == (
        2, 512, 3000)
    assert paper.rl.optimizer.learning_rate == 1e-4 and paper.eval.num_samples == 2048
    assert paper.task.max_new_tokens == 180
    model_cfg = get_model_config(paper.model.preset, **dict(paper.model.overrides))
    assert (model_cfg.num_layers, model_cfg.hidden_size, model_cfg.intermediate_size) == (
        4, 256, 1024)
    assert (model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.rope_theta) == (4, 2, 1e6)
    for name in ("cpu", "tiny", "maze17_paper"):
        cfg = load_config(name)
        study.validate(cfg, common.parse_methods(cfg.compare.methods),
                       common.parse_list(cfg.compare.seeds, int))
    cpu = load_config("cpu")
    assert cpu.task.max_new_tokens >= maze_lib.max_answer_length(cpu.task.size)
    assert {"uniform", "sera"} <= set(cpu.compare.methods.split(","))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """SFT, then uniform uninterrupted and SERA killed after step 1 and re-run."""
    cfg = load_config("tiny")
    work = str(tmp_path_factory.mktemp("maze"))
    study.run(cfg, work, "sft", ["uniform", "sera"], [0])
    mesh = study.make_mesh(cfg)
    study.stage_rl(cfg, work, "uniform", 0, mesh)
    study.stage_rl(cfg, work, "sera", 0, mesh, stop_after=1)  # "killed" after step 1
    killed = read_jsonl(os.path.join(study.run_dir(work, "sera", 0), "train.jsonl"))
    study.stage_rl(cfg, work, "sera", 0, mesh)  # the same command again
    table = study.run(cfg, work, "eval", ["uniform", "sera"], [0])
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
        train = read_jsonl(os.path.join(study.run_dir(work, method, 0), "train.jsonl"))
        assert [r["step"] for r in train] == [1, 2, 3]
        assert e["tokens"]["mean"] == sum(r["generated_tokens"] for r in train) > 0
        evals = read_jsonl(os.path.join(study.run_dir(work, method, 0), "eval.jsonl"))
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
    train = read_jsonl(os.path.join(study.run_dir(work, "sera", 0), "train.jsonl"))
    uniform = read_jsonl(os.path.join(study.run_dir(work, "uniform", 0), "train.jsonl"))
    n0 = cfg.rl.rollouts_per_prompt
    a = cfg.rl.allocation
    assert all(r["rollouts_min"] == r["rollouts_max"] == n0 for r in uniform)
    # Epoch 1 (step 1) has no history: SERA gives every (unseen) prompt N0.
    assert train[0]["rollouts_min"] == train[0]["rollouts_max"] == n0
    assert all(a.n_min <= r["rollouts_min"] <= r["rollouts_max"] <= a.n_max for r in train)
    saved = json.load(open(os.path.join(study.run_dir(work, "sera", 0), "config.json")))
    assert saved["rl"]["allocation"]["name"] == "sera" and saved["rl"]["seed"] == 0
    assert saved["rl"]["allocation"]["mode"] == "dynamic" and saved["rl"]["method"] == "sera"
    assert saved["task"]["size"] == cfg.task.size and "sft" in saved and "eval" in saved


@pytest.mark.slow
def test_resume_after_kill_reproduces_the_run(finished, tmp_path):
    cfg, work, _, killed = finished
    assert [r["step"] for r in killed] == [1]
    resumed = read_jsonl(os.path.join(study.run_dir(work, "sera", 0), "train.jsonl"))
    # The uninterrupted SERA run, in a fresh workdir sharing the SFT stage.
    os.symlink(os.path.join(work, "sft"), tmp_path / "sft")
    study.stage_rl(cfg, str(tmp_path), "sera", 0, study.make_mesh(cfg))
    straight = read_jsonl(os.path.join(study.run_dir(str(tmp_path), "sera", 0), "train.jsonl"))
    for a, b in zip(straight, resumed):
        for key in ("reward_mean", "loss", "generated_tokens", "rollouts_max", "grad_norm"):
            assert a[key] == b[key], (a["step"], key)
    ev_a = read_jsonl(os.path.join(study.run_dir(str(tmp_path), "sera", 0), "eval.jsonl"))
    ev_b = read_jsonl(os.path.join(study.run_dir(work, "sera", 0), "eval.jsonl"))
    np.testing.assert_array_equal(ev_a[-1]["num_correct"], ev_b[-1]["num_correct"])


def test_resume_under_another_experiment_is_refused(finished):
    """A changed task seed, evaluation temperature or SFT config is refused by name, and the
    refused run leaves the run's config.json as it was."""
    cfg, work, _, _ = finished
    mesh = study.make_mesh(cfg)
    config_path = os.path.join(study.run_dir(work, "uniform", 0), "config.json")
    saved = open(config_path).read()
    for field, value in (("eval.temperature", 0.5), ("task.seed", 1),
                         ("sft.learning_rate", 1e-3)):
        changed = util.set_field(load_config("tiny"), field, value)
        with pytest.raises(CheckpointError, match=field.replace(".", r"\.")):
            study.stage_rl(changed, work, "uniform", 0, mesh)
        assert open(config_path).read() == saved
    # How long and how often may change: a longer run resumes (and here finishes at once).
    longer = load_config("tiny")
    longer.eval.every = 3
    assert study.stage_rl(longer, work, "uniform", 0, mesh).step == cfg.rl.num_steps


def test_sft_eval_is_recomputed_when_what_it_measures_changes(finished, tmp_path):
    cfg, work, _, _ = finished
    shutil.copytree(os.path.join(work, "sft"), tmp_path / "sft")
    before = json.load(open(os.path.join(work, "sft", "eval.json")))
    assert before["fingerprint"]["sft"]["learning_rate"] == cfg.sft.learning_rate
    again = study.stage_sft(cfg, str(tmp_path), study.make_mesh(cfg))  # cached: same record
    assert again == before
    changed = load_config("tiny")
    changed.eval.seed = cfg.eval.seed + 1
    redone = study.stage_sft(changed, str(tmp_path), study.make_mesh(cfg))
    assert redone["fingerprint"]["eval"]["seed"] == cfg.eval.seed + 1
    # A new SFT model (here: its checkpoints moved away, another learning rate) is evaluated
    # anew, never served the old model's cached numbers.
    other = str(tmp_path / "other")
    os.makedirs(os.path.join(other, "sft"))
    with open(os.path.join(other, "sft", "eval.json"), "w") as f:
        json.dump(before, f)
    changed = load_config("tiny")
    changed.sft.learning_rate = 1e-3
    fresh = study.stage_sft(changed, other, study.make_mesh(cfg))
    assert fresh["fingerprint"]["sft"]["learning_rate"] == 1e-3


def test_override_on_top_of_a_preset_takes_effect(tmp_path):
    """`rl.allocation.mode=equalized` with method sera: saved in config.json and used by the
    allocation (every prompt active); with uniform it is refused before any work."""
    cfg = load_config("tiny")
    cfg.rl.allocation.mode = "equalized"
    cfg.rl.num_steps = 2
    work = str(tmp_path)
    with pytest.raises(common.StudyError, match=r"allocator 'uniform' does not use.*mode"):
        study.run(cfg, work, "all", ["uniform", "sera"], [0])
    assert os.listdir(work) == []  # refused before anything was written
    study.run(cfg, work, "sft", ["sera"], [0])
    study.stage_rl(cfg, work, "sera", 0, study.make_mesh(cfg))
    saved = json.load(open(os.path.join(study.run_dir(work, "sera", 0), "config.json")))
    assert saved["rl"]["allocation"]["mode"] == "equalized"
    train = read_jsonl(os.path.join(study.run_dir(work, "sera", 0), "train.jsonl"))
    assert all(r["active_prompts"] == cfg.rl.prompts_per_step for r in train)
    trainer_method = study.rl_config.method(study.run_config(cfg, "sera", 0))
    assert dict(trainer_method.options)["mode"] == "equalized"


def test_bad_arguments(tmp_path):
    cfg = load_config("tiny")
    with pytest.raises(common.StudyError, match="stage"):
        study.run(cfg, str(tmp_path), "train", ["sera"], [0])
    with pytest.raises(common.StudyError, match="did you mean 'sera'"):
        study.run(cfg, str(tmp_path), "rl", ["serra"], [0])
    for field, value, match in (("rl.optimizer.learning_rate", float("inf"), "learning_rate"),
                                ("rl.optimizer.eps", 0.0, "optimizer.eps"),
                                ("sft.learning_rate", float("nan"), "learning_rate"),
                                ("eval.temperature", -1.0, "eval.temperature"),
                                ("rl.method", "sera", "rl.method"),
                                ("eval.num_prompts", 99, "eval.num_prompts")):
        bad = util.set_field(load_config("tiny"), field, value)
        with pytest.raises(common.StudyError, match=match):
            study.run(bad, str(tmp_path / "x"), "all", ["sera"], [0])
    assert not os.path.exists(tmp_path / "x")  # validated before the workdir is made
    afile = tmp_path / "file"
    afile.write_text("")
    with pytest.raises(common.StudyError, match="not a directory"):
        study.run(cfg, str(afile), "sft", ["sera"], [0])


def _binary(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "experiments.maze", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_binary_names_the_nearest_key_and_fails_in_one_line(tmp_path):
    out = _binary("--config=configs/maze/tiny.py", f"--workdir={tmp_path}",
                  "--config.rl.num_stepz=3")
    assert out.returncode != 0
    assert "no field 'rl.num_stepz'; did you mean --config.rl.num_steps?" in out.stderr
    assert "Traceback" not in out.stderr
    afile = tmp_path / "f"
    afile.write_text("")
    out = _binary("--config=configs/maze/tiny.py", f"--workdir={afile}")
    assert out.returncode == 1 and "not a directory" in out.stderr.splitlines()[-1]
    assert "Traceback" not in out.stderr
    assert common.unknown_override(["--config.rl.allocation.mode=x"], load_config("tiny")) is None


def test_lr_1e20_stops_nonzero_and_keeps_the_last_finite_checkpoint(finished, tmp_path):
    cfg, work, _, _ = finished
    os.symlink(os.path.join(work, "sft"), tmp_path / "sft")
    bad = load_config("tiny")
    bad.rl.optimizer.learning_rate = 1e20
    bad.rl.num_steps = 6
    with pytest.raises(loop.NonFiniteError, match="was not applied") as err:
        study.stage_rl(bad, str(tmp_path), "uniform", 0, study.make_mesh(bad))
    run_dir = study.run_dir(str(tmp_path), "uniform", 0)
    from sera_jax.checkpoint import Checkpointer

    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        last = ckpt.latest_step()
        assert os.path.join(ckpt.directory, str(last)) in str(err.value)
    records = read_jsonl(os.path.join(run_dir, "train.jsonl"))
    assert [r["step"] for r in records] == list(range(1, last + 1))
    assert all(r["finite"] == 1.0 for r in records)


@pytest.mark.slow
def test_two_process_maze_binary_initialises_jax_distributed(tmp_path):
    """Two CPU processes run the maze binary's SFT stage as one JAX job."""
    args = [sys.executable, "-m", "experiments.maze", "--config=configs/maze/tiny.py",
            f"--workdir={tmp_path}", "--stage=sft", "--config.rl.multihost.enabled=True",
            "--config.rl.multihost.num_processes=2",
            f"--config.rl.multihost.coordinator_address=127.0.0.1:{util.free_port()}"]
    outputs = util.launch([args + [f"--config.rl.multihost.process_id={i}"] for i in range(2)],
                          util.cpu_job_env(), timeout=400)
    for i, out in enumerate(outputs):
        assert f"JAX process {i} of 2" in out, out[-2000:]
    assert os.path.exists(tmp_path / "sft" / "eval.json")
    assert len(read_jsonl(str(tmp_path / "sft" / "train.jsonl"))) == 3  # written once
