"""The validity gate (issue 37): the study refuses an RL comparison on a start that a
maze-blind guesser matches, naming the numbers and the override."""

import json
import os

import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import validity
from tests import util


def _tiny():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.compare.exploratory = False  # the protocol's pre-registered path
    return cfg


def test_check_refuses_the_nine_by_nine_start():
    # Issue 37's 9x9 default: start 4.9 / 84.0 %, blind 4.3 / 86.9 % (pass@1 / pass@64).
    c = validity.check_validity({"1": 0.049, "64": 0.840}, {"1": 0.043, "64": 0.869}, 64)
    assert not c["passes"] and len(c["reasons"]) == 2
    assert "4.90 % < 2 × blind pass@1 4.30 %" in c["reasons"][0]
    assert "blind pass@64 86.9 % > 0.5 × start pass@64 84.0 %" in c["reasons"][1]
    # The 11x11 recursive-backtracker candidate reads: 1.08 / 21.6 vs blind 0.06 / 3.8.
    ok = validity.check_validity({"1": 0.0108, "64": 0.216}, {"1": 0.0006, "64": 0.038}, 64)
    assert ok["passes"] and ok["reasons"] == [] and ok["ratio_pass1"] == pytest.approx(18)
    # Each condition alone fails it; the thresholds are the arguments.
    assert not validity.check_validity({"1": 0.10, "64": 0.5}, {"1": 0.01, "64": 0.3}, 64)[
        "passes"]
    assert validity.check_validity({"1": 0.10, "64": 0.5}, {"1": 0.01, "64": 0.3}, 64,
                                   blind_share=0.7)["passes"]


def test_settings_fill_defaults_for_old_configs_and_validate():
    cfg = _tiny()
    for field in validity.VALIDITY_DEFAULTS:
        if field in cfg.compare:
            del cfg.compare[field]
    s = validity.validity_settings(cfg)
    assert s == {"allow_blind_task": False, "pass1_ratio": 2.0, "blind_share": 0.5,
                 "k": cfg.compare.primary.k}
    study.validate(cfg, ["sera"], [0])  # an old config (no validity fields) validates
    for field, value in (("compare.validity_pass1_ratio", 0.5),
                         ("compare.validity_blind_share", 0.0),
                         ("compare.validity_k", 99)):
        with pytest.raises(common.StudyError, match=field.replace(".", r"\.")):
            study.validate(util.set_field(_tiny(), field, value), ["sera"], [0])


def _fake_sft(work, correct):
    """An SFT stage's eval.json (no model: the gate reads only the start's counts)."""
    os.makedirs(os.path.join(work, "sft"))
    record = {"final": {"num_samples": 8, "num_correct": correct, "key_seed": 1234},
              "fingerprint": {"sft_step": 3}}
    with open(os.path.join(work, "sft", "eval.json"), "w") as f:
        json.dump(record, f)


@pytest.mark.parametrize("stage", ["rl", "compare", "frontier"])
def test_rl_stages_refuse_a_start_the_blind_guesser_matches(tmp_path, stage):
    cfg = _tiny()
    cfg.compare.allow_blind_task = False
    cfg.compare.preregistration = str(tmp_path / "prereg.json")
    study.run(cfg, str(tmp_path), "preregister")  # pre-registered: the gate is what refuses
    work = str(tmp_path)
    _fake_sft(work, [0])  # the start never solves the held-out maze; blind does
    with pytest.raises(common.StudyError) as err:
        study.run(cfg, work, stage)
    msg = str(err.value)
    assert f"--stage={stage}" in msg and "does not clearly read the maze" in msg
    assert "start held-out pass@1 0.00 %" in msg and "allow_blind_task=True" in msg
    assert not os.path.exists(os.path.join(work, "rl"))  # refused before any RL run
    report = json.load(open(os.path.join(work, "sft", validity.VALIDITY)))
    assert not report["check"]["passes"] and report["blind_pass_at_k"]["1"] > 0


def test_override_is_recorded(tmp_path):
    cfg = _tiny()  # allow_blind_task=True: the tests' documented exploration
    work = str(tmp_path)
    _fake_sft(work, [0])
    rec = validity.require_readable(cfg, os.path.join(work, "sft"), "--stage=rl")
    assert rec["override"] and rec["allow_blind_task"] and not rec["passes"]
    assert "FAILS" in rec["line"] and rec["path"].endswith("validity.json")
