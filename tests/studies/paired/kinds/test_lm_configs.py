"""The math configs beside the paired default -- the 2-core `configs/math/cpu.py` and the paper
runs `smollm2_360m_gsm8k.py`, `qwen25_math_1p5b.py`, `qwen3_4b_polaris.py` -- are paired
studies of the math kind: each resolves at full size (validation only: no model or data
loads), keeps its paper settings, is exploratory until pre-registered, and builds at tiny size
(a tiny random LM, 4-problem data files in its format); the GSM8K one runs the paired stages
end to end at tiny size."""

import json
import os

import jax.numpy as jnp
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.paired import config, spec, study, tables
from sera_jax.studies.paired.kinds import lm
from tests import util

PAPER = ("smollm2_360m_gsm8k", "qwen25_math_1p5b", "qwen3_4b_polaris")
CONFIGS = ("cpu",) + PAPER
#: Each config's settings from the spec / its provenance: (field, value).
SETTINGS = {
    "cpu": [("model.source", "embedded"), ("task.templates", "add,mul"),
            ("task.max_new_tokens", 64), ("rl.num_steps", 4), ("rl.prompts_per_step", 4),
            ("rl.rollouts_per_prompt", 4), ("rl.allocation.n_max", 8),
            ("rl.optimizer.learning_rate", 1e-5), ("eval.num_samples", 4)],
    "smollm2_360m_gsm8k": [
        ("task.format", "gsm8k"), ("task.template", "smollm"), ("task.max_new_tokens", 2048),
        ("rl.num_steps", 2000), ("rl.prompts_per_step", 128), ("rl.rollouts_per_prompt", 16),
        ("rl.allocation.n_min", 2), ("rl.allocation.n_max", 64),
        ("rl.optimizer.learning_rate", 1e-5), ("rl.aggregation", "token_mean"),
        ("eval.num_samples", 256), ("eval.temperature", 0.6), ("eval.top_p", 0.95)],
    "qwen25_math_1p5b": [
        ("task.format", "math"), ("task.train_levels", (3, 4, 5)), ("task.train_limit", 8192),
        ("task.template", "qwen"), ("task.max_new_tokens", 3072), ("rl.num_steps", 600),
        ("rl.rollouts_per_prompt", 16), ("rl.allocation.n_max", 64),
        ("rl.optimizer.learning_rate", 1e-6), ("rl.optimizer.grad_clip", 0.3),
        ("rl.mesh.fsdp", 8), ("eval.num_samples", 256)],
    "qwen3_4b_polaris": [
        ("task.format", "math"), ("task.template", "qwen"), ("task.max_new_tokens", 4096),
        ("rl.num_steps", 1000), ("rl.rollouts_per_prompt", 16), ("rl.allocation.n_max", 64),
        ("rl.optimizer.learning_rate", 1e-6), ("rl.mesh.tensor", 4), ("eval.num_samples", 256)],
}


def load(name: str):
    return config_files.get_config(os.path.join(util.ROOT, "configs", "math", f"{name}.py"))


def _get(cfg, field):
    for key in field.split("."):
        cfg = cfg[key]
    return cfg


