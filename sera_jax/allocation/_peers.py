"""Peers whose objective is a sum of concave per-prompt terms: greedy on marginal gains
(layer 2 of ``sera_jax.allocation``, beside the waterline).

Knapsack-RL, HORA and VIP (a separable convex variance, `peers_2026`) reduce to "the
``B - Σ n_min`` units with the smallest keys", the same selection the leximin rounding makes,
with a key per (prompt, N) instead of a level.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from sera_jax.allocation._select import _select_units


def _greedy_units(key_fn, mask, budget, n_min, n_max):
    """Maximise ``Σ_q V_q(N_q)`` for concave ``V_q``: take the ``K = B - Σ n_min`` units
    ``(q, N -> N + 1)`` with the smallest ``key_fn(N)[q]`` (= minus the log marginal gain,
    nondecreasing in N). For concave V this greedy is optimal, so it equals the dynamic
    programme over the budget. Exact ties go to the prompt with fewer rollouts, then the
    lowest index. Cost: O(P · 2·32 · log2(n_max - n_min)) -- no O(P · B) table.
    """
    width = n_max - n_min

    def count(v):
        """Per prompt: #units with key <= v, by bisection over N (keys are monotone)."""

        def body(c):
            lo, hi = c
            mid = lo + (hi - lo) // 2  # (lo + hi) // 2 wraps once n_max - n_min > 2**30
            inside = key_fn(n_min + mid) <= v
            go = lo < hi
            return jnp.where(go & inside, mid + 1, lo), jnp.where(go & ~inside, mid, hi)

        init = (jnp.zeros(mask.shape, jnp.int32), jnp.full(mask.shape, width, jnp.int32))
        lo, _ = lax.while_loop(lambda c: jnp.any(c[0] < c[1]), body, init)
        return jnp.where(mask, lo, 0)

    dt = jnp.result_type(float)
    u0 = jnp.zeros((), jnp.uint64 if jnp.finfo(dt).bits == 64 else jnp.uint32)
    # lo = hi = 0 (a NaN pattern) never brackets: _select_units searches (-inf, inf].
    return _select_units(count, mask, budget, n_min, n_max, u0, u0, dt, rel_tol=0.0)


def _knapsack_key(p):
    """``-log ΔV`` for ``V(N) = [1 - p^N - (1-p)^N] p (1-p)^2`` (Knapsack-RL)."""
    lp, l1p = jnp.log(p), jnp.log1p(-p)

    def key(n):
        n = n.astype(p.dtype)
        gain = lp + 2 * l1p + jnp.logaddexp(n * lp + l1p, n * l1p + lp)
        return -gain

    return key


def _hit_key(alpha, beta):
    """``-log`` of the marginal hit probability ``E[(1-p)^N p]`` under ``Beta(α, β)`` (HORA)."""
    const = jnp.log(alpha) - lax.lgamma(beta) + lax.lgamma(alpha + beta)

    def key(n):
        n = n.astype(alpha.dtype)
        return -(const + lax.lgamma(beta + n) - lax.lgamma(alpha + beta + n + 1))

    return key


def _vip_key(p, shift):
    """``-log`` of the variance decrease ``v/((N - s)(N + 1 - s))`` of the unit N -> N + 1
    for the per-prompt variance ``v/(N - s)``, ``v = p(1 - p)`` (VIP, `peers_2026.vip`);
    +inf where v = 0 (p in {0, 1}: the leftovers, evenly)."""
    log_v = jnp.log(p) + jnp.log1p(-p)

    def key(n):
        m = (n - shift).astype(p.dtype)
        return jnp.log(m) + jnp.log(m + 1) - log_v

    return key
