"""The two-step math study's protocol pieces (issue 49) at tiny size: the sealed test split
of generated problems, each sample's outcome class kept and exported, the format vs
correctness report recomputed from the export, the start at other temperatures, and the
strongest answer-blind guesser -- on a tiny random LM (a byte tokenizer), so the numbers say
nothing about SmolLM2, only that the protocol carries them (slow: ~80 s; `make test-slow`).
"""

import json
import os

import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies import common
from sera_jax.studies.paired import config as study_config
from sera_jax.studies.paired import outcomes, recompute, spec, study
from sera_jax.studies.paired.export import export_results
from sera_jax.studies.paired.kinds import lm
from tests import util


def load(name: str):
    return config_files.get_config(os.path.join(util.ROOT, "configs", name))


def test_steps_configs_register_a_sealed_split_and_keep_older_hashes():
    cfg = load("math/smollm2_steps.py")
    assert spec.test_split(cfg) == {"num_test": 128, "sealed_fraction": 0.25}
    assert spec.primary_split(cfg) == "test" and cfg.compare.blind == "strongest"
    # the start's fingerprint leaves the sealed split out
    assert "num_test" not in spec.start_fingerprint(cfg)["task"]
    arith = load("math/smollm2_arith.py")
    assert spec.test_split(arith) is None
    arith.eval.test_prompts = 8
    with pytest.raises(common.StudyError, match="no sealed test split"):
        study_config.validate_test_prompts(arith)


@pytest.fixture(scope="module")
def tiny_steps_study(tmp_path_factory):
    policy = str(tmp_path_factory.mktemp("tiny_lm"))
    util.write_tiny_lm(policy)
    cfg = load("math/smollm2_steps_quick.py")
    cfg.name = "math_steps_tiny_test"
    cfg.model.source, cfg.model.path = "hf", policy
    cfg.task.update(num_train=16, num_eval=8, num_test=8, chat=False, fewshot="",
                    max_new_tokens=4)
    cfg.rl.update(num_steps=2, prompts_per_step=4, rollouts_per_prompt=2, micro_batch_size=8,
                  checkpoint_every=2, log_every=1)
    cfg.rl.allocation.n_max = 4
    cfg.eval.update(num_prompts=8, test_prompts=8, num_samples=4, curve_samples=4,
                    batch_size=16)
    cfg.compare.primary.k = 4
    cfg.compare.bootstrap = 200
    cfg.compare.allow_blind_task = True  # a random policy cannot beat the blind guesser
    root = tmp_path_factory.mktemp("steps_study")
    cfg.compare.preregistration = str(root / "preregistration.json")
    work = str(root / "w")
    for stage in ("preregister", "sft", "rl"):
        study.run(cfg, work, stage)
    table = study.run(cfg, work, "eval")
    return cfg, work, table, export_results(cfg, work, out_dir=str(root / "export"))


@pytest.mark.slow
def test_outcomes_are_kept_exported_and_recomputed(tiny_steps_study):
    cfg, work, table, export = tiny_steps_study
    assert {"outcomes.json", outcomes.OUTCOMES_FILE, "start_temperatures.json"} <= set(
        export["files"])
    arrays = np.load(os.path.join(export["dir"], outcomes.OUTCOMES_FILE))
    final = arrays["run/uniform/0/final/test"]
    assert final.shape == (8, 4) and final.dtype == np.int8
    assert set(np.unique(final)) <= {0, 1, 2, 3}
    # the counts and the classes agree: correct samples per problem = the saved counts
    counts = np.load(os.path.join(export["dir"], "counts.npz"))
    np.testing.assert_array_equal((final == 0).sum(axis=1),
                                  counts["run/uniform/0/final/test"])
    assert list(arrays["templates/test"][:1])[0].startswith("small_")
    summary = json.load(open(os.path.join(export["dir"], "outcomes.json")))
    d = summary["splits"]["test"]["arms"]["sera"]["vs_start"]
    assert d["gain"]["mean"] == pytest.approx(d["format"]["mean"] + d["correctness"]["mean"])
    assert "sera" in summary["splits"]["test"]["vs_baseline"]
    out = recompute.recompute(export["dir"])
    assert recompute.compare_numbers(out["outcomes"], summary, tol=1e-12) == []
    rows = json.load(open(os.path.join(export["dir"], "start_temperatures.json")))
    assert set(rows) == {"0", "0.7"} and rows["0"]["num_samples"] == 1
    assert recompute.compare_numbers(out["start_temperatures"], rows, tol=1e-12) == []
    assert os.path.exists(os.path.join(work, "results", "outcomes.md"))


@pytest.mark.slow
def test_strongest_blind_guesser_is_the_gate_and_all_are_reported(tiny_steps_study):
    cfg, work, table, _ = tiny_steps_study
    report = json.load(open(os.path.join(work, "sft", "validity.json")))
    for block in (report, report["test"]):
        assert set(block["guessers"]) == set(lm.GUESSERS)
        assert block["blind"] == block["strongest"]
        k = str(max(int(k) for k in block["ks"]))
        best = max(g["blind_pass_at_k"][k] for g in block["guessers"].values())
        assert block["blind_pass_at_k"][k] == best
    assert table["validity"]["gate_split"] == "test"
