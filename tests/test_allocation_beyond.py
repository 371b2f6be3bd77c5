"""Allocation rules beyond the paper (sera_jax.allocation.beyond): the allocator contract,
optimality of the posterior rule, the two-stage composition and E[g] of the two-stage scheme
by Monte Carlo."""

import itertools
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import allocation, estimators, methods, scaling
from sera_jax.allocation import beyond


def _random_p(rng, num, nan_frac=0.2):
    p = rng.beta(0.4, 0.8, num)
    p[rng.random(num) < nan_frac] = np.nan
    return p.astype(np.float32)


def _check_contract(a, p, budget, n_min, n_max):
    counts = np.asarray(a.counts)
    assert counts.dtype == np.int32 and counts.shape == p.shape
    assert counts.sum() == budget
    assert counts.min() >= n_min and counts.max() <= n_max
    assert np.asarray(a.active).all()
    np.testing.assert_allclose(np.asarray(a.weights), (budget / len(p)) / counts, rtol=1e-6)


@pytest.mark.parametrize("num,n0,n_min,n_max", [(5, 4, 2, 16), (13, 8, 2, 64), (32, 3, 3, 7),
                                                 (7, 2, 2, 2)])
def test_contract_both_rules(num, n0, n_min, n_max):
    rng = np.random.default_rng(num)
    p = _random_p(rng, num)
    budget = num * n0
    _check_contract(beyond.posterior(p, budget, n_min=n_min, n_max=n_max), p, budget, n_min,
                    n_max)
    for stage in ("waterline", "posterior"):
        k1 = rng.integers(0, n_min + 1, num)
        a = beyond.sequential(p, budget, n_min=n_min, n_max=n_max, pilot_successes=k1,
                              second_stage=stage)
        _check_contract(a, p, budget, n_min, n_max)


def test_registered_and_traced_inputs():
    """Both rules are in ALLOCATORS / ALLOCATOR_OPTIONS / METHODS, and give the same counts
    under jit + vmap (traced p, posterior and pilot) as on the host."""
    assert {"posterior", "sequential"} <= set(allocation.ALLOCATORS)
    assert {"posterior", "sequential"} <= set(allocation.ALLOCATOR_OPTIONS)
    assert methods.get_method("sera_posterior").allocator == "posterior"
    assert methods.get_method("sera_sequential").allocator == "sequential"
    rng = np.random.default_rng(0)
    p = np.stack([_random_p(rng, 12) for _ in range(4)])
    a = rng.uniform(0.5, 20, p.shape).astype(np.float32)
    b = rng.uniform(0.5, 20, p.shape).astype(np.float32)
    k1 = rng.integers(0, 3, p.shape)
    post = allocation.get_allocator("posterior")
    seq = allocation.get_allocator("sequential")
    kw = dict(n_min=2, n_max=32)
    f = jax.jit(jax.vmap(lambda q, x, y, k: (post(q, 96, alpha=x, beta=y, **kw).counts,
                                             seq(q, 96, pilot_successes=k, **kw).counts)))
    got_p, got_s = f(p, a, b, k1)
    for i in range(len(p)):
        np.testing.assert_array_equal(got_p[i], post(p[i], 96, alpha=a[i], beta=b[i], **kw).counts)
        np.testing.assert_array_equal(got_s[i], seq(p[i], 96, pilot_successes=k1[i], **kw).counts)


def _levels(alpha, beta, counts):
    return np.asarray(beyond.expected_kappa(alpha, beta, counts), np.float64)


