"""The math pilot (experiments/math_pilot.py): each candidate is a valid task of the math kind
with disjoint train / held-out splits of the largest size its templates supply, and the pilot
scores a start with the paired study's evaluation, writes one record per candidate, resumes
finished ones made with the same settings (recomputing, and saying so, a record made with
others), refuses an empty candidate list and prints the table (a tiny random LM)."""

import json
import os

import pytest

from sera_jax import config_files
from sera_jax.studies import common, math_pilot
from sera_jax.studies.paired.kinds import lm
from sera_jax.tasks.mathqa import problems
from sera_jax.tasks.mathqa import task as math_task
from tests import util


def _cpu():
    return config_files.get_config(os.path.join(util.ROOT, "configs", "math", "cpu.py"))


@pytest.mark.parametrize("name", list(math_pilot.CANDIDATES))
def test_candidate_is_a_valid_task_with_disjoint_splits(name):
    c = math_pilot.candidate_config(_cpu(), name)
    lm.validate_task(c)
    assert (c.eval.temperature, c.eval.top_p) == (c.rl.sampling.temperature,
                                                  c.rl.sampling.top_p)
    assert c.eval.train_prompts == 0  # held-out problems only
    splits = math_task.load_splits(c.task)
    size = 96 if c.task.templates == "add,mul" else 128  # add/mul has ~110 held-out contents
    assert len(splits["train"]) == len(splits["eval"]) == size
    keys = {s: {problems.content_key(p.meta["template"], p.meta["operands"]) for p in ps}
            for s, ps in splits.items()}
    assert not keys["train"] & keys["eval"]
    assert {p.level for ps in splits.values() for p in ps} <= set(c.task.steps)


def test_pilot_scores_records_and_resumes(tmp_path, monkeypatch, capsys):
    cfg = _cpu()
    cfg.model.source, cfg.model.path = "hf", util.write_tiny_lm(str(tmp_path / "lm"))
    cfg.eval.update(num_prompts=4, num_samples=2, batch_size=8)
    work = str(tmp_path / "pilot")
    out = math_pilot.run(cfg, work, ["small8_nl"])
    record = out["records"]["small8_nl"]
    assert record["num_train"] == record["num_eval"] == 128
    assert record["num_prompts"] == 4 and record["num_samples"] == 2
    assert (record["temperature"], record["max_new_tokens"]) == (1.0, 8)
    assert set(record["pass_at_k"]) == {"1", "2"} and 0.0 <= record["pass_at_k"]["1"] <= 1.0
    assert record["maj_at_n"] is None or 0.0 <= record["maj_at_n"] <= 1.0
    assert [e["id"] for e in record["examples"]] == [0, 1, 2]
    assert all(e["reward"] in (0.0, 1.0) for e in record["examples"])
    assert "| small8_nl | 128 / 128 |" in out["summary"]
    assert os.path.exists(os.path.join(work, "small8_nl.json"))

    # A finished candidate is read back, not re-run (nothing loads).
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded for a finished candidate")

    real_build_model = math_pilot.build_model
    monkeypatch.setattr(math_pilot, "build_model", no_model)
    again = math_pilot.run(cfg, work, ["small8_nl"])
    assert again["records"]["small8_nl"] == json.loads(json.dumps(record))  # tuples: lists
    assert again["summary"] == out["summary"]
    # The batch size changes no number: still read back.
    cfg.eval.batch_size = 4
    assert math_pilot.run(cfg, work, ["small8_nl"])["records"]["small8_nl"]["num_prompts"] == 4
    # A record made with other settings is recomputed, and the run says so.
    monkeypatch.setattr(math_pilot, "build_model", real_build_model)
    capsys.readouterr()
    cfg.eval.num_prompts = 2
    other = math_pilot.run(cfg, work, ["small8_nl"])["records"]["small8_nl"]
    assert other["num_prompts"] == 2
    said = capsys.readouterr().out
    assert "small8_nl: recomputing" in said and "other settings (eval.num_prompts)" in said
    # A record written before records carried their settings is recomputed too.
    path = os.path.join(work, "small8_nl.json")
    old = json.load(open(path))
    old.pop("fingerprint")
    json.dump(old, open(path, "w"))
    assert math_pilot.cached_record(path, other["fingerprint"]) == (
        None, "made before records carried their settings")
    monkeypatch.setattr(math_pilot, "build_model", no_model)
    # An empty candidate list (`--candidates=`) is refused, not an empty table.
    for empty in ([], [""]):
        with pytest.raises(common.StudyError, match="--candidates is empty"):
            math_pilot.run(cfg, work, empty)
    # Unknown candidates and bad config fields are refused before anything runs.
    with pytest.raises(common.StudyError, match="unknown"):
        math_pilot.run(cfg, work, ["nope"])
    cfg.model.path = ""
    with pytest.raises(common.StudyError, match=r"config\.model\.path"):
        math_pilot.run(cfg, str(tmp_path / "never"), ["small8_nl"])
    assert not os.path.exists(tmp_path / "never")
