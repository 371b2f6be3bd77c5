"""sera_jax.studies.alignment.gradients: exact p, the logit-space MaxRL gradient, paired
rollouts, the
two-stage (pilot) protocol, and the alignment engine."""

import functools
import itertools
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import objective
from sera_jax.studies.alignment import gradients as alignment
from sera_jax.studies.alignment import resnet

P, C = 6, 5


@pytest.fixture(scope="module")
def tiny():
    """A 1-block ResNet on 4x4x1 inputs in inference mode (per-image independent logits)."""
    cfg = resnet.digits_resnet_config(num_classes=C, width=4, stage_sizes=(1,))
    graphdef, params, stats = resnet.split_model(resnet.make_resnet(cfg, seed=1))
    x = jax.random.normal(jax.random.key(0), (P, 4, 4, 1))
    y = jnp.array([0, 1, 2, 3, 4, 0], jnp.int32)

    def logits_fn(prm, images=x):
        return resnet.apply_model(graphdef, prm, stats, images, train=False)[0]

    return logits_fn, params, x, y


def test_success_probs_float64_and_clipped():
    logits = np.array([[0.0, 700.0], [0.0, 0.0], [800.0, -800.0]], np.float32)
    p = alignment.success_probs(logits, np.array([0, 1, 0]))
    assert p.dtype == np.float64
    # e^-700 ≈ 9.9e-305: far below float32, exact in float64.
    np.testing.assert_allclose(p[0], np.exp(-700.0), rtol=1e-6)
    assert p[1] == 0.5
    assert p[2] == np.nextafter(1.0, 0.0)  # clipped below 1: κ and log1p(−p) stay finite
    with pytest.raises(ValueError, match="labels"):
        alignment.success_probs(logits, np.array([0, 2, 0]))


def test_ce_cotangent_is_softmax_minus_onehot():
    z = jax.random.normal(jax.random.key(1), (P, C))
    y = jnp.arange(P) % C
    want = (jax.nn.softmax(z) - jax.nn.one_hot(y, C)) / P
    np.testing.assert_allclose(alignment.ce_logit_cotangent(z, y), want, atol=1e-7)


def test_efficient_gradient_equals_brute_force_per_rollout(tiny):
    """One VJP of the logit cotangent == Σ over rollouts of separate ∇ log π(c_r|x_q)."""
    logits_fn, params, x, y = tiny
    n0 = 4
    counts = jnp.array([2, 7, 0, 3, 8, 4], jnp.int32)  # ragged, one inactive, sum = P*n0
    weights = jnp.where(counts > 0, n0 / jnp.maximum(counts, 1), 0.0).astype(jnp.float32)
    key = jax.random.key(3)
    logits = logits_fn(params)
    cot = alignment.maxrl_logit_cotangent(key, logits, y, counts, weights, n0=n0)
    fast = alignment.param_gradient(logits_fn, params, cot)

    plan = objective.plan_from_counts(counts, weights, P * n0)
    seg = np.asarray(plan.segment_ids)
    labels = np.asarray(alignment.sample_rollouts(key, logits, plan))
    r = (labels == np.asarray(y)[seg]).astype(np.float64)
    assert 0 < r.sum() < len(r)  # the check needs both outcomes
    k = np.bincount(seg, weights=r, minlength=P)
    rbar = k / np.maximum(np.asarray(counts), 1)
    adv = (r - rbar[seg]) / (rbar[seg] + 1e-6)  # centred MaxRL, SERA_SPEC §2
    # ∇θ log π(c | x_q) of ONE rollout: a separate backward pass on that image alone.
    score = jax.jit(jax.grad(lambda prm, xq, c: jax.nn.log_softmax(logits_fn(prm, xq)[0])[c]))
    brute = jax.tree.map(jnp.zeros_like, params)
    for i in range(len(seg)):  # one backward pass per rollout
        q, c = int(seg[i]), int(labels[i])
        g = score(params, x[q:q + 1], c)
        coef = -float(weights[q]) * adv[i] / (P * n0)
        brute = jax.tree.map(lambda a, b, coef=coef: a + coef * b, brute, g)
    for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(brute)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


