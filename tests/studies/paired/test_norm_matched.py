"""The norm-matched arm (`--stage=norm_matched`, `matched.NORM_MATCHED`): the rule on hand-made
records, its refusals, its pre-registration section (written, hashed, required before the
runs) and the arm end to end at tiny size with its export and recomputation."""

import json
import os

import ml_collections
import pytest

from sera_jax import config_files
from sera_jax.records import write_jsonl
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies import paired as study
from sera_jax.studies.paired import matched, prereg, recompute, spec
from tests import util


def _tiny(prereg_path=None):
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    if prereg_path is not None:
        cfg.compare.preregistration = str(prereg_path)
        cfg.compare.exploratory = False
    return cfg


def _records(work, arm, seed, norms, *, with_norm=True):
    """A run's train.jsonl with `norms` as the update norms of steps 1, 2, ..."""
    d = study.run_dir(str(work), arm, seed)
    os.makedirs(d, exist_ok=True)
    write_jsonl(os.path.join(d, "train.jsonl"), [
        {"step": t, "loss": 0.0, **({"update_norm": v} if with_norm else {})}
        for t, v in enumerate(norms, start=1)])


def test_the_rule_on_hand_made_records(tmp_path):
    cfg = _tiny()  # rl.num_steps 3, lr 3e-5, compare.seeds (0, 1)
    cfg.compare.seeds = (0, 1, 2)
    _records(tmp_path, "uniform", 0, [1.0, 2.0, 3.0])  # per-seed means: 2 and 4
    _records(tmp_path, "uniform", 1, [4.0, 4.0, 4.0])
    _records(tmp_path, "uniform", 2, [9.0, 9.0])  # not complete: not read
    _records(tmp_path, "sera", 0, [1.0, 1.0, 1.0])  # means 1 and 4
    _records(tmp_path, "sera", 1, [3.0, 4.0, 5.0])
    s = spec.norm_matched_spec(cfg)
    assert (s["method"], s["baseline"], s["baseline_lr"]) == ("sera", "uniform", 3e-5)
    assert "scales about linearly in lr" in s["rule"] and "margin" not in s
    choice = matched.choose_norm_lr(cfg, str(tmp_path), s)
    r = (2.0 + 4.0) / 2 / ((1.0 + 4.0) / 2)  # uniform's mean / SERA's = 1.2
    assert choice["ratio"]["mean"] == r and choice["lr"] == 3e-5 * r
    assert choice["update_norms"] == {"uniform": {"per_seed": {"0": 2.0, "1": 4.0}, "mean": 3.0},
                                      "sera": {"per_seed": {"0": 1.0, "1": 4.0}, "mean": 2.5}}
    assert choice["inputs"] == {"lr": 3e-5, "steps": 3,
                                "seeds": {"uniform": [0, 1], "sera": [0, 1]}}
    # The seed bootstrap (paired by seed id): every resample's ratio lies in [1, 2].
    lo, hi = choice["ratio"]["lo"], choice["ratio"]["hi"]
    assert 1.0 <= lo <= r <= hi <= 2.0 and choice["ratio"]["defined_share"] == 1.0
    # Once recorded, the rule reads the seeds the record read.
    _records(tmp_path, "uniform", 2, [9.0, 9.0, 9.0])
    assert matched.choose_norm_lr(cfg, str(tmp_path), s, choice)["lr"] == choice["lr"]
    assert matched.choose_norm_lr(cfg, str(tmp_path), s)["inputs"]["seeds"]["uniform"] == [0, 1, 2]


def test_ratio_of_means_pairs_seed_ids():
    e = cmp.ratio_of_means({0: 2.0, 1: 4.0}, {0: 1.0, 1: 2.0}, num_resamples=200)
    assert e["mean"] == e["lo"] == e["hi"] == 2.0  # every paired resample: the same ratio
    with pytest.raises(ValueError, match="denominator's mean"):
        cmp.ratio_of_means({0: 1.0}, {0: 0.0})


def test_the_rule_refuses_runs_without_update_norms_or_with_one_seed(tmp_path):
    cfg = _tiny()
    s = spec.norm_matched_spec(cfg)
    for seed in (0, 1):
        _records(tmp_path, "uniform", seed, [1.0, 1.0, 1.0])
        _records(tmp_path, "sera", seed, [1.0, 1.0, 1.0], with_norm=False)
    with pytest.raises(common.StudyError, match=r"update_norm .*rl/sera/seed0.* lack"):
        matched.choose_norm_lr(cfg, str(tmp_path), s)
    _records(tmp_path, "sera", 0, [1.0, 1.0, 1.0])
    _records(tmp_path, "sera", 1, [1.0, 1.0])  # not complete: one seed left
    with pytest.raises(common.StudyError, match=r"sera has 1 complete run.*>= 2 per method"):
        matched.choose_norm_lr(cfg, str(tmp_path), s)


