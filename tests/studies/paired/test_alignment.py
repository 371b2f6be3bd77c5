"""The maze alignment stage (`sera_jax.studies.paired.alignment`): the reference agrees with an
exactly enumerated likelihood gradient on a one-token toy task and sharpens with N_ref, SERA
with N_q = N0 everywhere is uniform exactly, and the stage runs end to end on the tiny maze,
caching each repetition."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sera_jax import config_files
from sera_jax.checkpoint import Checkpointer
from sera_jax.metrics import cosine
from sera_jax.models.logprobs import token_logprobs
from sera_jax.sampling import left_pad
from sera_jax.studies import common
from sera_jax.studies.paired import alignment as al
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    build_model,
    build_task,
    make_mesh,
    rl_fingerprint,
    run_config,
)
from sera_jax.tasks.base import RLTask
from tests import util


def _tiny(**alignment) -> ml_collections.ConfigDict:
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", "tiny.py"))
    cfg.rl.share_prompt_prefix = False  # fewer compiled shapes (same gradient, tested)
    cfg.rl.train_length_bucket = 0
    for k, v in alignment.items():
        cfg.alignment[k] = v
    return cfg


class FirstToken(RLTask):
    """Prompt q (of 2) succeeds when its one generated token is among `targets(q)` (2 or 8
    of the 32 tokens): p_q = Σ_{t ∈ S_q} π(t|q), so ∇ log p_q can be enumerated exactly."""

    pad_id, stop_ids, max_prompt_len, max_new_tokens = 0, (2,), 3, 1

    def split_size(self, split):
        return 2

    def prompt_tokens(self, split, ids):
        return [np.asarray([1, 5 + i, 9 + i], np.int32) for i in ids]

    @staticmethod
    def targets(q):
        return list(range(14, 14 + 2 ** (2 * int(q) + 1)))

    def score(self, split, ids, completions, truncated):
        return np.asarray([float(len(c) > 0 and int(c[0]) in self.targets(q))
                           for q, c in zip(ids, completions)], np.float32)


def exact_gradient(model, task, ids, vocab):
    """(1/P) Σ_q ∇ log Σ_{t ∈ S_q} π(t|q), every token enumerated."""
    graphdef, params = nnx.split(model)
    prompts, pmask = left_pad(task.prompt_tokens("train", ids), task.max_prompt_len,
                              task.pad_id)
    rows = np.repeat(np.arange(len(ids)), vocab)
    tokens = np.concatenate([prompts[rows], np.tile(np.arange(vocab), len(ids))[:, None]], 1)
    mask = np.concatenate([pmask[rows], np.ones((len(rows), 1), bool)], 1)
    hit = np.asarray([[t in task.targets(q) for t in range(vocab)] for q in ids])

    def objective(p):
        lp = token_logprobs(nnx.merge(graphdef, p), jnp.asarray(tokens), jnp.asarray(mask),
                            start=task.max_prompt_len)[:, 0].reshape(len(ids), vocab)
        return jnp.mean(jax.nn.logsumexp(jnp.where(hit, lp, -jnp.inf), axis=1))

    return jax.jit(jax.grad(objective))(params)


@pytest.fixture(scope="module")
def toy():
    cfg = _tiny(reference_samples=256, sample_rows=16, repetitions=2)
    s, resolved = al.validate(cfg)
    mesh = make_mesh(cfg)
    model, task = build_model(cfg, mesh), FirstToken()
    return cfg, s, al.Bench.build(cfg, task, model, mesh, s, resolved), model, task


def test_reference_matches_the_enumerated_likelihood_gradient_and_sharpens(toy):
    cfg, s, bench, model, task = toy
    ids = np.arange(2)
    tr = bench.reference
    state = al.host_params(tr, nnx.state(model))
    ref = tr.collect_round(state, al.empty_history(tr), ids, 0, 0, jax.random.key(3))
    k = np.bincount(ref.segment_ids, weights=ref.rewards, minlength=2)
    assert (k > 0).all() and (k < 256).all()  # every prompt covered, p spread
    exact = exact_gradient(model, task, ids, model.cfg.vocab_size)
    g = al.gradient(tr, state, ref)
    ratio = float(jnp.sqrt(sum(jnp.vdot(x, x) for x in jax.tree.leaves(g)))
                  / jnp.sqrt(sum(jnp.vdot(x, x) for x in jax.tree.leaves(exact))))
    est = tr.method.estimator
    cut = al.restrict(ref, np.asarray([True, False]))  # prompt 1 left out, prompt 0 kept
    first = ref.segment_ids == 0
    assert (cut.advantages[~first] == 0).all()
    np.testing.assert_array_equal(cut.advantages[first], ref.advantages[first])
    few = al.gradient(tr, state, al.subset(ref, 0, 16, est))
    assert float(cosine(g, exact)) > 0.9 > float(cosine(few, exact))  # units: score sum
    assert 0.8 < ratio < 1.25
    # The noise ceiling rises with N_ref: halves of 8 vs halves of 128.
    small = cosine(*(al.gradient(tr, state, al.subset(ref, lo, lo + 8, est)) for lo in (0, 8)))
    large = cosine(*(al.gradient(tr, state, al.half(ref, i, est)) for i in (0, 1)))
    assert float(large) > float(small) and float(large) > 0.8


def test_sera_with_n0_everywhere_is_uniform_exactly(toy):
    cfg, s, bench, model, task = toy
    ids, key = np.arange(2), jax.random.key(7)
    grads = {}
    for name, tr in bench.methods.items():
        state = al.host_params(tr, nnx.state(model))
        # Equal p̂ (every prompt active, the waterline at N0) and an empty history (unseen:
        # N0 each) both give N_q = N0 = 8 and w_q = 1: the same rows, the same gradient.
        for h in (al.oracle_history(al.empty_history(tr), ids, np.full(2, 0.5)),
                  al.empty_history(tr)):
            r = tr.collect_round(state, h, ids, 0, 0, key)
            assert r.counts.tolist() == [8, 8] and (r.prompt_weights == 1).all()
            grads.setdefault(name, []).append(al.gradient(tr, state, r))
    for a, b in zip(jax.tree.leaves(grads["uniform"]), jax.tree.leaves(grads["sera"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_repetition_is_a_keyed_record(toy):
    cfg, s, bench, model, task = toy
    history = al.oracle_history(al.empty_history(bench.uniform), np.arange(2),
                                np.asarray([0.9, 0.02]))
    rec = al.measure_repetition(bench, nnx.state(model), 0, history)
    assert set(rec["estimators"]) == {"uniform", "sera:history", "sera:oracle"}
    keys = al.repetition_keys(s["seed"], 0)
    assert rec["keys"]["reference"] == al.key_data(keys["reference"])
    assert rec["prompt_ids"] == [0, 1] and rec["reference"]["uncovered"] == 0
    for e in rec["estimators"].values():
        assert -1 <= e["cosine"] <= 1 and e["norm_ratio"] >= 0 and sum(e["counts"]) == 16
        assert e["cosine"] == e["cosine_all"]  # every prompt covered
    assert rec["estimators"]["sera:history"]["counts"] == [2, 14]  # p̂ moved the budget
    json.dumps(rec)  # JSON-able as stored


def test_the_stage_runs_end_to_end_and_caches_each_repetition(tmp_path, monkeypatch):
    cfg = _tiny(reference_samples=8, repetitions=2, warmup_epochs=1, sample_rows=16)
    work = str(tmp_path)
    mesh = make_mesh(cfg)
    cfg.sft.num_steps, cfg.sft.warmup_steps = 1, 0
    get_kind(cfg).train_start(cfg, os.path.join(work, "sft"), mesh, work)
    # A checkpoint of the uniform run, as the loop writes it, with a history of its own.
    s, resolved = al.validate(cfg)
    bench = al.Bench.build(cfg, build_task(cfg), build_model(cfg, mesh), mesh, s, resolved)
    rl = run_config(cfg, "uniform", 0)
    state = bench.uniform.init_state(bench.model)
    state = state.replace(history=al.oracle_history(state.history, np.arange(2),
                                                    np.asarray([0.3, 0.6])))
    with Checkpointer(os.path.join(work, "rl", "uniform", "seed0", "checkpoints")) as ck:
        ck.save(3, state, {"step": 3, "fingerprint": rl_fingerprint(cfg, rl, 1)})
    result = al.run(cfg, work)
    names = [p["name"] for p in result["policies"]]
    assert names == ["start", "uniform_seed0_step3"]
    assert [p["history_source"] for p in result["policies"]] == [
        "warm-up (1 epochs)", "checkpoint"]
    saved = json.load(open(os.path.join(work, "results", "alignment.json")))
    assert saved["policies"][1]["repetitions"][1]["repetition"] == 1
    assert "Paired difference" in open(os.path.join(work, "results", "alignment.md")).read()
    # A re-run reads every repetition from its cache; a bad field is refused by name.
    monkeypatch.setattr(al, "measure_repetition", lambda *a: pytest.fail("recomputed"))
    assert al.run(cfg, work)["policies"][0]["summary"]["repetitions"] == 2
    cfg.alignment.reference_samples = 7
    with pytest.raises(common.StudyError, match="alignment.reference_samples"):
        al.run(cfg, work)


@pytest.mark.parametrize("name", ["cpu.py", "cpu_16step.py"])
def test_the_base_configs_hold_the_defaults(name):
    cfg = config_files.get_config(os.path.join(util.ROOT, "configs", "maze", name))
    assert al.settings(cfg) == al.DEFAULTS
