"""The gradient-alignment study end to end: digits measure (the binary) and train modes, and
the ImageNet/ResNet config on tfds mock data with a tiny ResNet."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from sera_jax import config_files
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
    assert imagenet.train.n0 == 128 and imagenet.allocation.n_max == 512
    assert imagenet.batch_size == 256 and imagenet.allocation.threshold == 0.05


def test_digits_measure_binary_writes_outputs(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "experiments", "gradient_alignment.py"),
           f"--config={os.path.join(ROOT, 'configs/gradient_alignment/digits.py')}",
           f"--workdir={tmp_path}", "--config.measure.budgets=(2,4)",
           "--config.measure.methods=('uniform','sera')",
           "--config.measure.num_draws=2", "--config.measure.stage_steps=(0,2)",
           "--config.measure.stage_names=('init','two')", "--config.measure.batch_size=16",
           "--config.batch_size=16", "--config.model.width=4",
           "--config.model.stage_sizes=(1,)", "--config.measure.unroll=2",
           "--config.measure.cot_chunk=4"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SERA (dynamic) vs uniform" in out.stdout
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


def test_validation_before_any_work(tmp_path):
    """Bad values are refused naming the field before data or models load (the study used
    to check n_min and the budget after ~20 s of work and to accept lr = -1)."""
    from sera_jax.studies.common import StudyError

    for field, value, match in (("optim.lr", -1.0, "optim.lr"),
                                ("optim.lr", float("inf"), "optim.lr"),
                                ("allocation.n_min", 1, "allocation.n_min"),
                                ("allocation.threshold", 1.5, "allocation.threshold"),
                                ("measure.budgets", (2, 1024), "measure.budgets"),
                                ("measure.methods", ("uniform", "sera_dynamic"),
                                 "did you mean"),
                                ("measure.num_draws", 1, "num_draws"),
                                ("mode", "trian", "mode")):
        c = util.set_field(_config("digits"), field, value)
        with pytest.raises(StudyError, match=match):
            study.run(c, str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_digits_train_mode(tmp_path):
    c = _config("digits")
    c.mode = "train"
    c.batch_size, c.model.width, c.model.stage_sizes = 16, 4, (1,)
    c.train.num_steps, c.train.log_every, c.train.n0 = 3, 2, 4
    c.train.pass_ks = (1, 4)
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
    c.batch_size = c.measure.batch_size = 8
    c.optim.warmup_steps = 1
    c.train.num_steps, c.train.log_every, c.train.n0 = 2, 1, 4
    c.train.eval_batch_size, c.train.eval_batches = 8, 1
    c.measure.stage_steps, c.measure.stage_names = (0, 1), ("init", "one")
    c.measure.budgets, c.measure.methods = (2, 4), ("uniform", "sera")
    c.measure.num_draws, c.measure.unroll, c.measure.cot_chunk = 2, 2, 4
    with tfds.testing.mock_data(num_examples=16):
        res = study.run(c, str(tmp_path / "out"))
    if mode == "train":
        assert len(res["log"]) == 2 and res["log"][-1]["val_pass@512"] <= 1
    else:
        assert len(res["rows"]) == 2 * 2 * 2 * 2
        assert all(-1 <= r["cosine"] <= 1 for r in res["rows"])


def test_two_stage_method_end_to_end(tmp_path):
    """sera_sequential (pilot, then allocation per draw) and sera_posterior in measure mode
    at tiny size; refused by train mode before any work."""
    c = _config("digits")
    assert {"sera_posterior", "sera_sequential"} <= set(c.measure.methods)  # the default
    c.batch_size = c.measure.batch_size = 16
    c.model.width, c.model.stage_sizes = 4, (1,)
    c.measure.stage_steps, c.measure.stage_names = (0,), ("init",)
    c.measure.budgets = (2, 4)
    c.measure.methods = ("uniform", "sera", "sera_posterior", "sera_sequential")
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

    c.mode, c.train.method = "train", "sera_sequential"
    from sera_jax.studies.common import StudyError

    with pytest.raises(StudyError, match="in-step pilot"):
        study.run(c, str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()
