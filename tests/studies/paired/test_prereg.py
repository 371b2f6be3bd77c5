"""The committed pre-registration: written once, checked before any RL run, and
the aggregator refuses a changed primary endpoint."""

import json
import os

import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import prereg
from tests import util


def _tiny(path):
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.compare.preregistration = str(path)
    cfg.compare.exploratory = False  # the protocol's pre-registered path
    return cfg


def test_default_path_is_in_the_repository_by_config_name():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "cpu.py"))
    assert prereg.preregistration_path(cfg) == os.path.join(
        util.ROOT, "results", "maze", "maze_cpu_long", "preregistration.json")


def test_write_then_check_and_refuse_changes(tmp_path):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    rec = study.run(cfg, str(tmp_path / "w"), "preregister")
    assert not os.path.exists(tmp_path / "w")  # no workdir needed
    saved = json.load(open(path))
    assert saved["comparison"]["primary"]["k"] == cfg.compare.primary.k
    assert len(saved["comparison"]["config_hash"]) == 64 and rec["path"] == str(path)
    fr = saved["frontier"]
    assert fr["learning_rates"] == list(cfg.frontier.learning_rates) and fr["window"] == 2
    assert "best mean pass@8" in fr["selection_rule"] and "log lr" in fr["matched"]["rule"]
    assert prereg.check_preregistration(cfg)["hash_matches"]
    # Rewriting with the same config is a no-op; cadence and the file's path are not hashed.
    same = _tiny(path)
    same.rl.log_every = 7
    same.eval.batch_size = 16
    study.run(same, str(tmp_path / "w"), "preregister")
    assert json.load(open(path)) == saved
    prereg.check_preregistration(same)
    # What the comparison computes is hashed: refused before a run, naming the field.
    for field, value in (("rl.optimizer.learning_rate", 1e-4), ("task.seed", 5),
                         ("compare.primary.k", 4), ("compare.seeds", (0, 1, 2))):
        changed = util.set_field(_tiny(path), field, value)
        with pytest.raises(common.StudyError, match="differs from its pre-registration"):
            prereg.check_preregistration(changed)
        with pytest.raises(common.StudyError, match="never rewritten"):
            prereg.write_preregistration(changed)
    changed = util.set_field(_tiny(path), "frontier.learning_rates", (1e-5,))
    with pytest.raises(common.StudyError, match="frontier differs"):
        prereg.check_preregistration(changed, "frontier")


def test_rl_stage_refuses_without_the_file(tmp_path):
    cfg = _tiny(tmp_path / "missing.json")
    work = tmp_path / "w"
    os.makedirs(work / "sft")
    with open(work / "sft" / "eval.json", "w") as f:  # an SFT stage (the gate reads counts)
        json.dump({"final": {"num_samples": 8, "num_correct": [0], "key_seed": 1234},
                   "fingerprint": {"sft_step": 3}}, f)
    for stage in ("rl", "compare"):
        with pytest.raises(common.StudyError, match=r"no pre-registration at .*missing\.json: "
                                                    r"write it with .*--stage=preregister"):
            study.run(cfg, str(work), stage)
    assert not os.path.exists(work / "rl")


def test_aggregator_refuses_a_primary_that_differs(tmp_path):
    path = tmp_path / "p.json"
    prereg.write_preregistration(_tiny(path))
    assert prereg.check_primary(_tiny(path))["primary_matches"]
    changed = util.set_field(_tiny(path), "compare.primary.k", 4)
    with pytest.raises(common.StudyError, match="differ from the pre-registered primary"):
        prereg.check_primary(changed)
    # Another config hash (e.g. a shorter exploratory run) is recorded, not refused.
    other = util.set_field(_tiny(path), "rl.num_steps", 2)
    assert prereg.check_primary(other)["hash_matches"] is False
    assert prereg.check_primary(_tiny(tmp_path / "none.json")) == {
        "path": str(tmp_path / "none.json"), "found": False}


def test_matched_choice_is_written_before_the_arm_and_fixed_once(tmp_path):
    from sera_jax.studies.paired import matched

    path = tmp_path / "p.json"
    cfg = _tiny(path)
    prereg.write_preregistration(cfg)
    choice = {**matched.matched_lr([(1e-5, 0.02)], 0.01), "target_gain": 0.01,
              "uniform_gains": {"1e-05": 0.02}, "start_pass1": 0.04}
    rec = matched.record_choice(cfg, choice)
    assert json.load(open(path))["lr_matched"] == rec and rec["lr"] == pytest.approx(5e-6)
    assert matched.record_choice(cfg, choice) == rec  # the same numbers: confirmed
    other = {**choice, "lr": 7e-6}
    with pytest.raises(common.StudyError, match="already records the matched lr"):
        matched.record_choice(cfg, other)
    prereg.check_preregistration(cfg)  # the added section leaves the others valid
    prereg.check_preregistration(cfg, "frontier")