def test_expected_cotangent_matches_monte_carlo():
    """Mean of the sampled cotangent over many draws → −(w N κ/(P N0))(e_y − π)."""
    z = jnp.array([[2.0, 0, 0], [0, 0, 0], [-1.5, 1, 0.5], [0, 3, 0]])
    y = jnp.array([0, 1, 0, 2])
    counts = jnp.array([2, 3, 9, 6], jnp.int32)
    n0 = 5
    weights = (n0 / counts).astype(jnp.float32)
    p = alignment.success_probs(np.asarray(z), np.asarray(y))
    kappa = 1 - (1 - p) ** (np.asarray(counts) - 1)
    keys = jax.random.split(jax.random.key(7), 40_000)
    sampled = jax.vmap(lambda k: alignment.maxrl_logit_cotangent(k, z, y, counts, weights,
                                                                 n0=n0))(keys)
    want = alignment.expected_logit_cotangent(z, y, jnp.asarray(kappa, jnp.float32), counts,
                                              weights, n0)
    se = sampled.std(0) / np.sqrt(len(keys))
    assert np.all(np.abs(sampled.mean(0) - want) < 5 * se + 1e-4)
    # With the multiplicity correction every prompt's weight is κ_q/P: the exact gradient
    # scaled per prompt.
    exact = alignment.ce_logit_cotangent(z, y)
    np.testing.assert_allclose(want, exact * kappa[:, None], rtol=1e-5, atol=1e-7)


def test_gradient_alignment_engine(tiny):
    logits_fn, params, _, y = tiny
    logits, vjp_fn = jax.jit(lambda prm: jax.vjp(logits_fn, prm))(params)
    exact = alignment.ce_logit_cotangent(logits, y)
    rand = jax.random.normal(jax.random.key(5), (P, C))
    cots = jnp.stack([exact, 3.0 * exact, -exact, rand, rand])  # 5 = one full + padded chunk
    cos, ratio = alignment.gradient_alignment(vjp_fn, cots, exact, unroll=2)
    np.testing.assert_allclose(cos[:3], [1, 1, -1], atol=1e-5)
    np.testing.assert_allclose(ratio[:3], [1, 3, 1], rtol=1e-5)
    g = alignment.param_gradient(logits_fn, params, rand)
    ge = alignment.param_gradient(logits_fn, params, exact)
    flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])
    want = flat(g) @ flat(ge) / np.linalg.norm(flat(g)) / np.linalg.norm(flat(ge))
    np.testing.assert_allclose(cos[3:], [want, want], rtol=1e-4)
    with pytest.raises(ValueError, match="unroll"):
        alignment.gradient_alignment(vjp_fn, cots, exact, unroll=0)


def test_allocate_batch_specs():
    p = np.array([1e-300, 1e-3, 0.2, 0.5, 0.9, 1 - 1e-12, 0.05, 0.3])
    u = alignment.allocate_batch("uniform", p, 8, n_min=2, n_max=64)
    np.testing.assert_array_equal(u.counts, 8)
    np.testing.assert_array_equal(u.weights, 1.0)
    s = alignment.allocate_batch("sera", p, 8, n_min=2, n_max=64)
    assert s.counts.sum() == p.size * 8 and s.kappa_min >= u.kappa_min
    nm = alignment.allocate_batch("sera_no_multiplicity", p, 8, n_min=2, n_max=64)
    np.testing.assert_array_equal(nm.counts, s.counts)
    np.testing.assert_array_equal(nm.weights, s.active.astype(np.float32))
    assert np.all(s.kappa[~s.active] == 0)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        alignment.allocate_batch("nope", p, 8, n_min=2, n_max=64)
    # θ reaches the dynamic methods only: a higher θ drops more images.
    strict = alignment.allocate_batch("sera", p, 8, n_min=2, n_max=64, threshold=0.9)
    assert strict.active.sum() < s.active.sum()
    eq = alignment.allocate_batch("sera_equalized", p, 8, n_min=2, n_max=64, threshold=0.9)
    assert eq.active.all()


def test_rollouts_are_paired_by_image_and_rank():
    """Rollout j of image q depends on (key, q, j) only: two allocations share each image's
    first min(N, N') labels, and the pilot is the first m rollouts of the final ones."""
    z = jax.random.normal(jax.random.key(2), (P, C))
    y = jnp.arange(P) % C
    key = jax.random.key(4)
    a = jnp.array([2, 7, 0, 3, 8, 4], jnp.int32)
    b = jnp.array([5, 2, 4, 3, 6, 4], jnp.int32)
    by_image = []
    for counts in (a, b):
        plan = objective.plan_from_counts(counts, jnp.ones(P), 24)
        seg, labels = np.asarray(plan.segment_ids), np.asarray(
            alignment.sample_rollouts(key, z, plan))
        by_image.append([labels[seg == q] for q in range(P)])
    for q in range(P):
        n = min(len(by_image[0][q]), len(by_image[1][q]))
        np.testing.assert_array_equal(by_image[0][q][:n], by_image[1][q][:n])
    k1 = alignment.pilot_successes(key[None], z, y, 2)[0]
    want = [int(np.sum(by_image[1][q][:2] == int(y[q]))) for q in range(P)]
    np.testing.assert_array_equal(k1, want)


