"""pass@k (unbiased and analytic) and pytree cosine."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.metrics import analytic_pass_at_k, cosine, pass_at_k, pass_at_k_curve


def _exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_matches_exact_binomial_for_all_small_cases():
    cases = [(n, c, k) for n in range(1, 13) for c in range(n + 1) for k in range(1, n + 1)]
    n, c, k = (np.array(v) for v in zip(*cases))
    got = pass_at_k(n, c, k)
    want = np.array([float(_exact_pass_at_k(*case)) for case in cases])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)


def test_pass_at_k_large_n_is_accurate_against_exact_rationals():
    # n = 10,000: the naive ratio of binomials overflows float64 (C(10^4, 5000) ~ 1e3008).
    n = 10_000
    rng = np.random.default_rng(0)
    cs = np.concatenate([[1, 2, 10, 5000, 9000, 9990], rng.integers(1, n, 6)])
    ks = np.concatenate([[2, 1000, 3, 2, 500, 10], rng.integers(1, 60, 6)])
    got = pass_at_k(n, cs, ks)
    assert np.all(np.isfinite(got))
    for g, c, k in zip(got, cs, ks):
        want = _exact_pass_at_k(n, int(c), int(k))
        # Relative accuracy, also for answers ~1e-4 where 1 - ratio would cancel.
        assert abs(Fraction(float(g)) - want) <= 1e-12 * want


def test_pass_at_k_tiny_value_keeps_relative_accuracy():
    # 1 - C(9999, 2)/C(10000, 2) = 2/10000 exactly; a subtraction 1 - ratio would lose digits.
    got = pass_at_k(10_000, 1, 2)
    assert got == pytest.approx(2e-4, rel=1e-13)


def test_pass_at_k_edge_cases():
    np.testing.assert_array_equal(pass_at_k(7, np.arange(8), 1), np.arange(8) / 7)  # k=1: c/n
    np.testing.assert_array_equal(pass_at_k(50, 0, np.arange(1, 51)), 0.0)  # c=0
    np.testing.assert_array_equal(pass_at_k(10, 8, np.arange(3, 11)), 1.0)  # n-c < k
    np.testing.assert_array_equal(pass_at_k(10, 10, 1), 1.0)
    assert pass_at_k([[4], [8]], [1, 2], 2).shape == (2, 2)  # broadcasting


@pytest.mark.parametrize(
    "n, c, k, match",
    [(0, 0, 1, "n must"), (5, 6, 1, "c=6"), (5, -1, 1, "c=-1"), (5, 1, 0, "k=0"),
     (5, 1, 6, "k=6"), (5.5, 1, 1, "n must hold integers")],
)
def test_pass_at_k_rejects_bad_input(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_pass_at_k_curve_averages_over_prompts():
    n, c = np.array([16, 16, 12]), np.array([0, 3, 12])
    ks, curve = pass_at_k_curve(n, c)
    np.testing.assert_array_equal(ks, [1, 2, 4, 8, 12])
    for k, value in zip(ks, curve):
        want = np.mean([float(_exact_pass_at_k(int(a), int(b), int(k))) for a, b in zip(n, c)])
        assert value == pytest.approx(want, rel=1e-13)
    assert np.all(np.diff(curve) >= 0)
    np.testing.assert_array_equal(pass_at_k_curve([8], [1])[0], [1, 2, 4, 8])


def test_analytic_pass_at_k_is_stable_at_the_extremes():
    p = np.array([1e-300, 1e-20, 0.25, 1 - 1e-16, 1.0, 0.0])
    k = np.array([128, 3, 2, 2, 5, 7])
    got = analytic_pass_at_k(p, k)
    # 1-(1-p)^k ~ k p for tiny p: the naive form returns exactly 0 there.
    np.testing.assert_allclose(got[:2], [128e-300, 3e-20], rtol=1e-12)
    assert got[2] == pytest.approx(1 - 0.75**2, rel=1e-15)
    assert got[3] == 1.0 and got[4] == 1.0 and got[5] == 0.0
    assert analytic_pass_at_k(1.0, 0) == 0.0
    with pytest.raises(ValueError, match="p must"):
        analytic_pass_at_k(1.5, 2)
    with pytest.raises(ValueError, match="k must"):
        analytic_pass_at_k(0.5, -1)


def test_analytic_pass_at_k_is_the_mean_of_the_unbiased_estimator():
    # E_c[pass@k(n, c, k)] over c ~ Binomial(n, p) equals 1 - (1-p)^k exactly.
    n, p = 12, 0.3
    cs = np.arange(n + 1)
    probs = np.array([math.comb(n, c) * p**c * (1 - p) ** (n - c) for c in cs])
    for k in (1, 2, 5, 12):
        assert np.sum(probs * pass_at_k(n, cs, k)) == pytest.approx(
            float(analytic_pass_at_k(p, k)), rel=1e-12
        )


def test_cosine_on_pytrees_matches_flattened_numpy():
    rng = np.random.default_rng(1)
    a = {"w": rng.normal(size=(3, 4)), "b": [rng.normal(size=5), rng.normal(size=())]}
    b = {"w": rng.normal(size=(3, 4)), "b": [rng.normal(size=5), rng.normal(size=())]}
    flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
    va, vb = flat(a), flat(b)
    want = va @ vb / np.linalg.norm(va) / np.linalg.norm(vb)
    assert float(cosine(a, b)) == pytest.approx(want, abs=1e-6)
    assert float(jax.jit(cosine)(a, b)) == pytest.approx(want, abs=1e-6)
    assert float(cosine(a, a)) == pytest.approx(1.0, abs=1e-6)
    assert float(cosine(a, jax.tree.map(lambda x: -2.0 * x, a))) == pytest.approx(-1.0, abs=1e-6)


def test_cosine_is_scale_safe_and_handles_zero_vectors():
    big = {"x": jnp.array([3e30, 4e30], jnp.float32)}  # squares overflow float32
    small = {"x": jnp.array([3e-30, 4e-30], jnp.float32)}  # squares underflow float32
    assert float(cosine(big, small)) == pytest.approx(1.0, abs=1e-6)
    assert float(cosine({"x": jnp.array([1.0, 0.0], jnp.bfloat16)}, {"x": jnp.ones(2)})) == (
        pytest.approx(2**-0.5, abs=1e-6)
    )
    zero = {"x": jnp.zeros(2)}
    assert float(cosine(zero, big)) == 0.0
    assert float(cosine(zero, zero)) == 0.0


def test_cosine_rejects_mismatched_trees():
    with pytest.raises(ValueError, match="same pytree structure"):
        cosine({"a": np.ones(2)}, {"b": np.ones(2)})
    with pytest.raises(ValueError, match="leaf 0 has shape"):
        cosine([np.ones(2)], [np.ones(3)])
    with pytest.raises(ValueError, match="no leaves"):
        cosine({}, {})


def test_analytic_pass_at_k_is_kappa_with_shift_zero():
    # The same function as the conditional estimator's scale factor (sera_jax.scaling).
    from sera_jax.scaling import kappa

    p = np.array([0.0, 1e-6, 0.01, 0.3, 0.9, 0.999, 1.0], np.float32)
    for k in (1, 2, 7, 128):
        np.testing.assert_allclose(analytic_pass_at_k(p, k), kappa(p, k, shift=0), rtol=1e-6)


@pytest.mark.parametrize(("n", "c"), [([16, 16, 12], [0, 3]), ([16], [0, 3, 4]),
                                      ([16, 16], [[1, 2]]), ([4, 4], [])])
def test_pass_at_k_curve_refuses_n_and_c_of_different_lengths(n, c):
    with pytest.raises(ValueError, match=r"one entry per prompt.*n of shape.*c of shape"):
        pass_at_k_curve(n, c)


def test_pass_at_k_curve_takes_a_scalar_n_for_every_prompt():
    ks, curve = pass_at_k_curve(16, [0, 3, 16])
    ks2, curve2 = pass_at_k_curve([16, 16, 16], [0, 3, 16])
    np.testing.assert_array_equal(ks, ks2)
    np.testing.assert_array_equal(curve, curve2)


def test_pass_at_k_names_shapes_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"shapes n \(3,\), c \(2,\), k \(\)"):
        pass_at_k([4, 4, 4], [1, 2], 2)