def test_posterior_is_leximin_exchange_and_brute_force():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        a = rng.uniform(0.5, 30, 9)
        b = rng.uniform(0.5, 30, 9)
        p = a / (a + b)
        counts = np.asarray(beyond.posterior(p, 9 * 6, n_min=2, n_max=20, alpha=a, beta=b).counts)
        h = _levels(a, b, counts)
        # No single rollout moved from i to j (within bounds) raises min(h_i, h_j).
        for i, j in itertools.permutations(range(9), 2):
            if counts[i] > 2 and counts[j] < 20:
                c = counts.copy()
                c[i] -= 1
                c[j] += 1
                h2 = _levels(a, b, c)
                assert min(h2[i], h2[j]) <= min(h[i], h[j]) + 1e-12
        # Brute force on 3 prompts: the sorted level vector is lexicographically largest.
        a3, b3 = np.array([0.5, 3.0, 12.0]), np.array([0.5, 9.0, 2.0])
        got = np.asarray(beyond.posterior(a3 / (a3 + b3), 15, n_min=2, n_max=9, alpha=a3,
                                          beta=b3).counts)
        best = max((c for c in itertools.product(range(2, 10), repeat=3) if sum(c) == 15),
                   key=lambda c: tuple(np.sort(_levels(a3, b3, np.array(c)))))
        np.testing.assert_allclose(np.sort(_levels(a3, b3, got)),
                                   np.sort(_levels(a3, b3, np.array(best))), atol=1e-12)


def test_posterior_concentrated_is_sera_equalized():
    """As α + β → ∞ at a fixed mean, E[κ] → κ(mean): the rule becomes SERA equalized."""
    with jax.enable_x64(True):
        rng = np.random.default_rng(2)
        p = rng.uniform(0.02, 0.95, 16)
        c = 1e9
        got = beyond.posterior(p, 16 * 8, n_min=2, n_max=64, alpha=c * p, beta=c * (1 - p))
        ref = allocation.allocate(p, 16 * 8, n_min=2, n_max=64, mode="equalized")
        np.testing.assert_array_equal(got.counts, ref.counts)


def test_posterior_unseen_prompts_use_the_prior():
    p = np.array([0.05, np.nan, 0.5, 0.9, np.nan], np.float32)
    got = beyond.posterior(p, 40, n_min=2, n_max=32, pseudo_count=4.0)
    c = 4.0
    seen = ~np.isnan(p)
    a = np.where(seen, 0.5 + c * np.nan_to_num(p), 0.5)
    b = np.where(seen, 0.5 + c * (1 - np.nan_to_num(p)), 0.5)
    ref = beyond.posterior(np.nan_to_num(p, nan=0.5), 40, n_min=2, n_max=32, alpha=a, beta=b)
    np.testing.assert_array_equal(got.counts, ref.counts)
    assert got.counts[1] != 40 // 5  # not the N0 fill of the other allocators
    with pytest.raises(ValueError, match="NaN"):
        beyond.posterior(p, 40, n_min=2, n_max=32, unseen="error")


def test_sequential_composes_pilot_posterior_and_waterline():
    rng = np.random.default_rng(3)
    p = _random_p(rng, 10)
    k1 = rng.integers(0, 4, 10)
    a = np.where(np.isnan(p), 0.5, 0.5 + 4 * np.nan_to_num(p))
    b = np.where(np.isnan(p), 0.5, 0.5 + 4 * (1 - np.nan_to_num(p)))
    a2, b2 = a + k1, b + 3 - k1
    got = beyond.sequential(p, 80, n_min=2, n_max=40, pilot=3, pilot_successes=k1)
    assert np.asarray(got.counts).min() >= 3
    ref = allocation.allocate((a2 / (a2 + b2)).astype(np.float32), 80, n_min=3, n_max=40,
                              mode="equalized")
    np.testing.assert_array_equal(got.counts, ref.counts)
    got2 = beyond.sequential(p, 80, n_min=2, n_max=40, pilot=3, pilot_successes=k1,
                             second_stage="posterior")
    ref2 = beyond.posterior((a2 / (a2 + b2)).astype(np.float32), 80, n_min=3, n_max=40,
                            alpha=a2, beta=b2)
    np.testing.assert_array_equal(got2.counts, ref2.counts)


def test_sequential_validation():
    p = np.array([0.1, 0.5, 0.8], np.float32)
    seq = allocation.get_allocator("sequential")
    with pytest.raises(ValueError, match="two-stage"):
        seq(p, 12, n_min=2, n_max=8)
    with pytest.raises(ValueError, match="pilot_successes"):
        seq(p, 12, n_min=2, n_max=8, pilot_successes=[0, 3, 1])
    with pytest.raises(ValueError, match="needs 15 rollouts"):
        seq(p, 12, n_min=2, n_max=8, pilot=5, pilot_successes=[0, 1, 1])
    with pytest.raises(ValueError, match="second_stage"):
        seq(p, 12, n_min=2, n_max=8, pilot_successes=[0, 1, 1], second_stage="x")
    with pytest.raises(ValueError, match="does not use"):
        seq(p, 12, n_min=2, n_max=8, pilot_successes=[0, 1, 1], mode="dynamic")
    with pytest.raises(ValueError, match="alpha and beta"):
        allocation.get_allocator("posterior")(p, 12, n_min=2, n_max=8, alpha=[1.0, 1, 1])