def test_two_stage_allocate_batch_checks_its_pilot():
    p = np.array([0.1, 0.4, 0.8, 0.95])
    with pytest.raises(ValueError, match="two-stage"):
        alignment.allocate_batch("sera_sequential", p, 4, n_min=2, n_max=16)
    with pytest.raises(ValueError, match="only for two-stage"):
        alignment.allocate_batch("sera", p, 4, n_min=2, n_max=16, pilot_successes=np.ones(4, int))
    with pytest.raises(ValueError, match=r"\[0, pilot=2\]"):
        alignment.allocate_batch("sera_sequential", p, 4, n_min=2, n_max=16,
                                 pilot_successes=np.array([0, 1, 3, 2]))
    with pytest.raises(ValueError, match="shape"):
        alignment.allocate_batch("sera_sequential", p, 4, n_min=2, n_max=16,
                                 pilot_successes=np.ones(3, int))
    k1 = np.array([[0, 1, 2, 2], [2, 2, 2, 2], [0, 0, 1, 2]])
    ab = alignment.allocate_batch("sera_sequential", p, 4, n_min=2, n_max=16, pilot_successes=k1)
    assert ab.num_draws == 3 and ab.counts.shape == (3, 4)
    assert (ab.counts.sum(1) == 16).all() and ab.counts.min() >= 2
    for r in range(3):  # one allocation per draw, the same as allocating that draw alone
        one = alignment.allocate_batch("sera_sequential", p, 4, n_min=2, n_max=16,
                                       pilot_successes=k1[r])
        np.testing.assert_array_equal(one.counts, ab.draw(r).counts)
        np.testing.assert_allclose(one.kappa, ab.draw(r).kappa)
    # E[c_q] with the pilot averaged out: image q's own pilot enumerated, so an image at
    # p ≈ 1 is not ruled by the rare draw whose pilot failed (scale 1/(N(1 − p)) there).
    assert ab.kappa_bar.shape == (4,) and np.all((ab.kappa_bar > 0) & (ab.kappa_bar < 1))
    np.testing.assert_allclose(ab.cot_scale, ab.kappa_bar, rtol=1e-6)  # weights N0/N_q


def test_two_stage_expectation_is_the_likelihood_gradient_monte_carlo():
    """sera_sequential through the study's path (pilot = rollouts 0..m−1 with the draw's key,
    allocation given its successes, cotangent on all N_q rollouts with weights N0/N_q): per
    image, E[cotangent] = κ̄_q × the exact CE cotangent, κ̄_q = E_pilot[conditional_scale]
    (enumerated exactly over the joint pilot outcomes). The naive κ(p, N_q) is rejected."""
    z = jnp.array([[-1.0, 0.5, 0.3], [0.0, 0.2, 0.1], [1.0, -0.5, 0.0]])
    y = jnp.zeros(3, jnp.int32)
    n0, n_min, n_max, m = 6, 2, 12, 2
    p = alignment.success_probs(np.asarray(z), np.asarray(y))  # 0.11 / 0.30 / 0.63
    kw = dict(n_min=n_min, n_max=n_max)
    draws = 100_000
    keys = jax.random.split(jax.random.key(11), draws)
    k1 = alignment.pilot_successes(keys, z, y, m)
    ab = alignment.allocate_batch("sera_sequential", p, n0, pilot_successes=k1,
                                  pilot_average_draws=2_000, **kw)
    assert len(np.unique(ab.counts, axis=0)) > 3  # the counts really depend on the pilot
    cot = jax.jit(jax.vmap(functools.partial(alignment.maxrl_logit_cotangent, n0=n0),
                           in_axes=(0, None, None, 0, 0)))(keys, z, y, ab.counts, ab.weights)
    cot = np.asarray(cot, np.float64)
    mean, se = cot.mean(0), cot.std(0) / np.sqrt(draws)

    kbar, naive = np.zeros(3), np.zeros(3)
    for ks in itertools.product(range(m + 1), repeat=3):
        prob = np.prod([comb(m, k) * p[q] ** k * (1 - p[q]) ** (m - k) for q, k in enumerate(ks)])
        one = alignment.allocate_batch("sera_sequential", p, n0, pilot_successes=np.array(ks),
                                       **kw)
        kbar += prob * one.kappa  # conditional_scale given this pilot
        naive += prob * (1 - (1 - p) ** (one.counts - 1))
    exact = np.asarray(alignment.ce_logit_cotangent(z, y), np.float64)
    predicted = kbar[:, None] * exact
    assert np.all(np.abs(mean - predicted) < 4.5 * se + 1e-6), (mean, predicted, se)
    assert np.max(np.abs(mean - naive[:, None] * exact) / se) > 20
    # The study's κ̄ and cos(E) input (own pilot enumerated, the rest averaged over draws).
    np.testing.assert_allclose(ab.kappa_bar, kbar, rtol=0.01)
    est = np.asarray(alignment.expected_cotangent_of(ab, z, y, n0))
    np.testing.assert_allclose(est, predicted, rtol=0.01, atol=1e-6)
