"""The update mechanism (`paired.mechanism`): parameter distance, KL(π_t ‖ π_start) against an
enumerated KL, the per-run summaries, and a tiny maze run that records them at every point."""

from __future__ import annotations

import itertools
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from sera_jax import config_files
from sera_jax.records import read_jsonl, write_jsonl
from sera_jax.sampling import SamplingConfig, left_pad
from sera_jax.studies import common
from sera_jax.studies import paired as study
from sera_jax.studies.paired import mechanism as mech
from sera_jax.studies.paired import spec
from tests import util
from tests.rl.toy import PAD, STOP, VOCAB, EmitTask, tiny_model


def _perturbed(model, scale, seed=7):
    """A copy of `model` with Gaussian noise of std `scale` added to every parameter."""
    graphdef, params = nnx.split(model)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(tree, noisy))


def _prompts(task, ids):
    return left_pad(task.prompt_tokens("eval", list(ids)), task.max_prompt_len, task.pad_id)


def test_parameter_distance_is_the_global_norm_of_the_difference():
    start = tiny_model(seed=0)
    moved = _perturbed(start, 0.1)
    out = mech.parameter_distance(nnx.state(moved), nnx.state(start))
    a = [np.asarray(x, np.float64) for x in jax.tree.leaves(nnx.state(moved))]
    b = [np.asarray(x, np.float64) for x in jax.tree.leaves(nnx.state(start))]
    dist = np.sqrt(sum(np.sum((x - y) ** 2) for x, y in zip(a, b)))
    ref = np.sqrt(sum(np.sum(y ** 2) for y in b))
    np.testing.assert_allclose(out["param_distance"], dist, rtol=1e-5)
    np.testing.assert_allclose(out["param_distance_rel"], dist / ref, rtol=1e-5)
    assert mech.parameter_distance(nnx.state(start), nnx.state(start))["param_distance"] == 0


def test_kl_estimate_formulas():
    out = mech.kl_estimate(np.array([-1.0, -2.0, -3.0]), np.array([-1.5, -2.0, -4.0]),
                           np.array([2, 1, 3]))
    d = np.array([0.5, 0.0, 1.0])
    assert out["kl"] == pytest.approx(d.mean())
    assert out["kl_se"] == pytest.approx(d.std(ddof=1) / np.sqrt(3))
    assert out["kl_per_token"] == pytest.approx(1.5 / 6)
    assert (out["kl_sequences"], out["kl_tokens"]) == (3, 6)


def test_kl_is_zero_for_the_start_and_positive_after_a_change():
    task = EmitTask({"train": 4, "eval": 4})
    start = tiny_model(seed=0)
    prompts, pmask = _prompts(task, range(4))
    kw = dict(prompt_ids=np.arange(4), num_samples=8, key=jax.random.key(3), batch_size=16,
              sampling=SamplingConfig(max_new_tokens=3, stop_ids=(STOP,), pad_id=PAD))
    same = mech.policy_kl(start, start, prompts, pmask, **kw)
    assert same["kl"] == 0.0 and same["kl_per_token"] == 0.0 and same["kl_sequences"] == 32
    moved = mech.policy_kl(_perturbed(start, 0.5), start, prompts, pmask, **kw)
    assert moved["kl"] > 0 and moved["kl_se"] > 0 and moved["kl_tokens"] > 32


def _enumerated(max_new):
    """Every completion of at most `max_new` tokens: it ends at the first STOP or at the cap
    (tokens, mask), padded with PAD."""
    seqs = []
    for n in range(1, max_new + 1):
        for ys in itertools.product(range(VOCAB), repeat=n):
            if STOP in ys[:-1] or (n < max_new and ys[-1] != STOP):
                continue
            seqs.append(list(ys))
    tokens = np.full((len(seqs), max_new), PAD, np.int32)
    mask = np.zeros((len(seqs), max_new), bool)
    for i, ys in enumerate(seqs):
        tokens[i, :len(ys)], mask[i, :len(ys)] = ys, True
    return tokens, mask


def test_kl_estimate_agrees_with_the_enumerated_kl():
    """Two prompts, completions of <= 2 tokens over a vocabulary of 8 (57 sequences each),
    temperature 0.7: the exact KL of the tempered sequence distributions by enumeration
    (whose probabilities sum to 1) equals the Monte Carlo estimate within 4 standard errors
    -- which also checks that the sampler draws from the tempered policy that is scored."""
    task = EmitTask({"train": 2, "eval": 2})
    start = tiny_model(seed=0)
    policy = _perturbed(start, 0.4)
    prompts, pmask = _prompts(task, range(2))
    temp = 0.7
    tokens, mask = _enumerated(2)
    exact = []
    for q in range(2):
        comp = mech.Completions(np.full(len(tokens), q), tokens, mask, mask.sum(1))
        lp = mech.sequence_logprobs(policy, prompts, pmask, comp, temperature=temp,
                                    batch_size=64)
        lp0 = mech.sequence_logprobs(start, prompts, pmask, comp, temperature=temp,
                                     batch_size=64)
        np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=1e-5)
        np.testing.assert_allclose(np.exp(lp0).sum(), 1.0, rtol=1e-5)
        exact.append(float(np.sum(np.exp(lp) * (lp - lp0))))
    est = mech.policy_kl(policy, start, prompts, pmask, prompt_ids=np.arange(2),
                         num_samples=2048, key=jax.random.key(11), batch_size=1024,
                         sampling=SamplingConfig(max_new_tokens=2, temperature=temp,
                                                 stop_ids=(STOP,), pad_id=PAD))
    assert np.mean(exact) > 0.05, exact  # a real difference to estimate
    assert abs(est["kl"] - np.mean(exact)) < 4 * est["kl_se"], (est, exact)
    assert est["kl_se"] < 0.2 * np.mean(exact)


