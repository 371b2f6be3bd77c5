"""The gradient-alignment study end to end: digits measure (the binary) and train modes, and
the ImageNet/ResNet config on tfds mock data with a tiny ResNet."""

import csv
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from sera_jax import config_files, optim
from sera_jax.studies import common
from sera_jax.studies.alignment import study
from tests import util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _config(name):
    return config_files.get_config(os.path.join(ROOT, "configs", "gradient_alignment",
                                                f"{name}.py"))


def _flat_keys(c, prefix=""):
    out = set()
    for k, v in c.items():
        out |= _flat_keys(v, f"{prefix}{k}.") if hasattr(v, "items") else {prefix + k}
    return out


def test_configs_share_every_field():
    digits, imagenet = _config("digits"), _config("imagenet_resnet50")
    data = {k for k in _flat_keys(imagenet) if k.startswith("data.")}
    assert _flat_keys(digits) - {k for k in _flat_keys(digits) if k.startswith(
        ("data.", "model."))} == _flat_keys(imagenet) - data - {
            k for k in _flat_keys(imagenet) if k.startswith("model.")}
    assert imagenet.rl.rollouts_per_prompt == 128 and imagenet.rl.allocation.n_max == 512
    assert imagenet.rl.prompts_per_step == 256 and imagenet.rl.allocation.threshold == 0.05
    for c in (digits, imagenet):  # the one optimiser block, every field spelt out
        assert set(c.sft.optimizer) == set(c.rl.optimizer) == set(optim.DEFAULTS)


