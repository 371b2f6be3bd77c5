"""The sealed test split of the maze study: its config checks, the start's fingerprint that
leaves it out, its evaluation keys, and a tiny exploratory study whose primary endpoint,
frontier and export read it."""

import json
import os
import types

import jax
import ml_collections
import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.records import read_jsonl
from sera_jax.rl import evaluate as eval_lib
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import config as config_lib
from sera_jax.studies.paired import evaluation, recompute, spec, validity
from sera_jax.studies.paired import frontier as fr
from sera_jax.studies.paired.export import export_results
from sera_jax.tasks import maze as maze_lib
from tests import util

ROOT = util.ROOT


def load(name):
    return config_files.get_config(os.path.join(ROOT, "configs", name))


def sealed_config(sealed=True):
    """configs/maze/tiny.py on 7x7 mazes (5x5 has only 4: none left to seal), uniform and GRPO
    (the same allocator: one compiled allocation) with one seed and no controls; with
    `sealed`, 2 sealed test mazes scored at every point and the primary endpoint read on
    them."""
    cfg = load("maze/tiny.py")
    t = cfg.task
    t.size, t.num_train, t.num_eval, t.num_sft = 7, 4, 2, 4
    t.max_new_tokens = maze_lib.max_answer_length(7)
    cfg.eval.num_prompts = cfg.eval.train_prompts = 2
    # Fast: points 0 and 2 only, checkpoints at those points only, no noise-key rescoring.
    cfg.rl.num_steps, cfg.rl.checkpoint_every, cfg.eval.every = 2, 0, 0
    cfg.eval.paired_noise = False
    cfg.compare.methods, cfg.compare.seeds = ("uniform", "grpo"), (0,)
    cfg.compare.primary.method = "grpo"
    cfg.compare.null, cfg.compare.aa = False, False
    cfg.frontier.learning_rates = (cfg.rl.optimizer.learning_rate,)  # the workdir's runs
    cfg.frontier.methods, cfg.frontier.seeds = ("uniform", "grpo"), (0,)
    cfg.frontier.null, cfg.frontier.null_seeds = False, ()
    if sealed:
        t.num_test, t.test_seed = 2, 99
        cfg.eval.test_prompts = 2
        cfg.compare.primary.split = "test"
    return cfg


def with_field(cfg, path, value):
    """`cfg` with `path` set to `value` of any type (a user's config file may hold one)."""
    d = cfg.to_dict()
    *parents, last = path.split(".")
    node = d
    for key in parents:
        node = node[key]
    node[last] = value
    return ml_collections.ConfigDict(d)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("field,value,match", [
    ("task.num_test", -1, "task.num_test"),
    ("task.num_test", 1.5, "task.num_test"),
    ("task.num_test", True, "task.num_test"),
    ("task.test_seed", None, "task.test_seed"),
    ("task.test_seed", 0, "task.test_seed"),  # = task.seed
    ("task.test_seed", "9", "task.test_seed"),
    ("eval.test_prompts", 3, r"eval.test_prompts.*<= task.num_test=2"),
    ("eval.test_prompts", -1, "eval.test_prompts"),
])
def test_bad_sealed_split_fields_are_refused_naming_the_field(field, value, match):
    cfg = with_field(sealed_config(), field, value)
    with pytest.raises(common.StudyError, match=match):
        config_lib.validate(cfg, ["uniform", "grpo"], [0])


def test_a_primary_on_test_needs_a_scored_sealed_split():
    config_lib.validate(sealed_config(), ["uniform", "grpo"], [0])
    cfg = sealed_config()
    cfg.eval.test_prompts = 0
    with pytest.raises(common.StudyError, match=r"compare.primary.split.*eval.test_prompts = 0"):
        config_lib.validate(cfg, ["uniform", "grpo"], [0])
    cfg = sealed_config(sealed=False)
    cfg.compare.primary.split = "test"
    with pytest.raises(common.StudyError, match=r"compare.primary.split.*no sealed test split"):
        config_lib.validate(cfg, ["uniform", "grpo"], [0])
    cfg = sealed_config(sealed=False)
    cfg.eval.test_prompts = 2
    with pytest.raises(common.StudyError, match="eval.test_prompts.*no sealed test split"):
        config_lib.validate(cfg, ["uniform", "grpo"], [0])
    # A kind without a sealed split (the math kind): one error naming the field and the fix.
    math = load("math/smollm2_arith.py")
    math.compare.primary.split = "test"
    with pytest.raises(common.StudyError, match=r"compare.primary.split.*the math task of this "
                                                r"config has no sealed test split.*num_test"):
        config_lib.validate(math, ["uniform", "sera"], [0])