def _train(steps, clipped=None):
    return [{"step": s, "update_norm": 0.1 * s, "grad_norm": 1.0 + s,
             "clipped": (clipped or {}).get(s, 0.0)} for s in steps]


def test_summarise_run_means_windows_and_old_records():
    train = _train(range(1, 5), clipped={2: 1.0, 3: 1.0, 4: 1.0})
    evals = [{"step": 0}, {"step": 2, "mechanism": {"param_distance": 0.2, "kl": 0.01}},
             {"step": 4, "curve": True},
             {"step": 4, "mechanism": {"param_distance": 0.3, "param_distance_rel": 0.1,
                                       "kl": 0.02, "kl_se": 0.001, "kl_per_token": 0.004}}]
    out = mech.summarise_run(train, evals)
    assert out["steps"] == 4 and out["clip_rate"] == 0.75
    assert out["update_norm_mean"] == pytest.approx(0.25) and out["grad_norm_mean"] == 3.5
    first, second = out["points"]
    assert (first["step"], first["window"], first["clip_rate"]) == (2, [0, 2], 0.5)
    assert first["update_norm_mean"] == pytest.approx(0.15) and first["kl_se"] is None
    assert (second["window"], second["clip_rate"], second["kl"]) == ([2, 4], 1.0, 0.02)
    # Records from before the fields existed: no summary.
    assert mech.summarise_run([{"step": 1, "grad_norm": 1.0}], evals) is None
    both = mech.mean_over_seeds({"0": out, "1": {**out, "clip_rate": 0.25, "points": [second]}})
    assert both["clip_rate"] == 0.5 and both["seeds"] == 2
    assert [p["step"] for p in both["points"]] == [4]  # the steps every seed has


def test_write_summary_writes_the_tables_and_skips_old_runs(tmp_path):
    work = str(tmp_path)
    arms = [("uniform", [0, 1]), ("sera", [0]), ("null", [0])]
    for arm, seed, new in (("uniform", 0, True), ("uniform", 1, True), ("sera", 0, True),
                           ("null", 0, False)):
        d = spec.run_dir(work, arm, seed)
        os.makedirs(d)
        train = _train([1, 2]) if new else [{"step": s, "grad_norm": 1.0} for s in (1, 2)]
        write_jsonl(os.path.join(d, "train.jsonl"), train)
        write_jsonl(os.path.join(d, "eval.jsonl"), [{"step": 0}] + (
            [{"step": 2, "mechanism": {"param_distance": 0.1 + seed, "kl": 0.01}}]
            if new else [{"step": 2}]))
    assert mech.write_summary(str(tmp_path / "none"), work, [("null", [0])]) is None
    out = mech.write_summary(work, work, arms, exploratory=True)
    assert set(out["arms"]) == {"uniform", "sera"} and out["exploratory"]
    assert out["arms"]["uniform"]["mean"]["points"][0]["param_distance"] == pytest.approx(0.6)
    saved = json.load(open(os.path.join(work, "mechanism.json")))
    assert saved == json.loads(json.dumps(out))
    md = open(os.path.join(work, "mechanism.md")).read()
    assert md.startswith("**Exploratory") and "| uniform | 2 |" in md and "| sera | 2 |" in md


def test_kl_fields_stay_out_of_the_fingerprint_at_their_defaults():
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    base = spec.rl_fingerprint(cfg, spec.run_config(cfg, "uniform", 0), 3)
    assert cfg.eval.kl_prompts == mech.KL_PROMPTS and "kl_prompts" not in base["eval"]
    del cfg.eval["kl_prompts"], cfg.eval["kl_samples"]  # a config from before the fields
    assert spec.rl_fingerprint(cfg, spec.run_config(cfg, "uniform", 0), 3) == base
    assert mech.kl_settings(cfg) == (1, 8)  # min(32, eval.num_prompts = 1) prompts
    cfg.eval.kl_prompts = 0
    assert spec.rl_fingerprint(cfg, spec.run_config(cfg, "uniform", 0), 3)["eval"][
        "kl_prompts"] == 0
    cfg.eval.kl_samples = 0
    with pytest.raises(common.StudyError, match="eval.kl_samples"):
        study.validate(cfg, ["uniform"], [0])


def test_a_tiny_maze_run_records_the_mechanism_at_every_evaluation_point(tmp_path):
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    work = str(tmp_path)
    study.run(cfg, work, "sft", ["uniform"], [0])
    study.stage_rl(cfg, work, "uniform", 0, study.make_mesh(cfg))
    d = study.run_dir(work, "uniform", 0)
    train = read_jsonl(os.path.join(d, "train.jsonl"))
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        assert r["update_norm"] > 0 and r["clipped"] == float(
            r["grad_norm"] > cfg.rl.optimizer.grad_clip)
    evals = read_jsonl(os.path.join(d, "eval.jsonl"))
    points = {r["step"]: r["mechanism"] for r in evals if "mechanism" in r}
    assert sorted(points) == [t for t in spec.eval_steps(cfg) if t > 0] == [2, 3]
    assert "mechanism" not in evals[0]  # step 0: the start itself
    for m in points.values():
        assert m["param_distance"] > 0 and 0 < m["param_distance_rel"] < 1
        assert np.isfinite(m["kl"]) and m["kl_sequences"] == 8 and m["kl_samples"] == 8
    # The distance after 3 steps is at most the sum of the 3 updates' norms.
    assert points[3]["param_distance"] <= sum(r["update_norm"] for r in train) * (1 + 1e-5)
    out = mech.write_summary(work, work, [("uniform", [0])])
    assert [p["step"] for p in out["arms"]["uniform"]["mean"]["points"]] == [2, 3]
