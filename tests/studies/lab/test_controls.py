"""Controls and known-answer checks of the lab (issue 25).

* the null arm: shuffled rewards keep the batch's rewards, are a pure function of the step
  key, and carry no reward signal (its expected update is ≈ 0, uniform's is not);
* the A/A arm differs from uniform only in its rollout key;
* the lr gate fails on a run that does not learn (lr = 0) and passes on a clear effect;
* SERA's allocation and update equal uniform's when every κ ≈ 1;
* a planted never-solved prompt stays in SERA's active set forever at θ = 0.05 (the floor
  u → 1 − e^(−α(1−γ)) = 0.1175 > θ) and leaves it at θ = 0.2 > 0.1175;
* Monte Carlo: the allocated batch's expected gradient is (1/P) Σ_q (w_q N_q/N0) κ_q ∇log p_q
  (SERA_SPEC §2-3), with the multiplicity correction (w_q N_q/N0 = 1) and without (N_q/N0).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import methods, scaling
from sera_jax.studies.lab import study, train
from sera_jax.studies.lab import task as task_lib
from tests.studies.lab.test_study import _tiny

SETUP = train.Setup(num_train=8, num_test=8, num_answers=6, feature_dim=4, num_skills=2,
                    prompts_per_step=8, n0=8, n_min=2, n_max=32, num_steps=4, eval_every=2,
                    optimizer=(("learning_rate", 0.1),), ks=(1, 4))


@pytest.fixture(scope="module")
def one_seed():
    """(train split, params with a non-trivial policy) of one seed of the `uniform` law."""
    tr, _, params = jax.tree.map(lambda x: x[0], train.make_tasks(SETUP, 0, (0,), "uniform"))
    params = {"linear": jnp.linspace(-0.5, 0.5, params["linear"].shape[0])}
    return tr, params


def _grads(method, params, tr, p_hat, n, shuffle=False, setup=SETUP):
    """[n] flattened batch gradients (minus the loss gradient: the policy gradient) over n
    independent rollout streams, all prompts of the split in the batch."""
    ids = jnp.arange(setup.num_train)
    post = (jnp.ones(setup.num_train), jnp.ones(setup.num_train))

    def one(key):
        u = jax.random.uniform(key, (setup.num_train, setup.n_max))
        sk = jax.random.fold_in(key, train.NULL_TAG) if shuffle else None
        g, _, aux = train.batch_gradient(method, setup, params, tr, ids, p_hat, post, u, sk)
        return -g["linear"], aux["plan"].counts, aux["plan"].prompt_weights

    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(1), n))


def _per_prompt_grads(params, tr):
    """∇ log p_q for every prompt [M, D] and p [M], exact."""
    jac = jax.jacobian(lambda q: task_lib.log_success_probs(q, tr))(params)["linear"]
    return np.asarray(jac, np.float64), np.asarray(task_lib.success_probs(params, tr))


# ----------------------------------------------------------------------------- null arm


def test_null_shuffle_keeps_the_rewards_and_is_a_function_of_the_step_key(one_seed):
    tr, params = one_seed
    ids, post = jnp.arange(8), (jnp.ones(8), jnp.ones(8))
    u = jax.random.uniform(jax.random.key(0), (8, SETUP.n_max))
    p_hat = jnp.full(8, jnp.nan)
    uni = methods.get_method("uniform")
    plain = train.batch_gradient(uni, SETUP, params, tr, ids, p_hat, post, u)[2]["rewards"]
    k = jax.random.key(5)
    a = train.batch_gradient(uni, SETUP, params, tr, ids, p_hat, post, u, k)[2]["rewards"]
    b = train.batch_gradient(uni, SETUP, params, tr, ids, p_hat, post, u, k)[2]["rewards"]
    c = train.batch_gradient(uni, SETUP, params, tr, ids, p_hat, post, u,
                             jax.random.key(6))[2]["rewards"]
    np.testing.assert_array_equal(np.sort(a), np.sort(plain))  # the batch's rewards, kept
    np.testing.assert_array_equal(a, b)  # pure function of the key
    assert 0 < plain.sum() < plain.size  # a mixed batch, so a shuffle can move rewards
    assert not np.array_equal(a, plain) and not np.array_equal(a, c)


def test_null_update_carries_no_reward_signal(one_seed):
    """Mean over 20,000 rollout streams: uniform's update is the predicted
    (1/P) Σ κ(p, N0) ∇log p (cosine > 0.99); the null's is ≈ 0: < 10 % of uniform's norm.
    (Not exactly 0: a rollout's own reward lands in its own group with probability N0/B.)"""
    tr, params = one_seed
    uni = methods.get_method("uniform")
    p_hat = jnp.full(8, jnp.nan)
    g_uni = np.asarray(_grads(uni, params, tr, p_hat, 20_000)[0], np.float64).mean(0)
    g_null = np.asarray(_grads(uni, params, tr, p_hat, 20_000, shuffle=True)[0],
                        np.float64).mean(0)
    jac, p = _per_prompt_grads(params, tr)
    pred = (np.asarray(scaling.kappa(p, SETUP.n0, 1))[:, None] * jac).mean(0)
    assert g_uni @ pred / np.linalg.norm(g_uni) / np.linalg.norm(pred) > 0.99
    assert np.linalg.norm(g_null) < 0.1 * np.linalg.norm(g_uni)


def test_null_run_sees_the_same_rewards_at_step_0():
    """The null runner is paired with uniform: same task, same first batch of rollouts (its
    mean reward at step 0 is uniform's), then it drifts without learning."""
    keys, tasks = train.seed_keys(0, (0, 1, 2)), train.make_tasks(SETUP, 0, (0, 1, 2), "maze")
    uni = train.Runner(methods.get_method("uniform"), SETUP)(keys, tasks)
    shared = train.Runner(methods.get_method("uniform"), SETUP, null_arm=True)
    null = shared(keys, tasks, null=True)
    j = train.STEP_METRICS.index("reward_mean")
    np.testing.assert_array_equal(null["steps"][:, 0, j], uni["steps"][:, 0, j])
    np.testing.assert_array_equal(null["pass_at_k"][:, 0], uni["pass_at_k"][:, 0])
    assert not np.array_equal(null["pass_at_k"][:, -1], uni["pass_at_k"][:, -1])
    # One program for uniform and its null (the switch is traced): with the switch off it
    # is the plain runner, bit for bit.
    plain = shared(keys, tasks)
    for k in uni:
        np.testing.assert_array_equal(plain[k], uni[k], err_msg=k)
    with pytest.raises(ValueError, match="null=True needs a runner built with null_arm"):
        train.Runner(methods.get_method("uniform"), SETUP)(keys, tasks, null=True)


# ----------------------------------------------------------------------------- A/A arm


def test_aa_arms_differ_only_in_their_rollout_key(monkeypatch):
    """The study's A/A arm (`cells.AA`) is uniform on rollout stream 1. (Seeds as in the
    null test above: the plain runner is one program for both.)"""
    seeds = (0, 1, 2)
    keys, tasks = train.seed_keys(0, seeds), train.make_tasks(SETUP, 0, seeds, "maze")
    uniform = methods.get_method("uniform")
    run = train.Runner(uniform, SETUP)
    a, b = run(keys, tasks, stream=0), run(keys, tasks, stream=1)
    np.testing.assert_array_equal(a["pass_at_k"][:, 0], b["pass_at_k"][:, 0])  # same init
    assert not np.array_equal(a["steps"], b["steps"])
    # With the rollout uniforms made independent of the rollout key, the streams coincide:
    # the A/A arm changes nothing else (task, init, data order, allocation, optimiser).
    fixed = lambda setup, k_roll, t: jax.random.uniform(
        jax.random.fold_in(jax.random.key(9), t), (setup.num_train, setup.n_max))
    monkeypatch.setattr(train, "rollout_uniforms", fixed)
    run = train.Runner(uniform, SETUP)
    a, b = run(keys, tasks, stream=0), run(keys, tasks, stream=1)
    assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
    k = jax.random.key(3)
    np.testing.assert_array_equal(jax.random.key_data(train.rollout_stream(k, 0)),
                                  jax.random.key_data(k))
    np.testing.assert_array_equal(jax.random.key_data(train.rollout_stream(k, 1)),
                                  jax.random.key_data(jax.random.fold_in(k, train.AA_TAG)))


def test_a_cell_compiles_one_runner_per_computation():
    """uniform, its null and its A/A arm share one compiled program, and so do SERA and its
    multiplicity ablation (traced switches); each arm equals its own plain runner bit for
    bit; a later cell without controls (the sweep's θ table) reuses the runners."""
    from sera_jax.studies.lab import cells

    runners, seeds, laws = {}, (0, 1), {"maze": "maze"}
    names = ["uniform", "sera", "sera_no_multiplicity"]
    out = cells.run_cell(names, SETUP, 0, seeds, laws, runners, controls=True)["maze"]
    assert list(out) == names + [cells.NULL, cells.AA]
    # (computation, null switch, multiplicity switch, fixed multiplicity, setup)
    assert sorted(k[1:4] for k in runners) == [(False, True, None), (True, False, True)]
    keys, tasks = train.seed_keys(0, seeds), train.make_tasks(SETUP, 0, seeds, "maze")
    for name in ("sera_no_multiplicity", "sera"):
        plain = train.Runner(cells.method_for(name), SETUP)(keys, tasks)
        for k in plain:
            np.testing.assert_array_equal(out[name][k], plain[k], err_msg=f"{name} {k}")
    assert not np.array_equal(out["sera"]["pass_at_k"], out["sera_no_multiplicity"]["pass_at_k"])
    again = cells.run_cell(["uniform", "sera"], SETUP, 0, seeds, laws, runners)["maze"]
    assert len(runners) == 2
    np.testing.assert_array_equal(again["sera"]["pass_at_k"], out["sera"]["pass_at_k"])
    j = train.STEP_METRICS.index("reward_mean")
    np.testing.assert_array_equal(out[cells.NULL]["steps"][:, 0, j],
                                  out["uniform"]["steps"][:, 0, j])
    assert not np.array_equal(out[cells.NULL]["steps"], out["uniform"]["steps"])
    with pytest.raises(ValueError, match="multiplicity=False needs a runner built with"):
        train.Runner(cells.method_for("sera"), SETUP)(keys, tasks, multiplicity=False)


# ----------------------------------------------------------------------------- the gate


def test_gate_fails_on_a_run_that_does_not_learn(tmp_path):
    c = _tiny()
    c.rl.optimizer.learning_rate = 0.0
    c.maze_family.enabled = c.maze_cell.enabled = c.regime.enabled = False
    out = study.run(c, str(tmp_path))
    assert out["gate"]["admissible"] is False
    assert out["gate"]["delta"]["mean"] == 0.0  # lr 0: every arm is the initial policy
    assert "NOT ADMISSIBLE" in out["summary"] and "A/A: aa − uniform" in out["summary"]
    assert out["gate"]["aa_false_positives"] == (0, 2 * 3)


def test_gate_passes_on_a_clear_effect():
    rng = np.random.default_rng(0)
    res = {n: {"pass_at_k": np.zeros((16, 2, 2, 1))} for n in ("uniform", study.NULL)}
    res["uniform"]["pass_at_k"][:, -1, 1, 0] = 0.3 + 0.01 * rng.standard_normal(16)
    res[study.NULL]["pass_at_k"][:, -1, 1, 0] = 0.1 + 0.01 * rng.standard_normal(16)
    g = study.gate(res, [1], "t")
    assert g["admissible"] and g["delta"]["lo"] > 15
    res["uniform"]["pass_at_k"][:, -1, 1, 0] = res[study.NULL]["pass_at_k"][:, -1, 1, 0] - 0.01
    assert not study.gate(res, [1], "t")["admissible"]


# ----------------------------------------------------------------------------- known answers


def test_sera_equals_uniform_when_every_kappa_is_1(one_seed):
    """p̂ = 1/2 for every prompt and N0 = 16: κ(1/2, 16) = 1 − 2^-15. SERA's leximin
    waterline gives equal λ equal counts, so N_q = N0 (every prompt is eligible: u(1/2, n_max)
    = 1 − 2^(1−n_max) > θ) and w_q = 1: the same rollouts and the same update, exactly."""
    tr, params = one_seed
    setup = SETUP.with_(n0=16, n_max=64)
    ids, post = jnp.arange(8), (jnp.ones(8), jnp.ones(8))
    u = jax.random.uniform(jax.random.key(0), (8, setup.n_max))
    p_hat = jnp.full(8, 0.5)
    out = {n: train.batch_gradient(methods.get_method(n), setup, params, tr, ids, p_hat, post,
                                   u) for n in ("uniform", "sera", "sera_equalized")}
    for n in ("sera", "sera_equalized"):
        np.testing.assert_array_equal(out[n][2]["plan"].counts, 16)
        np.testing.assert_array_equal(out[n][2]["plan"].prompt_weights, 1.0)
        np.testing.assert_array_equal(out[n][0]["linear"], out["uniform"][0]["linear"])
    assert float(scaling.kappa(0.5, 16, 1)) > 1 - 1e-4
    # Away from κ ≈ 1 they differ (so the check above is not vacuous).
    uneven = jnp.linspace(0.02, 0.9, 8)
    sera = train.batch_gradient(methods.get_method("sera"), setup, params, tr, ids, uneven,
                                post, u)
    assert not np.array_equal(sera[2]["plan"].counts, 16)


@pytest.mark.parametrize("theta, stays", [(0.05, True), (0.2, False)])
def test_a_never_solved_prompt_stays_active_at_theta_0_05(theta, stays):
    """One of 8 training prompts can never be solved (its correct answers have base logit
    −1e4: p = 0). P = 8 (every prompt every step, one step per epoch), n_max = 64, 48 epochs.
    κ(0, N) = 0, so the step's κ_min is 0 exactly when that prompt is active. At θ = 0.05
    it is active at every step, at n_max (leximin pins the minimum κ on it); at θ = 0.2 >
    0.1175 (the floor of u) it drops out once its failures have piled up (and comes back
    when, unvisited, they decay by γ per epoch: it is out at most steps, not at all)."""
    setup = SETUP.with_(n0=16, n_max=64, num_steps=48, eval_every=48)
    keys = train.seed_keys(0, (0, 1))
    tr, te, params = train.make_tasks(setup, 0, (0, 1), "uniform")
    base = tr.base_logits.at[:, 0].set(jnp.where(tr.correct[:, 0], -1e4, tr.base_logits[:, 0]))
    tr = tr.replace(base_logits=base)
    run = train.Runner(study.method_for("sera", theta), setup)(keys, (tr, te, params))
    kmin = run["steps"][..., train.STEP_METRICS.index("kappa_min")]
    if stays:
        assert (kmin == 0).all()
        assert (run["counts"].max(-1)[:, 1:] == setup.n_max).all()
    else:
        late = kmin[:, 16:] > 0  # dropped: every active prompt has κ > 0
        assert late.mean(axis=1).min() > 0.5, late.mean(axis=1)


@pytest.mark.parametrize("name", ["sera", "sera_no_multiplicity"])
def test_expected_batch_gradient_is_the_spec_prediction(one_seed, name):
    """Mean of 40,000 batch gradients at one step (counts fixed by p̂) vs
    (1/P) Σ_q (w_q N_q/N0) κ(p_q, N_q) ∇log p_q, within 5 standard errors per component; the
    other multiplicity setting's prediction is rejected (the check can fail)."""
    tr, params = one_seed
    method = methods.get_method(name)
    jac, p = _per_prompt_grads(params, tr)
    p_hat = jnp.asarray(np.clip(p * np.linspace(0.6, 1.4, 8), 1e-3, 0.99), jnp.float32)
    g, counts, weights = _grads(method, params, tr, p_hat, 40_000)
    g = np.asarray(g, np.float64)
    counts, weights = np.asarray(counts[0], np.float64), np.asarray(weights[0], np.float64)
    assert len(set(counts.tolist())) > 2  # heterogeneous counts
    kap = np.asarray(scaling.kappa(p, counts.astype(np.int32), 1), np.float64)
    pred = {}
    for mult in (True, False):
        w = (weights if method.multiplicity == mult
             else (SETUP.n0 / np.maximum(counts, 1) if mult else (counts > 0) * 1.0))
        pred[mult] = (((w * counts / SETUP.n0 * kap)[:, None] * jac).sum(0)
                      / SETUP.prompts_per_step)
    mean, se = g.mean(0), g.std(0, ddof=1) / np.sqrt(g.shape[0])
    # The skill-code coordinates have ∇ = 0 exactly (the code is the same for every answer of
    # a prompt); float32 rounding leaves ~1e-8 there, so a tiny absolute floor.
    tol = 5 * se + 1e-4 * np.abs(pred[method.multiplicity]).max()
    np.testing.assert_array_less(np.abs(mean - pred[method.multiplicity]), tol)
    assert (np.abs(mean - pred[not method.multiplicity]) > tol).any()
