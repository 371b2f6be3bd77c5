"""Ragged advantages, multiplicity weights and PG-loss normalisations (SERA_SPEC §2, §3, §7)."""

import functools

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from sera_jax import estimators as est
from sera_jax.estimators import (
    ADVANTAGE_ESTIMATORS,
    get_advantage_estimator,
    maxrl,
    padded_advantages,
    policy_gradient_loss,
    rollout_weights,
    segment_ids_from_counts,
)

# ----------------------------------------------------------------------------- formulas


def test_each_estimator_on_a_hand_computed_batch():
    # Groups: [1, 0, 0, 0], [1, 1], [0, 0, 0]; prompt 3 has no rollouts.
    r = jnp.array([1.0, 0, 0, 0, 1, 1, 0, 0, 0])
    seg = jnp.array([0, 0, 0, 0, 1, 1, 2, 2, 2])
    zero5 = [0.0] * 5
    want = {
        "maxrl": [0.75 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6), -0.25 / (0.25 + 1e-6),
                  -0.25 / (0.25 + 1e-6)] + zero5,
        "maxrl_conditional": [4.0, 0, 0, 0, 1, 1, 0, 0, 0],
        # ddof=1: std = sqrt(0.75/3) = 0.5.
        "grpo": [0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3 + zero5,
        "rloo": [1.0, -1 / 3, -1 / 3, -1 / 3] + zero5,
        "reinforce": [1.0, 0, 0, 0, 1, 1, 0, 0, 0],
    }
    for name, values in want.items():
        np.testing.assert_allclose(ADVANTAGE_ESTIMATORS[name](r, seg, 4), values, rtol=1e-6,
                                   atol=1e-7, err_msg=name)
    np.testing.assert_allclose(est.reinforce(r, seg, 4, baseline="batch_mean"), r - 3 / 9,
                               rtol=1e-6)
    np.testing.assert_allclose(est.grpo(r, seg, 4, ddof=0)[0], 0.75 / (0.75**0.5 * 0.5 + 1e-6),
                               rtol=1e-6)


def test_conditional_form_equals_mean_score_of_successes():
    # (1/N) Σ A_i S_i == (1/K) Σ r_i S_i for arbitrary per-rollout "scores" S_i.
    rng = np.random.default_rng(0)
    counts = np.array([5, 3, 1, 4])
    seg = np.repeat(np.arange(4), counts)
    r = np.array([1, 0, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 1], np.float32)
    scores = rng.normal(size=(13, 3)).astype(np.float32)
    a = np.asarray(est.maxrl_conditional(r, seg, 4))
    for q in range(4):
        rows = seg == q
        got = (a[rows, None] * scores[rows]).sum(0) / counts[q]
        k = r[rows].sum()
        want = (r[rows, None] * scores[rows]).sum(0) / k if k else np.zeros(3)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_segment_ids_from_counts_and_rollout_weights():
    counts = jnp.array([2, 0, 3, 1])
    seg = segment_ids_from_counts(counts, 6)
    np.testing.assert_array_equal(seg, [0, 0, 2, 2, 2, 3])
    np.testing.assert_array_equal(jax.jit(segment_ids_from_counts, static_argnums=1)(counts, 6),
                                  seg)
    w = rollout_weights(jnp.array([1.5, 0.0, 1.0, 3.0]), seg)
    np.testing.assert_array_equal(w, [1.5, 1.5, 1.0, 1.0, 1.0, 3.0])