def test_the_start_and_every_existing_fingerprint_ignore_an_unscored_sealed_split():
    # An SFT trained under cpu_read.py is the start of a config that adds a sealed split.
    read = load("maze/cpu_read.py")
    sealed = load("maze/cpu_read.py")
    sealed.task.num_test, sealed.task.test_seed = 128, 7
    assert spec.start_fingerprint(sealed) == spec.start_fingerprint(read)
    assert "num_test" not in json.dumps(spec.start_fingerprint(sealed))
    # Declared but not scored: runs, cached scorings and the comparison are unchanged.
    method = spec.run_config(read, "uniform", 0)
    assert spec.rl_fingerprint(sealed, method, 3) == spec.rl_fingerprint(read, method, 3)
    assert evaluation._eval_fingerprint(sealed) == evaluation._eval_fingerprint(read)
    assert spec.comparison_spec(sealed) == spec.comparison_spec(read)
    # Scored: what is measured names the sealed split (its seed too), the start still not.
    sealed.eval.test_prompts = 64
    assert spec.start_fingerprint(sealed) == spec.start_fingerprint(read)
    fp = spec.rl_fingerprint(sealed, method, 3)["eval"]
    assert fp["test_prompts"] == 64 and fp["test_split"] == {"num_test": 128, "test_seed": 7}
    assert evaluation._eval_fingerprint(sealed)["test_split"]["test_seed"] == 7


def test_an_evaluation_record_scores_the_sealed_split_with_its_own_keys(monkeypatch):
    cfg = sealed_config()
    task = spec.build_task(cfg)
    calls = []

    def fake(model, task, split, *, num_samples, key, prompt_ids, **kwargs):
        calls.append((split, tuple(prompt_ids.tolist()), jax.random.key_data(key).tolist()))
        c = np.arange(prompt_ids.size) % (num_samples + 1)
        return types.SimpleNamespace(num_samples=num_samples, num_correct=c,
                                     summary={"mean_length": 3.0})

    monkeypatch.setattr(eval_lib, "evaluate", fake)
    rec = evaluation.evaluate_policy(None, task, cfg, 4, 2, None, seed=5)
    assert [s for s, _, _ in calls] == ["eval", "train", "test"]
    assert rec["test"]["num_correct"] == [0, 1] and rec["test"]["num_samples"] == 4
    keys = {s: k for s, _, k in calls}
    assert len({json.dumps(k) for k in keys.values()}) == 3  # three independent key sets
    want = jax.random.fold_in(jax.random.fold_in(jax.random.key(5), 2), 2)
    assert keys["test"] == jax.random.key_data(want).tolist()
    assert keys["test"] == jax.random.key_data(spec.eval_key(5, 2, "test")).tolist()
    # The same point's keys for every policy (a function of seed, step and split only).
    calls.clear()
    evaluation.evaluate_policy(None, task, cfg, 4, 2, None, seed=5)
    assert {s: k for s, _, k in calls} == keys
    # Without eval.test_prompts nothing reads the sealed split.
    calls.clear()
    cfg.eval.test_prompts = 0
    assert "test" not in evaluation.evaluate_policy(None, task, cfg, 4, 2, None, seed=5)
    assert [s for s, _, _ in calls] == ["eval", "train"]


def test_the_validity_gate_of_a_primary_on_test_reads_the_sealed_split(monkeypatch, tmp_path):
    cfg = sealed_config()
    cfg.compare.allow_blind_task = False
    good = {"passes": True, "reasons": [], "line": "reads", "override": False}
    bad = {"passes": False, "reasons": ["blind pass@8 too high"], "line": "guesses",
           "override": False}
    rec = {**good, "allow_blind_task": False, "test": bad, "gate_split": "test"}
    monkeypatch.setattr(validity, "validity_record", lambda cfg, sft_dir: rec)
    with pytest.raises(common.StudyError, match="blind pass@8 too high"):
        validity.require_readable(cfg, str(tmp_path), "--stage=rl")
    rec = {**bad, "allow_blind_task": False, "test": good}  # primary on 'eval': eval gates
    with pytest.raises(common.StudyError, match="blind pass@8 too high"):
        validity.require_readable(cfg, str(tmp_path), "--stage=rl")
    rec = {**bad, "allow_blind_task": False, "test": good, "gate_split": "test"}
    assert validity.require_readable(cfg, str(tmp_path), "--stage=rl") is rec


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def sealed_study(tmp_path_factory):
    """The SFT trained under the config without a sealed split, then the sealed config's
    start stage (reusing it), comparison and one-lr frontier, as an exploration."""
    plain, cfg = sealed_config(sealed=False), sealed_config()
    work = str(tmp_path_factory.mktemp("sealed"))
    sft_dir = os.path.join(work, "sft")
    os.makedirs(sft_dir)
    study.get_kind(plain).train_start(plain, sft_dir, study.make_mesh(plain), work)
    trained = read_jsonl(os.path.join(sft_dir, "train.jsonl"))
    study.run(cfg, work, "sft")
    assert read_jsonl(os.path.join(sft_dir, "train.jsonl")) == trained  # not trained again
    table = study.run(cfg, work, "compare")
    fout = study.run(cfg, work, "frontier")
    return cfg, work, table, fout