def test_amendment_adds_control_seeds_only_and_is_recorded(tmp_path):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    cfg.compare.null_seeds = (0,)
    prereg.write_preregistration(cfg)
    original = json.load(open(path))
    more = util.set_field(_tiny(path), "compare.null_seeds", (0, 1, 2))
    with pytest.raises(common.StudyError, match="compare.amendment and run --stage=amend"):
        prereg.check_preregistration(more)
    with pytest.raises(common.StudyError, match="needs the reason in config.compare.amendment"):
        study.run(more, str(tmp_path / "w"), "amend")
    more.compare.amendment = "two null seeds left the gate's t band wide"
    rec = study.run(more, str(tmp_path / "w"), "amend")
    (amendment,) = rec["amendments"]
    assert amendment["changed"] == {"compare.null_seeds": [[0], [0, 1, 2]]}
    assert amendment["reason"].startswith("two null seeds")
    saved = json.load(open(path))
    assert saved["comparison"] == original["comparison"]  # the original section stays
    assert prereg.check_preregistration(more)["hash_matches"]
    prereg.check_preregistration(util.set_field(_tiny(path), "compare.null_seeds", (0,)))
    prereg.write_preregistration(more)  # the amended config confirms, never rewrites
    assert json.load(open(path)) == saved
    study.run(more, str(tmp_path / "w"), "amend")  # recorded already: a no-op
    assert json.load(open(path)) == saved
    prim = prereg.check_primary(more)
    assert prim["hash_matches"] and prim["amendments"][0]["reason"] == amendment["reason"]
    # A second amendment grows from the amended seeds; anything else is refused.
    for field, value, match in (("compare.null_seeds", (0, 2), "may only add seeds"),
                                ("rl.num_steps", 2, r"also changes arms\.aa\.rl\.num_steps"),
                                ("compare.primary.k", 4, "cannot change the primary")):
        bad = util.set_field(util.set_field(_tiny(path), "compare.null_seeds", (0, 1, 2)),
                             field, value)
        bad.compare.amendment = "x"
        with pytest.raises(common.StudyError, match=match):
            prereg.write_amendment(bad)
    aa = util.set_field(util.set_field(_tiny(path), "compare.null_seeds", (0, 1, 2)),
                        "compare.aa_seeds", (0, 1, 5))
    aa.compare.amendment = "more A/A seeds"
    assert len(prereg.write_amendment(aa)["amendments"]) == 2
    assert prereg.check_preregistration(aa)["hash_matches"]
    from sera_jax.studies.paired import tables

    assert "Amended" in tables._prereg_sentence({"preregistration": prereg.check_primary(aa)})


def _committed_configs():
    """(config path, committed pre-registration) of every study config whose file exists."""
    out = []
    for kind in ("maze", "math"):
        folder = os.path.join(util.ROOT, "configs", kind)
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".py"):
                continue
            cfg = config_files.get_config(os.path.join(folder, name))
            if "compare" not in cfg or cfg.compare.get("primary") is None:
                continue
            if os.path.exists(prereg.preregistration_path(cfg)):
                out.append((os.path.join(folder, name), prereg.preregistration_path(cfg)))
    return out


@pytest.mark.parametrize("moved", ["2026-12-07", "2031-06-01"])
def test_committed_preregistrations_hold_on_any_date(moved, monkeypatch, tmp_path):
    """With the clock moved forward, every committed pre-registration still matches its
    config (check_preregistration), and re-writing it afresh registers the same sections:
    only `written` dates differ, and they are not what a pre-registration registers."""
    monkeypatch.setattr(prereg, "today", lambda: moved)
    pairs = _committed_configs()
    assert len(pairs) >= 5, pairs  # the maze defaults, the GPU configs, the math defaults
    for config_path, committed in pairs:
        cfg = config_files.get_config(config_path)
        assert prereg.check_preregistration(cfg)["hash_matches"], config_path
        saved = json.load(open(committed))
        if saved.get("amendments"):
            continue  # re-written afresh it would lack the amendments: checked above
        cfg.compare.preregistration = str(tmp_path / os.path.basename(config_path) / "p.json")
        fresh = prereg.write_preregistration(cfg)
        assert fresh["written"] == moved
        fresh = json.load(open(cfg.compare.preregistration))
        assert prereg.registered(fresh) == {k: v for k, v in prereg.registered(saved).items()
                                            if k != "lr_matched"}, config_path


def test_amendment_dates_come_from_the_clock(monkeypatch, tmp_path):
    path = tmp_path / "p.json"
    study.run(_tiny(path), str(tmp_path / "w"), "preregister")
    monkeypatch.setattr(prereg, "today", lambda: "2031-06-01")
    more = _tiny(path)
    more.compare.null_seeds = (0, 1, 2)
    more.compare.amendment = "a third null seed"
    rec = prereg.write_amendment(more)
    assert rec["amendments"][-1]["written"] == "2031-06-01"
    assert prereg.registered(rec)["amendments"][-1]["reason"] == "a third null seed"
