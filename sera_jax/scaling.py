"""Finite-rollout scale factors of the MaxRL estimators (SERA_SPEC §2).

Everything is computed through ``log1p``/``expm1`` so that success probabilities from
``1e-300`` (float64) up to ``1 - 1e-16`` and the exact end points 0 and 1 give accurate,
finite answers. All functions are elementwise, broadcast ``p`` against ``n`` and are
jit/vmap-able; they do no value checks (NaN in, NaN out) because they run inside jitted
code -- the allocators validate their inputs.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

__all__ = [
    "kappa",
    "log1m",
    "log_degenerate_group_prob",
    "log_lambda",
    "mixed_group_prob",
]


def _float(p: ArrayLike) -> Array:
    p = jnp.asarray(p)
    return p if jnp.issubdtype(p.dtype, jnp.floating) else p.astype(jnp.result_type(float))


def log1m(p: ArrayLike) -> Array:
    """``log(1 - p)`` without cancellation (``log1p(-p)``); ``-inf`` at ``p = 1``."""
    return jnp.log1p(-_float(p))


def log_lambda(p: ArrayLike) -> Array:
    """``log λ`` with ``λ = -log(1 - p)`` (the rate in ``κ = 1 - exp(-λ (N - s))``).

    ``λ ≈ p`` for tiny p, so ``log_lambda(1e-300) ≈ -690.8`` (float64); ``-inf`` at p = 0
    and ``+inf`` at p = 1.
    """
    return jnp.log(-log1m(p))


def kappa(p: ArrayLike, n: ArrayLike, shift: int = 1) -> Array:
    """Scale factor ``κ(p, N) = 1 - (1 - p)^(N - s)`` of the MaxRL gradient (SERA_SPEC §2).

    ``shift = 1`` for the centered estimator (what SERA trains with), ``0`` for the
    conditional one. For ``N <= s`` the estimator is identically zero (a group of one
    rollout has no baseline; an inactive prompt with ``N = 0`` has no rollouts), so
    ``κ = 0`` there by definition. ``κ(0, N) = 0`` and ``κ(1, N) = 1`` for ``N > s``.
    """
    p = _float(p)
    m = jnp.asarray(n) - shift
    pos = m > 0
    # Substitute 1 where N <= s so that 0 * log1p(-1) = NaN never appears in either branch.
    x = jnp.where(pos, m, 1).astype(p.dtype) * log1m(p)
    return jnp.where(pos, -jnp.expm1(x), jnp.zeros((), p.dtype))


def log_degenerate_group_prob(p: ArrayLike, n: ArrayLike) -> Array:
    """``log P(all N rewards equal) = log((1 - p)^N + p^N)`` = ``log(1 - u(p, N))``.

    Kept in log space because ``u`` saturates at 1 long before it is exactly 1 (for
    ``N = 512`` every ``p`` in ``[0.04, 0.96]`` has ``u == 1.0`` in float32), while its log
    complement still ranks prompts. ``0`` (``u = 0``) for ``N <= 1``.
    """
    p = _float(p)
    n = jnp.asarray(n)
    pos = n > 1
    m = jnp.where(pos, n, 2).astype(p.dtype)
    out = jnp.logaddexp(m * log1m(p), m * jnp.log(p))
    return jnp.where(pos, out, jnp.zeros((), p.dtype))


def mixed_group_prob(p: ArrayLike, n: ArrayLike) -> Array:
    """``u(p, N) = 1 - (1 - p)^N - p^N``: chance that a group of N rollouts is mixed.

    A mixed group (at least one success and one failure) is what gives the centered
    estimator a non-zero gradient. ``u = 0`` for ``N <= 1`` and at ``p in {0, 1}``.
    """
    return -jnp.expm1(log_degenerate_group_prob(p, n))