def test_the_comparison_reads_its_primary_on_the_sealed_split(sealed_study):
    cfg, work, table, _ = sealed_study
    assert table["exploratory"] and table["primary"]["split"] == "test"
    cur = table["curves"]
    d = cur["differences"]["grpo − uniform"]
    assert set(d) >= {"eval", "train", "test"}
    assert table["primary"]["estimate"] == d["test"]["window"][str(cfg.compare.primary.k)]
    # The sealed split answers the primary endpoint only: no secondary endpoint reads it.
    assert not [k for k in cur["secondary"]["endpoints"] if "| test |" in k]
    assert any("| eval |" in k for k in cur["secondary"]["endpoints"])
    # Every policy at every point was scored on it, the start with the same keys.
    for run in (study.run_dir(work, "grpo", 0), study.run_dir(work, "uniform", 0)):
        recs = read_jsonl(os.path.join(run, "eval.jsonl"))
        assert all(len(r["test"]["num_correct"]) == 2 for r in recs)
    crn = os.listdir(os.path.join(work, "sft", "crn"))
    assert crn and all("test" in json.load(open(os.path.join(work, "sft", "crn", f)))
                       for f in crn)
    # Final-point tables, the noise floor and the blind control beside the held-out ones.
    assert table["num_prompts"]["test"] == 2 and "test" in table["noise_floor"]
    assert "test" in table["paired"]["grpo"] and "test" in table["vs_sft"]["uniform"]
    assert set(table["methods"]["grpo"]["test_pass_at_k"]) == set(table["sft"]["pass_at_k"])
    v = table["validity"]
    assert v["gate_split"] == "test" and v["test"]["num_prompts"] == 2
    assert table["blind"]["test_pass_at_k"] == v["test"]["blind_pass_at_k"]
    md = open(os.path.join(work, "results", "comparison.md")).read()
    assert "grpo − uniform on sealed test pass@" in md
    assert "Paired differences on sealed test mazes" in md and "Sealed test split" in md


def test_the_frontier_reads_the_sealed_split_and_keeps_the_held_out_points(sealed_study):
    cfg, _, table, fout = sealed_study
    k, window = int(cfg.compare.primary.k), int(cfg.compare.primary.window)
    assert fout["split"] == "test" and fout["metric"].startswith("sealed test pass@1")
    (entry,) = fout["lrs"].values()
    for arm in ("uniform", "grpo"):
        test_v = table["curves"]["per_seed"][arm]["0"]["test"]["pass_at_k"][str(k)]
        eval_v = table["curves"]["per_seed"][arm]["0"]["eval"]["pass_at_k"][str(k)]
        assert entry["points"][arm][f"pass@{k}"]["mean"] == pytest.approx(
            np.mean(test_v[-window:]))
        assert entry["points_eval"][arm][f"pass@{k}"]["mean"] == pytest.approx(
            np.mean(eval_v[-window:]))
    sft = table["curves"]["sft"]
    assert fout["sft"]["pass@1"] == pytest.approx(np.mean(sft["test"]["pass_at_k"]["1"][-window:]))
    assert fout["sft_eval"]["pass@1"] == pytest.approx(
        np.mean(sft["eval"]["pass_at_k"]["1"][-window:]))
    assert fout["blind"] == fr.blind_point(table, k, "test")
    assert fout["blind_eval"] == fr.blind_point(table, k)
    assert "Beside them, on the held-out mazes" in fr.frontier_markdown(fout)


def test_export_and_recompute_rebuild_the_sealed_split(sealed_study, tmp_path):
    cfg, work, _, _ = sealed_study
    folder = export_results(cfg, work, out_dir=str(tmp_path / "export"))["dir"]
    with np.load(os.path.join(folder, "counts.npz")) as z:
        keys = set(z.files)
    assert "blind_q_test" in keys and "run/grpo/0/final/test" in keys
    assert "run/uniform/0/curve/test" in keys and f"sft/0_8_{cfg.eval.seed}/test" in keys
    got = recompute.recompute(folder)
    for name, out in (("comparison", got["comparison"]), ("frontier", got["frontier"])):
        saved = json.load(open(os.path.join(folder, f"{name}.json")))
        # (`exploratory` is the aggregate's stamp, not a number: an export of an
        # exploration is this test's own, the study refuses it)
        assert recompute.compare_numbers(out, {k: v for k, v in saved.items() if k not in (
            "preregistration", "exploratory")}) == []
    assert got["frontier"]["split"] == "test" and "points_eval" in got["frontier"]["lrs"][
        next(iter(got["frontier"]["lrs"]))]
    # The sealed counts are read: a changed test count changes the primary endpoint.
    counts = recompute.read_counts(os.path.join(folder, "counts.npz"))
    key = "run/grpo/0/curve/test"
    counts[key] = np.where(counts[key] < 8, counts[key] + 1, counts[key] - 1).astype(np.int16)
    data = recompute.load_data(cfg, counts, got["comparison"])
    table = study.build_table(cfg, data, ["uniform", "grpo"])
    assert table["primary"]["estimate"] != got["comparison"]["primary"]["estimate"]