def test_the_section_is_written_hashed_and_required_before_the_runs(tmp_path):
    path = tmp_path / "p.json"
    cfg = _tiny(path)
    cfg.compare.margin = 0.05
    prereg.write_preregistration(cfg)
    s = spec.norm_matched_spec(cfg)
    assert s["margin"] == 0.05 and s["endpoint"]["split"] == "eval"
    means = {"uniform": {"0": 2.0, "1": 4.0}, "sera": {"0": 1.0, "1": 2.0}}
    choice = {**matched.norm_lr(means, "sera", "uniform", cfg), "inputs": {}}
    rec = matched.record_choice(cfg, choice, matched.NORM_MATCHED, s)
    saved = json.load(open(path))
    assert saved["norm_matched"] == rec and rec["lr"] == 2 * 3e-5 and rec["margin"] == 0.05
    assert rec["config_hash"] == spec.fields_hash({k: v for k, v in rec.items()
                                                   if k != "config_hash"})
    assert prereg.registered(saved)["norm_matched"] == rec
    assert matched.record_choice(cfg, choice, matched.NORM_MATCHED, s) == rec  # confirmed
    with pytest.raises(common.StudyError, match=r"already records the norm-matched lr .*ratio"):
        matched.record_choice(cfg, {**choice, "ratio": {**choice["ratio"], "mean": 1.5}},
                              matched.NORM_MATCHED, s)
    prereg.check_preregistration(cfg)  # the added section leaves the others valid
    with pytest.raises(common.StudyError, match=r"records the norm-matched lr 6e-05 .*not "
                                                r"committed in git.*commit it"):
        matched.require_committed_section(cfg, matched.NORM_MATCHED, rec["lr"])
    saved["norm_matched"]["lr"] = 1.0  # edited by hand: its hash no longer holds
    json.dump(saved, open(path, "w"))
    with pytest.raises(common.StudyError, match=r"'norm_matched.config_hash' does not match"):
        prereg.read_preregistration(str(path))


def test_norm_matched_arm_end_to_end_with_export_and_recompute(tmp_path, monkeypatch):
    cfg = _tiny(tmp_path / "p.json")
    cfg.compare.methods = ("uniform", "sera")
    cfg.compare.null = cfg.compare.aa = cfg.eval.paired_noise = False
    cfg.compare.margin = 0.05
    cfg.rl.num_steps = 1
    cfg.eval.train_prompts = 0
    cfg.eval.kl_prompts = 0
    work = str(tmp_path / "w")
    study.run(cfg, work, "preregister")
    study.run(cfg, work, "sft")
    study.run(cfg, work, "compare")
    # The tiny policy never succeeds, so both methods' updates are AdamW's weight decay
    # alone (‖Δθ‖ = lr · wd · ‖θ‖: the same for both). SERA's measured norms at the config's
    # lr are halved here, so the rule derives r = 2 and the arm runs at twice the lr.
    measure = matched.update_norm_means

    def halved(root, arm, seeds, num_steps):
        means, incomplete, lacking = measure(root, arm, seeds, num_steps)
        if root == work and arm == "sera":
            means = {s: v / 2 for s, v in means.items()}
        return means, incomplete, lacking

    monkeypatch.setattr(matched, "update_norm_means", halved)
    # The derived lr is registered, and the arm waits for the file to be committed.
    with pytest.raises(common.StudyError, match=r"--stage=norm_matched: .*p\.json records the "
                                                r"norm-matched lr .*commit it"):
        study.run(cfg, work, "norm_matched")
    section = json.load(open(tmp_path / "p.json"))["norm_matched"]
    assert not os.path.exists(os.path.join(work, "norm_matched"))
    monkeypatch.setattr(matched, "git_committed", lambda path: True)
    out = study.run(cfg, work, "norm_matched")
    lr = section["lr"]
    assert section["ratio"]["mean"] == pytest.approx(2, rel=1e-3)
    assert lr == cfg.rl.optimizer.learning_rate * section["ratio"]["mean"]
    assert out["choice"] == section and out["dir"] == f"norm_matched/lr{lr:.6g}"
    for seed in (0, 1):
        run = json.load(open(os.path.join(work, out["dir"], "rl", "sera", f"seed{seed}",
                                          "config.json")))
        assert run["rl"]["optimizer"]["learning_rate"] == pytest.approx(lr)
    assert not os.path.exists(os.path.join(work, out["dir"], "rl", "uniform"))
    r = out["result"]
    assert r["ran"] and r["seeds"] == [0, 1] and r["tost"]["margin"] == 0.05
    assert r["verdict"] in ("better", "worse", "inconclusive", "equivalent within ±0.05")
    # The achieved ratio, on the arm's own runs: twice the lr, about twice the (decay) step
    # (‖θ' − θ‖ in float32 at steps this small carries the rounding of θ, ~10 %).
    a = out["achieved"]
    assert set(a["update_norms"]["arm"]["per_seed"]) == {"0", "1"}
    assert 0.4 < a["ratio"]["mean"] < 0.7
    assert a["ratio"]["lo"] <= a["ratio"]["mean"] <= a["ratio"]["hi"]
    md = open(os.path.join(work, "results", "norm_matched.md")).read()
    assert "sera@norm-matched lr − uniform" in md and "Achieved update-norm ratio" in md
    assert "Verdict:" in md
    # Exported with the comparison; recompute rebuilds the endpoint from the counts and the
    # ratios from the recorded update norms.
    from sera_jax.studies.paired.export import export_results

    folder = export_results(cfg, work, out_dir=str(tmp_path / "export"))["dir"]
    saved = json.load(open(os.path.join(folder, "norm_matched.json")))
    got = recompute.recompute(folder)["norm_matched"]
    assert set(got) == {"result", "choice", "achieved"}
    assert recompute.compare_numbers(got, recompute.saved_view(saved, got)) == []
    assert recompute.main(folder) == 0
    # An exploration reports its own choice and writes nothing into any pre-registration.
    before = open(tmp_path / "p.json").read()
    explore = ml_collections.ConfigDict(cfg.to_dict())
    explore.compare.exploratory = True
    again = study.run(explore, work, "norm_matched")
    assert again["exploratory"] and again["choice"]["lr"] == lr
    assert again["result"]["estimate"] == r["estimate"]  # the same runs, resumed as done
    assert open(tmp_path / "p.json").read() == before
    assert again["achieved"] == a
