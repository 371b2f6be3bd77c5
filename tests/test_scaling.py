"""sera_jax.scaling: κ(p, N) and u(p, N) against their definitions and at the extremes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.scaling import (
    kappa,
    log1m,
    log_degenerate_group_prob,
    log_lambda,
    mixed_group_prob,
)

P_GRID = np.array([0.0, 1e-6, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 1 - 1e-6, 1.0])
N_GRID = np.arange(0, 12)


@pytest.mark.parametrize("shift", [0, 1])
def test_kappa_matches_definition(shift):
    p, n = np.meshgrid(P_GRID, N_GRID, indexing="ij")
    want = np.where(n > shift, 1.0 - (1.0 - p) ** np.maximum(n - shift, 0), 0.0)
    got = np.asarray(kappa(p.astype(np.float32), n, shift))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


def test_kappa_end_points_and_inactive():
    n = jnp.arange(2, 40)
    assert np.all(np.asarray(kappa(0.0, n)) == 0.0)
    assert np.all(np.asarray(kappa(1.0, n)) == 1.0)
    # N <= s: no gradient, even at p = 1 (0 * log(0) must not leak a NaN).
    assert float(kappa(1.0, 1, shift=1)) == 0.0
    assert float(kappa(1.0, 0, shift=0)) == 0.0
    assert float(kappa(0.5, 0, shift=1)) == 0.0


def test_kappa_monotone_in_p_and_n():
    p = jnp.linspace(0.0, 1.0, 101)
    k = np.asarray(kappa(p[:, None], jnp.arange(2, 30)[None, :]))
    assert np.all(np.diff(k, axis=0) >= 0) and np.all(np.diff(k, axis=1) >= 0)


def test_extremes_float64():
    with jax.enable_x64(True):
        # p = 1e-300: κ = 1 - (1-p)^(N-1) ≈ (N-1) p, which the naive formula rounds to 0.
        k = kappa(jnp.float64(1e-300), jnp.arange(2, 6))
        np.testing.assert_allclose(np.asarray(k), 1e-300 * np.arange(1, 5), rtol=1e-12)
        p_hi = 1 - 1e-16  # = 1 - 1.11e-16 in float64
        k = kappa(jnp.float64(p_hi), 2)
        assert float(k) < 1.0 and abs(float(1 - k) - (1 - p_hi)) < 1e-30
        assert np.isclose(float(log_lambda(jnp.float64(1e-300))), np.log(1e-300), rtol=1e-12)
        assert np.isclose(float(log_lambda(jnp.float64(p_hi))), np.log(-np.log1p(-p_hi)))
        u = mixed_group_prob(jnp.float64(1e-300), 8)
        np.testing.assert_allclose(float(u), 8e-300, rtol=1e-12)
    assert float(log_lambda(0.0)) == -np.inf and float(log_lambda(1.0)) == np.inf
    assert float(log1m(1.0)) == -np.inf


def test_mixed_group_prob_matches_definition():
    p, n = np.meshgrid(P_GRID, N_GRID, indexing="ij")
    want = np.where(n > 1, 1.0 - (1.0 - p) ** n - p**n, 0.0)
    got = np.asarray(mixed_group_prob(p.astype(np.float32), n))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(log_degenerate_group_prob(p, n)), np.log1p(-want), rtol=1e-4, atol=1e-6)
    # Symmetric in p <-> 1 - p; zero for a certain outcome; tiny p gives u ≈ N p.
    q = np.linspace(0.01, 0.99, 9, dtype=np.float32)
    np.testing.assert_allclose(mixed_group_prob(q, 7), mixed_group_prob(1 - q, 7), atol=1e-6)
    assert float(mixed_group_prob(0.0, 9)) == 0.0 and float(mixed_group_prob(1.0, 9)) == 0.0
    np.testing.assert_allclose(float(mixed_group_prob(1e-7, 4)), 4e-7, rtol=1e-4)


def test_jit_vmap_and_broadcasting():
    p = jnp.array([0.1, 0.5, 0.9])
    n = jnp.array([[2], [5]])
    eager = kappa(p, n)
    assert eager.shape == (2, 3)
    np.testing.assert_allclose(jax.jit(kappa, static_argnums=2)(p, n, 1), eager)
    np.testing.assert_allclose(jax.vmap(lambda q: kappa(q, 5))(p), eager[1], rtol=1e-6)
    assert mixed_group_prob(p, n).shape == (2, 3)