@pytest.fixture
def no_loading(monkeypatch):
    """Any model, tokenizer or data load fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model, tokenizer or data file was loaded during validation")

    for name in ("load_policy", "load_policy_tokenizer", "task_from_config"):
        monkeypatch.setattr(lm, name, refuse)


@pytest.mark.parametrize("name", CONFIGS)
def test_config_resolves_at_full_size_and_keeps_its_settings(name, no_loading):
    cfg = load(name)
    assert cfg.kind == "math" and cfg.compare.baseline in cfg.compare.methods
    assert [(f, _get(cfg, f)) for f, _ in SETTINGS[name]] == SETTINGS[name]
    # Only the CPU smoke config overrides the validity gate (its start ties the guesser).
    assert cfg.compare.allow_blind_task is (name == "cpu")
    # The user gives the checkpoint and data paths; refused by name before anything loads.
    if name in PAPER:
        with pytest.raises(common.StudyError, match=r"config\.model\.path"):
            config.resolve(cfg, "all")
        cfg.model.path = "/path/to/checkpoint"
        with pytest.raises(common.StudyError, match=r"config\.task\.train_path"):
            config.resolve(cfg, "all")
        cfg.task.train_path = cfg.task.eval_path = "/path/to/data"
    plan = config.resolve(cfg, "all")
    assert plan.exploratory and plan.methods == ["uniform", "sera"]
    assert [arm for arm, _ in plan.runs] == ["uniform", "sera", spec.NULL]
    # Not pre-registered: no pre-registration of an exploratory config, no export ...
    for stage in ("preregister", "export"):
        with pytest.raises(common.StudyError, match="exploratory"):
            config.resolve(cfg, stage)
    # ... but pre-registrable once exploratory is switched off (the primary is set).
    cfg.compare.exploratory = False
    config.resolve(cfg, "preregister")
    assert spec.primary_spec(cfg)["method"] == "sera"
    # The docstring names the binary that runs it.
    doc = config_files.load_module(
        os.path.join(util.ROOT, "configs", "math", f"{name}.py")).__doc__
    assert f"python -m experiments.math_rl --config=configs/math/{name}.py" in doc


# ----------------------------------------------------------------------------- tiny size

_GSM8K = [{"question": f"Tom has {a} apples and buys {b}. How many now?",
           "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
          for a, b in ((3, 4), (5, 2), (6, 6), (1, 8))]
_MATH = [{"problem": f"Compute ${a} \\times {b}$.",
          "solution": f"It is $\\boxed{{{a * b}}}$.", "level": f"Level {lvl}"}
         for a, b, lvl in ((3, 4, 3), (5, 2, 4), (6, 6, 5), (1, 8, 3), (2, 2, 1))]


def _write(path: str, rows: list[dict]) -> str:
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    return util.write_tiny_lm(str(tmp_path_factory.mktemp("tiny_lm")))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """4 problems a split in each config's format (MATH train: 5 rows, one at Level 1, which
    `task.train_levels = (3, 4, 5)` drops)."""
    d = tmp_path_factory.mktemp("math_data")
    return {"gsm8k": (_write(str(d / "gsm8k_train.jsonl"), _GSM8K),
                      _write(str(d / "gsm8k_platinum_test.parquet"), _GSM8K[::-1])),
            "math": (_write(str(d / "math_train.jsonl"), _MATH),
                     _write(str(d / "math500.parquet"), _MATH[:4]))}


def tiny(cfg, policy: str, data: dict):
    """`cfg` at tiny size: the tiny LM, the 4-problem files (generated tasks stay 8 / 8),
    4 prompts x N0 2 for 2 steps on one mesh axis, 4 samples at points 0, 1, 2."""
    cfg.model.source, cfg.model.path = "hf", policy
    if cfg.task.source == "files":
        cfg.task.train_path, cfg.task.eval_path = data[cfg.task.format]
        cfg.task.num_train = cfg.task.num_eval = 4
    cfg.task.max_new_tokens = 4
    cfg.rl.update(num_steps=2, prompts_per_step=4, rollouts_per_prompt=2, micro_batch_size=8,
                  checkpoint_every=2, log_every=1)
    cfg.rl.sampling.batch_size = 8
    cfg.rl.allocation.n_max = 4
    cfg.rl.mesh.update(data=-1, fsdp=1, tensor=1)
    cfg.eval.update(every=1, num_prompts=4, train_prompts=4, num_samples=4, curve_samples=4,
                    batch_size=16)
    cfg.compare.primary.update(k=4, window=1)
    cfg.compare.bootstrap = 200
    cfg.compare.allow_blind_task = True  # a random policy cannot beat the blind guesser
    return cfg


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_at_tiny_size(name, tiny_lm, data_dir):
    cfg = tiny(load(name), tiny_lm, data_dir)
    config.resolve(cfg, "all")
    task = spec.build_task(cfg)
    if cfg.task.source == "arithmetic":
        want = {"train": 8, "eval": 8}
    else:  # the Level 1 row of the MATH file is dropped by levels (3, 4, 5) only
        want = {"train": 5 if cfg.task.format == "math" and not cfg.task.train_levels else 4,
                "eval": 4}
    assert {s: task.split_size(s) for s in ("train", "eval")} == want
    prompt = task.tokenizer.decode(task.prompt_tokens("eval", [0])[0])
    assert prompt.startswith("<|im_start|>user\n") == bool(cfg.task.chat)
    if cfg.task.template == "qwen":
        assert "put your final answer within \\boxed{}" in prompt
    if cfg.task.train_levels:
        assert {p.level for p in task.problems("train")} == set(cfg.task.train_levels)
    model = spec.build_model(cfg)
    assert model.cfg.num_layers == 2 and jnp.dtype(model.cfg.dtype).name == cfg.model.dtype
    sampling = spec.eval_sampling(cfg, task)
    assert (sampling.max_new_tokens, sampling.temperature) == (4, cfg.eval.temperature)


@pytest.mark.slow
def test_gsm8k_config_runs_the_paired_stages_at_tiny_size(tiny_lm, data_dir, tmp_path):
    """sft (the start scored at every point) -> rl (uniform, SERA, the null) -> eval, as an
    exploratory study: the table and its markdown say so, and export refuses it."""
    cfg = tiny(load("smollm2_360m_gsm8k"), tiny_lm, data_dir)
    work = str(tmp_path / "w")
    study.run(cfg, work, "sft")
    study.run(cfg, work, "rl")
    table = study.run(cfg, work, "eval")
    assert table["study"] == "math" and set(table["methods"]) == {"uniform", "sera", "null"}
    assert table["exploratory"] is True and table["curves"]["steps"] == [0, 1, 2]
    assert "exploratory (not pre-registered)" in tables.comparison_markdown(table)
    for arm in ("uniform", "sera", "null"):
        with open(os.path.join(spec.run_dir(work, arm, 0), "train.jsonl")) as f:
            assert [json.loads(line)["rollouts"] for line in f] == [8, 16]  # P x N0 a step
    with pytest.raises(common.StudyError, match="exploratory results are not exported"):
        study.run(cfg, work, "export")