@pytest.mark.slow  # the binary end to end (the study itself is tested above)
def test_digits_measure_binary_writes_outputs(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "gradient_alignment.py"),
           f"--config={os.path.join(ROOT, 'configs/gradient_alignment/digits.py')}",
           f"--workdir={tmp_path}", "--config.measure.budgets=(2,4)",
           "--config.compare.methods=('uniform','sera')",
           "--config.measure.num_draws=2", "--config.measure.stage_steps=(0,2)",
           "--config.measure.stage_names=('init','two')", "--config.measure.prompts_per_step=16",
           "--config.sft.batch_size=16", "--config.model.width=4",
           "--config.model.stage_sizes=(1,)", "--config.measure.unroll=2",
           "--config.measure.cot_chunk=4"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SERA (dynamic) vs uniform" in out.stdout
    assert out.stdout.splitlines()[-1] == (
        f"outputs in {tmp_path}: alignment.csv, alignment.png, summary.md, tensorboard/, "
        "units/")
    with open(tmp_path / "alignment.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2 * 2  # stages x budgets x allocators x draws
    assert set(study.CSV_COLUMNS) <= set(rows[0])
    assert all(-1 <= float(r["cosine"]) <= 1 and float(r["norm_ratio"]) > 0 for r in rows)
    # n_min = 2 at N0 = 2 leaves no freedom (unless the dynamic mode drops images): SERA
    # then equals uniform draw by draw, because the draws are paired (same keys).
    at2 = {(r["stage"], r["draw"], r["method"]): r for r in rows if r["budget"] == "2"}
    for (s, d, _), r in at2.items():
        if float(r["active_frac"]) == 1.0:
            assert r["cosine"] == at2[(s, d, "uniform")]["cosine"]
    assert (tmp_path / "alignment.png").stat().st_size > 10_000
    assert any(n.startswith("events") for n in os.listdir(tmp_path / "tensorboard"))
    assert "[4/4] stage 'two' N0=4" in out.stderr  # the periodic progress line


def _tiny_measure():
    c = _config("digits")
    c.sft.batch_size = c.measure.prompts_per_step = 16
    c.model.width, c.model.stage_sizes = 4, (1,)
    c.measure.stage_steps, c.measure.stage_names = (0, 2), ("init", "two")
    c.measure.budgets, c.compare.methods = (2, 4), ("uniform", "sera")
    c.measure.num_draws, c.measure.unroll, c.measure.cot_chunk = 2, 2, 4
    return c


def test_measure_resumes_unit_by_unit_and_refuses_another_measurement(tmp_path, monkeypatch):
    """A re-run reuses every stored (stage, budget) unit -- with all stored it trains and
    measures nothing -- a lost unit is recomputed bit for bit, a new budget is measured
    alone, and a changed measurement in the same workdir is refused."""
    from sera_jax.checkpoint import CheckpointError

    c, work = _tiny_measure(), str(tmp_path / "m")
    first = study.run(c, work)
    assert first["reused"] == 0
    units = sorted(os.listdir(os.path.join(work, "units")))
    assert units == ["fingerprint.json", "stage0.json", "stage0_n2.json", "stage0_n4.json",
                     "stage1.json", "stage1_n2.json", "stage1_n4.json"]

    def no_training(*a, **k):
        raise AssertionError("a finished measurement trained again")

    with monkeypatch.context() as m:
        m.setattr(study, "ce_snapshots", no_training)
        again = study.run(c, work)
    assert again["reused"] == 4 and again["rows"] == first["rows"]
    assert "4 of 4 (stage, budget) units reused" in again["summary"]
    strip = lambda text: text.split("\n", 3)[3]  # noqa: E731 -- all but the wall-time line
    assert strip(again["summary"]) == strip(first["summary"])

    os.remove(os.path.join(work, "units", "stage1_n4.json"))  # "killed" before the last unit
    resumed = study.run(c, work)
    assert resumed["reused"] == 3 and resumed["rows"] == first["rows"]

    c.measure.budgets = (2, 4, 8)  # budgets may change: only the new one is measured
    more = study.run(c, work)
    assert more["reused"] == 4 and len(more["rows"]) == 3 * len(first["rows"]) // 2
    assert [r for r in more["rows"] if r["budget"] != 8] == first["rows"]

    c.measure.num_draws = 3
    with pytest.raises(CheckpointError, match=r"measure\.num_draws: 2 -> 3"):
        study.run(c, work)


def test_validation_before_any_work(tmp_path):
    """Bad values are refused naming the field before data or models load (the study used
    to check n_min and the budget after ~20 s of work and to accept lr = -1)."""
    from sera_jax.studies.common import StudyError

    for field, value, match in (
            ("sft.optimizer.learning_rate", -1.0, "sft.optimizer.learning_rate"),
            ("sft.optimizer.learning_rate", float("inf"), "sft.optimizer.learning_rate"),
            ("sft.optimizer.warmup_steps", -1, "sft.optimizer.warmup_steps"),
            ("sft.dtype", "float16", "sft.dtype"),
            ("rl.allocation.n_min", 1, "rl.allocation.n_min"),
            ("rl.allocation.threshold", 1.5, "rl.allocation.threshold"),
            ("rl.mesh.data", 0, "rl.mesh.data"),
            ("measure.budgets", (2, 1024), "measure.budgets"),
            ("compare.methods", ("uniform", "serra"), "did you mean 'sera'"),
            ("compare.methods", "uniform,sera", "a tuple of distinct method names"),
            ("measure.num_draws", 1, "num_draws"),
            ("mode", "trian", "mode")):
        # Not type-safe: a user's own file may hold a string where the default has a tuple.
        c = ml_collections.ConfigDict(_config("digits").to_dict(), type_safe=False)
        util.set_field(c, field, value)
        with pytest.raises(StudyError, match=match):
            study.run(c, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_digits_train_mode(tmp_path):
    c = _config("digits")
    c.mode = "train"
    c.rl.prompts_per_step, c.model.width, c.model.stage_sizes = 16, 4, (1,)
    c.rl.num_steps, c.rl.log_every, c.rl.rollouts_per_prompt = 3, 2, 4
    c.eval.ks = (1, 4)
    res = study.run(c, str(tmp_path))
    assert [r["step"] for r in res["log"]] == [0, 2]
    r = res["log"][-1]
    assert -1 <= r["cosine"] <= 1 and 0 <= r["val_top1"] <= 1
    assert r["val_pass@1"] <= r["val_pass@4"] <= 1
    assert (tmp_path / "train_log.csv").exists() and "val_pass@4" in res["summary"]


@pytest.mark.parametrize("mode", ["train", pytest.param("measure", marks=pytest.mark.slow)])
def test_imagenet_config_on_mock_data(tmp_path, mode):
    import tensorflow_datasets as tfds

    c = _config("imagenet_resnet50")
    c.mode = mode
    c.model.name = "tiny_resnet"
    c.data.data_dir, c.data.image_size, c.data.shuffle_buffer = str(tmp_path / "tfds"), 64, 8
    c.sft.batch_size = c.rl.prompts_per_step = c.measure.prompts_per_step = 8
    c.sft.optimizer.warmup_steps = c.rl.optimizer.warmup_steps = 1
    c.rl.num_steps, c.rl.log_every, c.rl.rollouts_per_prompt = 2, 1, 4
    c.eval.batch_size, c.eval.num_batches = 8, 1
    c.measure.stage_steps, c.measure.stage_names = (0, 1), ("init", "one")
    c.measure.budgets, c.compare.methods = (2, 4), ("uniform", "sera")
    c.measure.num_draws, c.measure.unroll, c.measure.cot_chunk = 2, 2, 4
    with tfds.testing.mock_data(num_examples=16):
        res = study.run(c, str(tmp_path / "out"))
    if mode == "train":
        assert len(res["log"]) == 2 and res["log"][-1]["val_pass@512"] <= 1
    else:
        assert len(res["rows"]) == 2 * 2 * 2 * 2
        assert all(-1 <= r["cosine"] <= 1 for r in res["rows"])


# Slow: the two-stage pilot and its gradient are tested in test_gradients.py (fast); this is
# the study end to end with it.
@pytest.mark.slow
def test_two_stage_method_end_to_end(tmp_path):
    """sera_sequential (pilot, then allocation per draw) and sera_posterior in measure mode
    at tiny size; refused by train mode before any work."""
    c = _config("digits")
    assert {"sera_posterior", "sera_sequential"} <= set(c.compare.methods)  # the default
    c.sft.batch_size = c.measure.prompts_per_step = 16
    c.model.width, c.model.stage_sizes = 4, (1,)
    c.measure.stage_steps, c.measure.stage_names = (0,), ("init",)
    c.measure.budgets = (2, 4)
    c.compare.methods = ("uniform", "sera", "sera_posterior", "sera_sequential")
    c.measure.num_draws, c.measure.unroll, c.measure.cot_chunk = 3, 2, 5
    res = study.run(c, str(tmp_path / "m"))
    rows = res["rows"]
    assert len(rows) == 2 * 4 * 3  # budgets x methods x draws
    assert all(-1 <= r["cosine"] <= 1 and -1 <= r["cosine_expected"] <= 1 for r in rows)
    by = {(r["stage"], r["budget"], r["method"], r["draw"]): r for r in rows}
    for d in range(3):
        # N0 = n_min = pilot: every image gets exactly its 2 pilot rollouts, the first two
        # rollouts uniform draws with the same key -- identical gradients, and E[c_q] over
        # the pilot is then κ(p, 2) (uniform's).
        seq, uni = by[("init", 2, "sera_sequential", d)], by[("init", 2, "uniform", d)]
        assert seq["cosine"] == uni["cosine"]
        assert seq["kappa_mean"] == pytest.approx(uni["kappa_mean"], rel=1e-6)
        assert seq["cosine_expected"] == pytest.approx(uni["cosine_expected"], abs=1e-5)
    assert np.isfinite([r["kappa_mean"] for r in rows]).all()
    table = {(r["stage"], r["budget"], r["method"]): r for r in res["table"]}
    assert "diff_vs_sera" in table[("init", 4, "sera_sequential")]
    assert "Rules beyond the paper vs SERA" in res["summary"]
    assert "sera_sequential | Δ vs SERA" in res["summary"]

    c.mode, c.rl.method = "train", "sera_sequential"
    from sera_jax.studies.common import StudyError

    with pytest.raises(StudyError, match="in-step pilot"):
        study.run(c, str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()


def test_old_field_names_name_the_new_ones(tmp_path):
    """An override of a renamed field names its new home (binary and `unknown_override`);
    so does an old config file passed to `run`."""
    c = _config("digits")
    for old, new in (("train.n0", "rl.rollouts_per_prompt"), ("optim.lr",
                     "sft.optimizer.learning_rate"), ("allocation.n_max", "rl.allocation.n_max"),
                     ("measure.methods", "compare.methods"), ("mesh.data", "rl.mesh.data")):
        assert common.unknown_override([f"--config.{old}=1"], c) == (
            f"--config.{old}: this field was renamed; use --config.{new}")
    for old, new in study.RENAMED.items():  # every new home is a field of both configs
        for name in ("digits", "imagenet_resnet50"):
            assert new in common.config_keys(_config(name)), (name, old, new)
    c.train = {"n0": 4}  # a user's own config file with an old block
    with pytest.raises(common.StudyError, match="'train.n0' was renamed 'rl.rollouts_per_prompt'"):
        study.run(c, str(tmp_path / "w"))
    binary = os.path.join(ROOT, "experiments", "gradient_alignment.py")
    out = subprocess.run([sys.executable, binary, f"--workdir={tmp_path}",
                          "--config.measure.methods=('uniform',)"], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        "error: --config.measure.methods: this field was renamed; use --config.compare.methods")


def test_a_new_allocator_runs_as_a_method(tmp_path, monkeypatch):
    """An allocator added the way every one is (`@register` + a `Method`: tests/toy_allocator)
    is measured by name, with no study code of its own."""
    from sera_jax import methods
    from tests import toy_allocator

    monkeypatch.setitem(methods.METHODS, "toy", toy_allocator.TOY)
    c = _config("digits")
    c.sft.batch_size = c.measure.prompts_per_step = 16
    c.model.width, c.model.stage_sizes = 4, (1,)
    c.measure.stage_steps, c.measure.stage_names = (0,), ("init",)
    c.measure.budgets, c.compare.methods = (2, 4), ("uniform", "toy")
    c.measure.num_draws, c.measure.unroll, c.measure.cot_chunk = 2, 2, 4
    rows = study.run(c, str(tmp_path))["rows"]
    by = {(r["budget"], r["method"], r["draw"]): r for r in rows}
    assert len(rows) == 2 * 2 * 2 and all(-1 <= r["cosine"] <= 1 for r in rows)
    for d in range(2):  # N0 = n_min: no freedom, so the paired draws coincide
        assert by[(2, "toy", d)]["cosine"] == by[(2, "uniform", d)]["cosine"]
    assert by[(4, "toy", 0)]["kappa_min"] != by[(4, "uniform", 0)]["kappa_min"]
