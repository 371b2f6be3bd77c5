"""sera_jax.alignment: exact p, the logit-space MaxRL gradient, and the alignment engine."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import alignment
from sera_jax.vision import resnet

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

    seg, labels = alignment.sample_rollouts(key, logits, counts, P * n0)
    seg, labels = np.asarray(seg), np.asarray(labels)
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