def test_conditional_scale_reduces_to_kappa():
    p = np.array([0.01, 0.3, 0.9])
    for n in (2, 5, 40):
        np.testing.assert_allclose(beyond.conditional_scale(p, 0, 0, n),
                                   scaling.kappa(p, n, 1), rtol=1e-5)
        # Averaged over the pilot with a count fixed in advance: κ(p, N) again.
        m = 2
        avg = sum(comb(m, k) * p**k * (1 - p)**(m - k) * beyond.conditional_scale(p, k, m, n)
                  for k in range(m + 1))
        np.testing.assert_allclose(avg, scaling.kappa(p, n, 1), rtol=1e-5, atol=1e-6)


def test_two_stage_expected_gradient_monte_carlo():
    """E[g] of the two-stage scheme = -(1/P) Σ_q κ̄_q ∇log p_q (module docstring of
    beyond), with the library's estimator, weights and loss on data-dependent counts; the
    naive κ(p, N_q) averaged over the allocations is rejected."""
    num, k_ans, n0, m, n_max = 3, 3, 6, 2, 12
    budget = num * n0
    theta = jnp.array([[-1.0, 0.5, 0.3], [0.0, 0.2, 0.1], [1.0, -0.5, 0.0]])
    pi = jax.nn.softmax(theta, -1)
    p = np.asarray(pi[:, 0], np.float64)  # answer 0 is the correct one
    p_hat = jnp.array([0.2, jnp.nan, 0.6])
    alloc = lambda k1: beyond.sequential(p_hat, budget, n_min=2, n_max=n_max, pilot=m,
                                         pilot_successes=k1)

    def trial(key):
        ans = jax.random.categorical(key, theta[:, None, :], shape=(num, n_max))
        a = alloc(jnp.sum(ans[:, :m] == 0, axis=1))  # the pilot: rollouts 0..m-1
        seg = estimators.segment_ids_from_counts(a.counts, budget)
        rank = jnp.arange(budget) - (jnp.cumsum(a.counts) - a.counts)[seg]
        z = ans[seg, rank]
        adv = estimators.maxrl((z == 0).astype(jnp.float32), seg, num)
        w = estimators.rollout_weights(a.weights, seg)

        def loss(th):
            lp = jax.nn.log_softmax(th, -1)[seg, z]
            return estimators.policy_gradient_loss(
                lp[:, None], jnp.ones((budget, 1), bool), adv, w, aggregation="sequence_mean",
                num_prompts=num, n0=n0)

        return jax.grad(loss)(theta)

    trials = 100_000
    g = np.asarray(jax.jit(jax.vmap(trial))(jax.random.split(jax.random.key(0), trials)),
                   np.float64)
    mean, se = g.mean(0), g.std(0) / np.sqrt(trials)
    kbar, naive = np.zeros(num), np.zeros(num)
    for ks in itertools.product(range(m + 1), repeat=num):
        prob = np.prod([comb(m, k) * p[q] ** k * (1 - p[q]) ** (m - k) for q, k in enumerate(ks)])
        n = np.asarray(alloc(jnp.array(ks)).counts)
        kbar += prob * np.asarray(beyond.conditional_scale(p, np.array(ks), m, n))
        naive += prob * np.asarray(scaling.kappa(p, n, 1))
    grad_log_p = np.eye(k_ans)[0][None] - np.asarray(pi, np.float64)
    predicted = -(kbar[:, None] * grad_log_p) / num
    assert np.all(np.abs(mean - predicted) < 4.5 * se + 1e-5), (mean, predicted, se)
    wrong = -(naive[:, None] * grad_log_p) / num
    assert np.max(np.abs(mean - wrong) / se) > 20