def test_estimators_jit_with_static_num_segments():
    r, seg = jnp.array([1.0, 0, 1, 1]), jnp.array([0, 0, 1, 1])
    for name, fn in ADVANTAGE_ESTIMATORS.items():
        jitted = jax.jit(fn, static_argnums=2)
        np.testing.assert_allclose(jitted(r, seg, 2), fn(r, seg, 2), rtol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------- padded == segment

_P, _R = 5, 24  # fixed shapes: one compilation per estimator for all hypothesis examples


@functools.cache
def _jitted_pair(name):
    fn = ADVANTAGE_ESTIMATORS[name]
    return jax.jit(lambda r, s: fn(r, s, _P)), jax.jit(fn.padded)


@settings(max_examples=40, deadline=None)
@given(
    seg=st.lists(st.integers(0, _P - 1), min_size=_R, max_size=_R),
    binary=st.lists(st.sampled_from([0.0, 1.0]), min_size=_R, max_size=_R),
    # Dyadic values: group sums are exact in float32 in any order, so both paths see the
    # same r̄ and differences come only from rounding in the last bits.
    real=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 1.5, 2.0]), min_size=_R, max_size=_R),
    order=st.randoms(use_true_random=False),
)
def test_padded_agrees_with_segment_version(seg, binary, real, order):
    seg = np.array(seg)
    # Padded layout: prompt q's rollouts in row q, at random columns (masks need not be
    # left-aligned); unused cells hold garbage rewards that must be ignored.
    cols = np.zeros(_R, int)
    for q in range(_P):
        rows = np.flatnonzero(seg == q)
        cols[rows] = order.sample(range(_R), len(rows))
    mask = np.zeros((_P, _R), bool)
    mask[seg, cols] = True
    for name, estimator in ADVANTAGE_ESTIMATORS.items():
        r = np.array(binary if estimator.requires_binary else real, np.float32)
        padded_r = np.where(mask, 0.0, 7.0).astype(np.float32)
        padded_r[seg, cols] = r
        flat_fn, padded_fn = _jitted_pair(name)
        flat = np.asarray(flat_fn(r, seg))
        padded = np.asarray(padded_fn(padded_r, mask))
        np.testing.assert_allclose(padded[seg, cols], flat, rtol=1e-5, atol=1e-5, err_msg=name)
        assert np.all(padded[~mask] == 0.0), name


def test_padded_entry_points_agree_and_validate():
    r = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    m = jnp.array([[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(padded_advantages("maxrl", r, m),
                                  ADVANTAGE_ESTIMATORS["maxrl"].padded(r, m))
    with pytest.raises(ValueError, match="binary"):
        padded_advantages("maxrl", r.at[0, 0].set(0.5), m)
    padded_advantages("maxrl", r.at[0, 2].set(0.5), m)  # padding is not validated
    with pytest.raises(ValueError, match="mask must be bool"):
        padded_advantages("maxrl", r, m[:, :2])
    with pytest.raises(ValueError, match="2-D"):
        padded_advantages("maxrl", r[0], m[0])


# ----------------------------------------------------------------------------- Monte Carlo


def _softmax_policy(p):
    """4 actions, action 0 is correct: π = [p, (1−p)/3, (1−p)/3, (1−p)/3]."""
    return jnp.stack([p, (1 - p) / 3, (1 - p) / 3, (1 - p) / 3], axis=-1)


@functools.partial(jax.jit, static_argnames=("groups", "total"))
def _mc_group_gradients(key, p_of_group, n_of_group, *, groups, total):
    """Per-group estimates (1/N) Σ A_i S_i, S_i = e_{z_i} − π (= ∇_θ log softmax(θ)[z_i]),
    for the centred and the conditional MaxRL advantage, [groups, 4] each."""
    seg = segment_ids_from_counts(n_of_group, total)
    pi = _softmax_policy(p_of_group)[seg]
    z = jax.random.categorical(key, jnp.log(pi), axis=-1)
    rewards = (z == 0).astype(jnp.float32)
    scores = jax.nn.one_hot(z, 4) - pi
    out = []
    for fn in (est.maxrl, est.maxrl_conditional):
        adv = fn(rewards, seg, groups)
        g = jax.ops.segment_sum(adv[:, None] * scores, seg, groups)
        out.append(g / n_of_group[:, None].astype(jnp.float32))
    return out


def test_monte_carlo_expected_maxrl_gradients_match_the_scale_factors():
    """E[centred] = (1−(1−p)^(N−1)) ∇log p and E[conditional] = (1−(1−p)^N) ∇log p."""
    configs = [(0.05, 2), (0.05, 8), (0.3, 3), (0.3, 6), (0.7, 2)]
    groups_per_config = 40_000
    p = np.repeat([c[0] for c in configs], groups_per_config).astype(np.float32)
    n = np.repeat([c[1] for c in configs], groups_per_config).astype(np.int32)
    centred, conditional = _mc_group_gradients(
        jax.random.key(0), jnp.asarray(p), jnp.asarray(n), groups=p.size, total=int(n.sum()))
    centred = np.asarray(centred, np.float64).reshape(len(configs), groups_per_config, 4)
    conditional = np.asarray(conditional, np.float64).reshape(len(configs), groups_per_config, 4)
    for i, (pc, nc) in enumerate(configs):
        grad_log_p = np.array([1.0, 0, 0, 0]) - np.asarray(_softmax_policy(np.float64(pc)))
        kappas = {"centred": 1 - (1 - pc) ** (nc - 1), "conditional": 1 - (1 - pc) ** nc}
        for name, samples in (("centred", centred[i]), ("conditional", conditional[i])):
            mean = samples.mean(0)
            se = samples.std(0) / np.sqrt(groups_per_config)
            want = kappas[name] * grad_log_p
            # ε = 1e-6 in the centred advantage biases by at most N·ε relative.
            tol = 5 * se + nc * 1e-6 * np.abs(want) + 1e-9
            assert np.all(np.abs(mean - want) <= tol), (name, pc, nc, mean, want, se)
        # The test has power: the other shift's prediction is far outside the error bars.
        gap = abs(kappas["centred"] - kappas["conditional"]) * abs(grad_log_p[0])
        assert gap > 8 * max(centred[i].std(0)[0], conditional[i].std(0)[0]) / np.sqrt(
            groups_per_config), (pc, nc)


# ----------------------------------------------------------------------------- SERA vs uniform


def _heterogeneous_batch():
    """32 prompts, success probabilities with heavy mass near 0 and near 1."""
    return np.concatenate([
        np.geomspace(0.004, 0.05, 10),  # hard
        np.linspace(0.1, 0.6, 6),  # medium
        1 - np.geomspace(0.002, 0.15, 16),  # easy
    ]).astype(np.float32)


@functools.partial(jax.jit, static_argnames=("n0", "draws"))
def _cosines_to_exact(key, p, counts, weights, *, n0, draws):
    """Cosine between the allocated MaxRL gradient (sequence-mean loss, multiplicity weights)
    and the exact batch gradient (1/P) Σ_q ∇log p_q, for `draws` independent batches."""
    from sera_jax.metrics import cosine

    num_prompts = p.shape[0]
    budget = num_prompts * n0
    theta = jnp.log(_softmax_policy(p))  # logits whose softmax gives p on action 0
    exact = jax.grad(lambda t: jnp.mean(jax.nn.log_softmax(t)[:, 0]))(theta)
    seg = segment_ids_from_counts(counts, budget)
    w = rollout_weights(weights, seg)

    def one(k):
        z = jax.random.categorical(k, theta[seg], axis=-1)
        adv = maxrl((z == 0).astype(jnp.float32), seg, num_prompts)

        def loss(t):
            lp = jax.nn.log_softmax(t)[seg, z][:, None]
            return policy_gradient_loss(lp, jnp.ones_like(lp, bool), adv, w,
                                        aggregation="sequence_mean", num_prompts=num_prompts,
                                        n0=n0)

        return cosine(-jax.grad(loss)(theta), exact)

    return jax.vmap(one)(jax.random.split(key, draws))


def test_sera_with_multiplicity_correction_aligns_better_than_uniform():
    """Same budget B = P·N0, same estimator and loss; SERA's default (dynamic) allocation.

    Measured when written (seed 1, 400 draws each): cosine 0.616 (SERA + correction),
    0.534 (SERA, w = 1), 0.489 (uniform), per-draw std 0.06–0.08, so the margins are
    > 10 standard errors.
    """
    from sera_jax.allocation import allocate

    p = _heterogeneous_batch()
    n0, draws = 8, 400
    budget = p.size * n0
    sera = allocate(p, budget, n_min=2, n_max=64)
    assert int(np.sum(sera.counts)) == budget
    cases = {
        "sera": (sera.counts, sera.weights),
        "sera_no_correction": (sera.counts, jnp.where(sera.active, 1.0, 0.0)),
        "uniform": (jnp.full(p.size, n0, jnp.int32), jnp.ones(p.size)),
    }
    keys = jax.random.split(jax.random.key(1), len(cases))
    cos = {
        name: np.asarray(_cosines_to_exact(key, jnp.asarray(p), jnp.asarray(counts),
                                           jnp.asarray(weights, jnp.float32), n0=n0,
                                           draws=draws))
        for key, (name, (counts, weights)) in zip(keys, cases.items())
    }

    def margin(a, b):  # difference of means in standard errors (independent draws)
        se = np.sqrt(cos[a].var(ddof=1) / draws + cos[b].var(ddof=1) / draws)
        return (cos[a].mean() - cos[b].mean()) / se

    summary = {name: round(float(c.mean()), 4) for name, c in cos.items()}
    assert margin("sera", "uniform") > 4, summary
    assert margin("sera", "sera_no_correction") > 4, summary


# ----------------------------------------------------------------------------- loss


def _loss_case(seed=0):
    rng = np.random.default_rng(seed)
    counts = np.array([3, 1, 0, 4])  # prompt 2 inactive
    n0, num_prompts = 2, 4
    seg = np.repeat(np.arange(4), counts)
    r_rows, width = seg.size, 6
    lengths = rng.integers(1, width + 1, r_rows)
    mask = np.arange(width)[None, :] < lengths[:, None]
    lp = np.where(mask, -rng.uniform(0.1, 3.0, (r_rows, width)), -np.inf).astype(np.float32)
    adv = rng.normal(size=r_rows).astype(np.float32)
    w_prompt = np.where(counts > 0, n0 / np.maximum(counts, 1), 0.0).astype(np.float32)
    return dict(seg=seg, counts=counts, n0=n0, num_prompts=num_prompts, lp=lp, mask=mask,
                adv=adv, w=w_prompt[seg], lengths=lengths, width=width)


def _explicit_coefficients(c, aggregation, max_len=None):
    """∂loss/∂logπ_rt written out per aggregation (SERA_SPEC §3, §7)."""
    cw = (c["w"] * c["adv"])[:, None] * c["mask"]
    norm = c["num_prompts"] * c["n0"]
    if aggregation == "sequence_mean":
        return -cw / c["lengths"][:, None] / norm
    if aggregation == "seq_mean_token_sum_norm":
        return -cw / (norm * (max_len or c["width"]))
    return -cw / c["mask"].sum()


@pytest.mark.parametrize("aggregation, max_len",
                         [("sequence_mean", None), ("seq_mean_token_sum_norm", None),
                          ("seq_mean_token_sum_norm", 10), ("token_mean", None)])
def test_loss_value_and_gradient_match_explicit_formulas(aggregation, max_len):
    c = _loss_case()
    kwargs = dict(aggregation=aggregation, num_prompts=c["num_prompts"], n0=c["n0"],
                  max_len=max_len)
    loss_fn = lambda lp: policy_gradient_loss(lp, c["mask"], c["adv"], c["w"], **kwargs)
    coef = _explicit_coefficients(c, aggregation, max_len)
    lp0 = np.where(c["mask"], c["lp"], 0.0)
    terms = coef * lp0  # float32 sums of mixed-sign terms: tolerance relative to Σ|terms|
    assert float(loss_fn(jnp.asarray(c["lp"]))) == pytest.approx(
        float(np.sum(terms)), abs=1e-6 * float(np.sum(np.abs(terms))))
    grad = np.asarray(jax.grad(loss_fn)(jnp.asarray(c["lp"])))  # -inf padding: no NaN
    np.testing.assert_allclose(grad, coef, rtol=1e-6, atol=1e-8)


def test_sequence_mean_with_correction_is_the_mean_over_prompts_of_group_means():
    c = _loss_case(1)
    loss = policy_gradient_loss(c["lp"], c["mask"], c["adv"], c["w"],
                                aggregation="sequence_mean", num_prompts=4, n0=c["n0"])
    per_rollout = c["adv"] * np.where(c["mask"], c["lp"], 0).sum(1) / c["lengths"]
    group_means = [per_rollout[c["seg"] == q].mean() if c["counts"][q] else 0.0
                   for q in range(4)]
    assert float(loss) == pytest.approx(-np.sum(group_means) / 4, rel=1e-5)


def test_one_step_rollouts_make_all_aggregations_equal():
    # T = 1 and R = P·N0: token mean, sequence mean and fixed-L sums coincide.
    rng = np.random.default_rng(2)
    lp = -rng.uniform(0.1, 2, (6, 1)).astype(np.float32)
    adv, w = rng.normal(size=6).astype(np.float32), rng.uniform(0.5, 2, 6).astype(np.float32)
    losses = [float(policy_gradient_loss(lp, np.ones((6, 1), bool), adv, w, aggregation=a,
                                         num_prompts=3, n0=2)) for a in est.AGGREGATIONS]
    np.testing.assert_allclose(losses, losses[0], rtol=1e-6)


def test_micro_batch_losses_add_up_to_the_full_batch_loss():
    c = _loss_case(3)
    halves = [slice(0, 4), slice(4, None)]
    for aggregation in est.AGGREGATIONS:
        kwargs = dict(aggregation=aggregation, num_prompts=4, n0=c["n0"],
                      num_tokens=c["mask"].sum())
        full = policy_gradient_loss(c["lp"], c["mask"], c["adv"], c["w"], **kwargs)
        parts = sum(policy_gradient_loss(c["lp"][s], c["mask"][s], c["adv"][s], c["w"][s],
                                         **kwargs) for s in halves)
        assert float(parts) == pytest.approx(float(full), rel=1e-5), aggregation


def test_advantages_and_weights_are_constants_of_the_loss():
    c = _loss_case()
    g = jax.grad(lambda a: policy_gradient_loss(c["lp"], c["mask"], a, c["w"],
                                                aggregation="token_mean"))(jnp.asarray(c["adv"]))
    np.testing.assert_array_equal(g, 0.0)


# ----------------------------------------------------------------------------- bad input

_R3, _S3 = jnp.array([1.0, 0.0, 1.0]), jnp.array([0, 1, 1])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: maxrl(jnp.array([1.0, 0.5, 0.0]), _S3, 2), "binary"),
        (lambda: est.maxrl_conditional(jnp.array([2.0, 0.0, 0.0]), _S3, 2), "binary"),
        (lambda: est.grpo(jnp.array([np.nan, 0.0, 0.0]), _S3, 2), "finite"),
        (lambda: maxrl(_R3, jnp.array([0, 2, 1]), 2), r"segment_ids contains 2.*\[0, num_seg"),
        (lambda: maxrl(_R3, jnp.array([0, -1, 1]), 2), "segment_ids contains -1"),
        (lambda: maxrl(_R3, jnp.array([0, 1]), 2), r"segment_ids has shape \(2,\)"),
        (lambda: maxrl(_R3, jnp.array([0.0, 1.0, 1.0]), 2), "integers"),
        (lambda: maxrl(_R3[:, None], _S3, 2), "1-D"),
        (lambda: maxrl(_R3, _S3, 0), "num_segments=0"),
        (lambda: maxrl(_R3, _S3, 2.0), "num_segments=2.0"),
        (lambda: get_advantage_estimator("ppo"), r"estimator='ppo'.*maxrl"),
        (lambda: est.reinforce(_R3, _S3, 2, baseline="median"), "baseline='median'"),
        (lambda: segment_ids_from_counts(jnp.array([2, 2]), 5), "sum to 4.*total=5"),
        (lambda: segment_ids_from_counts(jnp.array([-1, 6]), 5), ">= 0"),
        (lambda: rollout_weights(jnp.ones(2), jnp.array([0, 2])), "segment_ids contains 2"),
    ],
)
def test_estimator_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(aggregation="mean"), "aggregation='mean'"),
        (dict(aggregation="sequence_mean"), "needs num_prompts"),
        (dict(aggregation="sequence_mean", num_prompts=0, n0=2), "num_prompts=0"),
        (dict(aggregation="seq_mean_token_sum_norm", num_prompts=2, n0=2, max_len=0),
         "max_len=0"),
        (dict(aggregation="token_mean", advantages=jnp.ones(3)), r"advantages has shape"),
        (dict(aggregation="token_mean", token_mask=jnp.ones((2, 3))), "token_mask must be"),
    ],
)
def test_loss_bad_input_raises(kwargs, match):
    args = dict(token_logprobs=jnp.zeros((2, 3)), token_mask=jnp.ones((2, 3), bool),
                advantages=jnp.ones(2), rollout_weights=jnp.ones(2))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        policy_gradient_loss(**args)


def test_validation_is_skipped_under_jit():
    # Out-of-range ids cannot be seen while tracing: no error, segment_sum drops them.
    out = jax.jit(lambda s: maxrl(_R3, s, 2))(jnp.array([0, 5, 1]))
    assert out.shape == (3,)
