"""Rollout allocation: SERA (scale-equalised) and its peers (SERA_SPEC §3-5).

Every allocator maps success estimates ``p`` (one per prompt, ``NaN`` = unseen) and an
integer rollout budget ``B`` to an :class:`Allocation`: integer counts that sum to ``B``
exactly, each ``0`` (inactive) or in ``[n_min, n_max]``, the multiplicity weights
``w_q = N0 / N_q`` (``N0 = B / P``) and diagnostics.

How it is computed (all under one ``jax.jit`` per static configuration, O(P) memory):

* **Continuous waterline.** With ``a_q = log λ_q``, ``λ_q = -log(1 - p_q)``, counts are
  ``N_q(t) = clip(s + exp(t - a_q), n_min, n_max)`` at ``t = log τ``. The sum is piecewise
  linear in ``τ`` with kinks at the 2P breakpoints ``log(n_{min|max} - s) + a_q``. Instead
  of sorting them (``jnp.sort`` of 2M floats takes seconds on CPU) a bracketed
  Newton iteration walks between linear pieces: each step solves the one linear equation
  of the current piece exactly, ``t' = t + log(B - fixed(t)) - log(Σ_free exp(t - a_q))``,
  and stops when the piece it solved is the piece it lands in -- the exact solution, not
  a fixed number of bisection steps. Bisection is only the safeguard.
* **Leximin rounding.** ``κ`` is increasing in the level ``ℓ_q(N) = log(N - s) + a_q``,
  so leximin over κ is leximin over levels. Handing out rollouts one by one to the
  prompt whose current level is lowest yields the leximin allocation; it equals "floor
  the waterline, then give one more to the R = B - Σ floor prompts with the lowest
  current level" (each free prompt's next level is above the waterline, every floored
  one below it). Selecting the R smallest is a threshold search on the bits of the keys
  (no sort). Near-ties (within ``64 ulp``) go to the prompt with fewer rollouts, whose
  next rollout raises κ most, then to the lower index.
* **Active set [paper].** The top-k prompts by the mixed-group probability
  ``u(p, n_max)`` (ranked in log space, see ``scaling.log_degenerate_group_prob``) share the
  budget; k is found by a jit ``while_loop`` binary search, each candidate evaluated with
  masks over static shapes.

``p = 0`` is treated as the limit ``p -> 0+`` (harder than every representable p: it gets
``n_max`` first) and ``p = 1`` as ``p -> 1-`` (easier than all: ``n_min``); this is what
SERA_SPEC §3 prescribes. Inputs are float32 unless ``jax_enable_x64`` is on, in which case
every step runs in float64 (p down to 1e-300).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array, lax
from jax.typing import ArrayLike

from sera_jax.scaling import kappa, log_degenerate_group_prob, log_lambda

__all__ = [
    "ALLOCATORS",
    "Allocation",
    "allocate",
    "get_allocator",
    "hit_utility",
    "inverse_p",
    "knapsack",
    "uniform",
    "waterline",
]

# log λ is clamped to [_A_MIN, _A_MAX]: below log of the smallest positive float64
# (−744.4), so p = 0 ranks as harder than any representable p; above the largest finite
# value −log(1 − nextafter(1, 0)) = 36.7 (log: 3.6), so p = 1 ranks as easier than any.
_A_MIN = -750.0
_A_MAX = 10.0
_MODES = ("dynamic", "equalized", "uniform")
_ROUNDINGS = ("leximin", "paper")
_UNSEEN = ("fill", "fallback", "error")
_INT32_MAX = int(np.iinfo(np.int32).max)


@struct.dataclass
class Allocation:
    """Result of an allocator; a pytree (every field is an array).

    counts: int32[P], sum == budget; 0 for inactive prompts, else in [n_min, n_max].
    weights: float[P], multiplicity correction ``N0 / N_q`` with ``N0 = budget / P``; 0 for
      inactive prompts.
    active: bool[P], prompts that get rollouts.
    tau, kappa_star: the waterline ``τ*`` and ``κ* = 1 - exp(-τ*)`` of the prompts that were
      equalised (NaN for rules without a waterline: uniform and the peers).
    kappa_min, kappa_mean: min / mean of ``κ(p_q, N_q)`` over active prompts with a known
      ``p`` (NaN if there are none).
    frac_at_n_min, frac_at_n_max: fraction of active prompts at each bound.
    num_active: number of active prompts.
    """

    counts: Array
    weights: Array
    active: Array
    tau: Array
    kappa_star: Array
    kappa_min: Array
    kappa_mean: Array
    frac_at_n_min: Array
    frac_at_n_max: Array
    num_active: Array


# ---------------------------------------------------------------------------------------
# Selection without sorting: threshold searches on the bit patterns of the keys.
# ---------------------------------------------------------------------------------------


def _ordered_uint(x: Array) -> Array:
    """Order-preserving map float -> unsigned int (flip negatives, set the sign bit)."""
    x = jnp.where(x == 0, jnp.zeros_like(x), x)  # -0.0 and 0.0 must map to one key
    bits = jnp.finfo(x.dtype).bits
    ut = jnp.uint64 if bits == 64 else jnp.uint32
    u = lax.bitcast_convert_type(x, ut)
    top = jnp.asarray(1 << (bits - 1), ut)
    return jnp.where(u >= top, ~u, u | top)


def _kth_smallest(ukey: Array, mask: Array, k: Array) -> Array:
    """Smallest ``v`` with ``#{mask & ukey <= v} >= k``; requires ``1 <= k <= #mask``."""
    big = jnp.asarray(jnp.iinfo(ukey.dtype).max, ukey.dtype)
    vmin = jnp.min(jnp.where(mask, ukey, big))
    vmax = jnp.max(jnp.where(mask, ukey, jnp.zeros_like(big)))
    count = lambda v: jnp.sum(mask & (ukey <= v), dtype=jnp.int32)
    first = count(vmin) >= k

    def body(c):
        lo, hi = c
        mid = lo + (hi - lo) // 2
        ok = count(mid) >= k
        return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

    # Invariant: count(lo) < k <= count(hi).
    _, hi = lax.while_loop(lambda c: c[1] - c[0] > 1, body, (jnp.where(first, vmax, vmin), vmax))
    return jnp.where(first, vmin, hi)


def _first_by_index(mask: Array, k: Array) -> Array:
    """The ``k`` lowest-index True entries of ``mask`` (``0 <= k <= #mask``)."""
    idx = jnp.arange(mask.shape[0], dtype=jnp.uint32)
    kk = jnp.maximum(k, 1)
    j = lax.cond(jnp.any(mask), lambda: _kth_smallest(idx, mask, kk), lambda: jnp.uint32(0))
    return mask & (idx <= j) & (k > 0)


def _select_smallest(
    key: Array, mask: Array, k: Array, *, rel_tol: float = 0.0, secondary: Array | None = None
) -> Array:
    """Exactly ``min(k, #mask)`` entries of ``mask`` with the smallest ``key``.

    Keys within ``rel_tol * max(|v|, 1)`` of the k-th smallest value ``v`` count as tied;
    ties go to the smallest ``secondary`` (non-negative ints), then the lowest index.
    """
    k = jnp.clip(k, 0, jnp.sum(mask, dtype=jnp.int32))
    key = jnp.where(mask, key, jnp.zeros_like(key))

    def select():
        u = _ordered_uint(key)
        vu = _kth_smallest(u, mask, k)
        v = jnp.max(jnp.where(mask & (u <= vu), key, -jnp.inf))
        tol = jnp.where(jnp.isfinite(v), rel_tol * jnp.maximum(jnp.abs(v), 1.0), 0.0)
        below = mask & (key < v - tol)
        band = mask & ~below & (key <= v + tol)
        need = k - jnp.sum(below, dtype=jnp.int32)

        def pick():
            if secondary is None:
                return _first_by_index(band, need)
            sec = secondary.astype(jnp.uint32)
            m = _kth_smallest(sec, band, need)
            take = band & (sec < m)
            tie = band & (sec == m)
            return take | _first_by_index(tie, need - jnp.sum(take, dtype=jnp.int32))

        take = lax.cond(jnp.sum(band, dtype=jnp.int32) == need, lambda: band, pick)
        return below | take

    return lax.cond(k > 0, select, lambda: jnp.zeros_like(mask))


def _spread(mask: Array, budget: Array) -> Array:
    """Uniform split of ``budget`` over ``mask``: ``floor(B/m)`` each, +1 for the first ``B mod m``."""
    m = jnp.maximum(jnp.sum(mask, dtype=jnp.int32), 1)
    q = budget // m
    extra = _first_by_index(mask, budget - q * m)
    return jnp.where(mask, q + extra.astype(jnp.int32), 0)


# ---------------------------------------------------------------------------------------
# The continuous waterline (exact) and its integer roundings.
# ---------------------------------------------------------------------------------------


def _waterline_log(
    a: Array, active: Array, budget: Array, n_min: Array, n_max: Array, shift: int
) -> Array:
    """``t* = log τ*``: the smallest ``t >= min_q log((n_min - s) λ_q)`` with ``F(t) = B``.

    ``F(t) = Σ_active clip(s + exp(t - a_q), n_min, n_max)``. NaN if nothing is active.
    """
    dt = a.dtype
    k = jnp.sum(active, dtype=jnp.int32)
    c1 = jnp.log((n_min - shift).astype(dt))
    c2 = jnp.log((n_max - shift).astype(dt))
    inf = jnp.asarray(jnp.inf, dt)
    t_lo = jnp.min(jnp.where(active, a + c1, inf))
    t_hi = jnp.max(jnp.where(active, a + c2, -inf))

    def stats(t):
        x = t - a
        hi = active & (x >= c2)
        lo = active & (x <= c1) & ~hi
        free = active & ~hi & ~lo
        nhi = jnp.sum(hi, dtype=jnp.int32)
        nlo = jnp.sum(lo, dtype=jnp.int32)
        nfree = jnp.sum(free, dtype=jnp.int32)
        # Integer part in int32: float32 cannot hold budgets above 2**24 exactly.
        fixed = n_max * nhi + n_min * nlo + shift * nfree
        s = jnp.sum(jnp.where(free, jnp.exp(jnp.where(free, x, 0.0)), 0.0))
        return budget - fixed, s, nhi, nlo

    def newton(t, r, s):
        ok = (s > 0) & (r > 0)
        tn = t + jnp.log(jnp.where(ok, r.astype(dt), 1.0)) - jnp.log(jnp.where(ok, s, 1.0))
        return ok, tn

    def body(st):
        lo, hi, t, pnhi, pnlo, was_newton, _, _, it = st
        r, s, nhi, nlo = stats(t)
        above = s >= r.astype(dt)  # F(t) >= B
        # t solved the linear equation of the piece it lies in: it is the exact root.
        exact = was_newton & (nhi == pnhi) & (nlo == pnlo)
        lo2 = jnp.where(above, lo, t)
        hi2 = jnp.where(above, t, hi)
        ok, tn = newton(t, r, s)
        use_n = ok & (tn > lo2) & (tn < hi2)
        mid = lo2 + (hi2 - lo2) / 2
        collapsed = (mid <= lo2) | (mid >= hi2)  # adjacent floats: the bracket is exact
        done = exact | collapsed
        result = jnp.where(exact, t, hi2)
        t_next = jnp.where(use_n, tn, mid)
        return lo2, hi2, t_next, nhi, nlo, use_n, done, result, it + 1

    # Start from the closed form with no bound active: τ = (B - sP) / Σ 1/λ.
    lse = jax.nn.logsumexp(jnp.where(active, -a, -inf))
    t0 = jnp.log(jnp.maximum(budget - shift * k, 1).astype(dt)) - lse
    inside = (t0 > t_lo) & (t0 < t_hi)
    t0 = jnp.where(inside, t0, t_lo + (t_hi - t_lo) / 2)
    zero = jnp.int32(0)
    init = (t_lo, t_hi, t0, zero, zero, inside, jnp.bool_(False), t_hi, zero)
    degenerate = (budget <= k * n_min) | (budget >= k * n_max)

    def solve():
        st = lax.while_loop(lambda st: ~st[6] & (st[8] < 400), body, init)
        return st[7]

    t = lax.cond(degenerate, lambda: jnp.where(budget <= k * n_min, t_lo, t_hi), solve)
    return jnp.where(k > 0, t, jnp.nan)


def _continuous_counts(a, active, t, n_min, n_max, shift):
    x = jnp.where(active, t - a, 0.0)
    n = jnp.clip(shift + jnp.exp(x), n_min.astype(a.dtype), n_max.astype(a.dtype))
    return jnp.where(active, n, 0.0)


def _round(cont, active, budget, n_min, n_max, add_key, remove_key, *, rel_tol, tie_by_count):
    """Floor ``cont``, then hand out / take back single rollouts by the given keys.

    ``add_key(n)`` ranks prompts for one more rollout (smallest first), ``remove_key(n)``
    for one less. After an accurate waterline one pass of additions suffices; the loop only
    guards against float error in the floor.
    """
    n0 = jnp.where(active, jnp.clip(jnp.floor(cont).astype(jnp.int32), n_min, n_max), 0)

    def body(st):
        n, r, it = st
        add = r > 0  # one selection call site for both directions keeps the program small
        cand = active & jnp.where(add, n < n_max, n > n_min)
        key = jnp.where(add, add_key(n), remove_key(n))
        sec = jnp.where(add, n - n_min, n_max - n) if tie_by_count else None
        sel = _select_smallest(key, cand, jnp.abs(r), rel_tol=rel_tol, secondary=sec)
        n = n + jnp.where(add, 1, -1) * sel.astype(jnp.int32)
        return n, budget - jnp.sum(n), it + 1

    n, _, _ = lax.while_loop(
        lambda st: (st[1] != 0) & (st[2] < 64), body, (n0, budget - jnp.sum(n0), 0)
    )
    return n


def _level(n, a, shift):
    """``log(N - s) + log λ``: κ is increasing in it (NaN-free for N <= s)."""
    return jnp.log(jnp.maximum(n - shift, 1).astype(a.dtype)) + a


def _equalize(a, active, budget, n_min, n_max, shift, rounding):
    t = _waterline_log(a, active, budget, n_min, n_max, shift)
    cont = _continuous_counts(a, active, t, n_min, n_max, shift)
    eps = float(jnp.finfo(a.dtype).eps)
    if rounding == "leximin":
        counts = _round(
            cont, active, budget, n_min, n_max,
            lambda n: _level(n, a, shift),
            lambda n: -_level(n - 1, a, shift),
            rel_tol=64 * eps, tie_by_count=True,
        )
    else:
        # [paper] smallest change of (κ(N) - κ*)^2. With L = (N - s) λ,
        # κ(N) - κ* = -exp(-τ) expm1(τ - L): drop the common factor exp(-2τ), which keeps
        # the order and avoids κ saturating at 1.
        lam = jnp.exp(a)
        tau = jnp.exp(jnp.where(jnp.isfinite(t), t, 0.0))
        dev = lambda n: jnp.square(jnp.expm1(jnp.minimum(tau - (n - shift) * lam, 80.0)))
        counts = _round(
            cont, active, budget, n_min, n_max,
            lambda n: dev(n + 1) - dev(n),
            lambda n: dev(n - 1) - dev(n),
            rel_tol=0.0, tie_by_count=False,
        )
    return counts, t


def _dynamic(p, a, seen, budget, n_min, n_max, shift, rounding, threshold):
    """[paper] dynamic active set: largest feasible top-k by ``u(p, n_max)``."""
    lthr = jnp.log1p(-threshold).astype(a.dtype)
    score = jnp.where(seen, log_degenerate_group_prob(p, n_max), 0.0)  # small = good
    n_elig = jnp.sum(seen & (score <= lthr), dtype=jnp.int32)
    k_lo = (budget + n_max - 1) // n_max
    k_hi = jnp.maximum(n_elig, k_lo)
    def evaluate(k):
        act = _select_smallest(score, seen, k)  # top-k by score, ties by index
        counts, t = _equalize(a, act, budget, n_min, n_max, shift, rounding)
        ok = ~jnp.any(act & (log_degenerate_group_prob(p, counts) > lthr))
        return ok, (counts, act, t)

    # Binary search for the largest feasible k in [k_lo, k_hi]; k_lo itself is evaluated
    # first (it is the answer when nothing is feasible). One call site of `evaluate`, and
    # the allocation of the current `lo` is carried, so nothing is recomputed at the end.
    def body(c):
        lo, hi, started, best = c
        k = jnp.where(started, lo + (hi - lo + 1) // 2, lo)
        ok, alloc = evaluate(k)
        keep = ok | ~started
        best = jax.tree.map(lambda new, old: jnp.where(keep, new, old), alloc, best)
        lo2 = jnp.where(started & ok, k, lo)
        hi2 = jnp.where(started & ~ok, k - 1, hi)
        return lo2, hi2, jnp.bool_(True), best

    empty = (jnp.zeros_like(seen, jnp.int32), jnp.zeros_like(seen), jnp.asarray(jnp.nan, a.dtype))
    _, _, _, best = lax.while_loop(
        lambda c: ~c[2] | (c[0] < c[1]), body, (k_lo, k_hi, jnp.bool_(False), empty))
    return best


# ---------------------------------------------------------------------------------------
# Peers whose objective is a sum of concave per-prompt terms: greedy on marginal gains.
# ---------------------------------------------------------------------------------------


def _greedy_units(key_fn, mask, budget, n_min, n_max):
    """Maximise ``Σ_q V_q(N_q)`` for concave ``V_q``: take the ``K = B - Σ n_min`` units
    ``(q, N -> N + 1)`` with the smallest ``key_fn(N)[q]`` (= minus the marginal gain,
    nondecreasing in N). For concave V this greedy is optimal, so it equals the dynamic
    programme over the budget. Exact ties go to the prompt with fewer rollouts, then the
    lowest index. Cost: O(P · 32 · log2(n_max - n_min)) -- no O(P · B) table.
    """
    width = n_max - n_min
    units = jnp.sum(mask, dtype=jnp.int32) * width
    kk = budget - n_min * jnp.sum(mask, dtype=jnp.int32)

    def count(v, strict):
        """Per prompt: #units with ordered key <(=) v (a prefix of N, keys being monotone)."""

        def body(c):
            lo, hi = c
            mid = (lo + hi) // 2
            ku = _ordered_uint(key_fn(n_min + mid))
            inside = (ku < v) if strict else (ku <= v)
            go = lo < hi
            return jnp.where(go & inside, mid + 1, lo), jnp.where(go & ~inside, mid, hi)

        lo, _ = lax.while_loop(
            lambda c: jnp.any(c[0] < c[1]), body, (jnp.zeros_like(mask, jnp.int32),
                                                   jnp.full(mask.shape, width, jnp.int32))
        )
        return jnp.where(mask, lo, 0)

    def solve():
        ufirst = _ordered_uint(key_fn(jnp.full(mask.shape, n_min)))
        ulast = _ordered_uint(key_fn(jnp.full(mask.shape, n_max - 1)))
        big = jnp.asarray(jnp.iinfo(ufirst.dtype).max, ufirst.dtype)
        vmin = jnp.min(jnp.where(mask, ufirst, big))
        vmax = jnp.max(jnp.where(mask, ulast, jnp.zeros_like(big)))
        total = lambda v: jnp.sum(count(v, False))
        first = total(vmin) >= kk

        def body(c):
            lo, hi = c
            mid = lo + (hi - lo) // 2
            ok = total(mid) >= kk
            return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

        _, v = lax.while_loop(lambda c: c[1] - c[0] > 1, body,
                              (jnp.where(first, vmax, vmin), vmax))
        v = jnp.where(first, vmin, v)
        lo = count(v, True)
        hi = count(v, False)
        need = kk - jnp.sum(lo)
        # Tied units (key == v) are handed out level by level in N, then by index.
        upto = lambda m: jnp.sum(jnp.clip(jnp.minimum(hi, m + 1) - lo, 0))

        def mbody(c):
            mlo, mhi = c  # upto(mlo) < need <= upto(mhi)
            mid = (mlo + mhi) // 2
            ok = upto(mid) >= need
            return jnp.where(ok, mlo, mid), jnp.where(ok, mid, mhi)

        first_m = upto(jnp.int32(0)) >= need
        _, m = lax.while_loop(lambda c: c[1] - c[0] > 1, mbody,
                              (jnp.where(first_m, width, 0), width))
        m = jnp.where(first_m, 0, m)
        take = jnp.clip(jnp.minimum(hi, m) - lo, 0)
        tie = mask & (lo <= m) & (m < hi)
        extra = _first_by_index(tie, need - jnp.sum(take))
        return lo + take + extra.astype(jnp.int32)

    units_taken = lax.cond(
        kk <= 0, lambda: jnp.zeros_like(mask, jnp.int32),
        lambda: lax.cond(kk >= units, lambda: jnp.where(mask, width, 0), solve),
    )
    return jnp.where(mask, n_min + units_taken, 0)


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


# ---------------------------------------------------------------------------------------
# The jitted core shared by every allocator.
# ---------------------------------------------------------------------------------------


def _seen_rule(rule, rounding, p, seen, budget, n_min, n_max, shift, threshold, alpha, beta):
    """Counts for the seen prompts (those with a finite p) sharing ``budget``."""
    a = jnp.clip(jnp.where(seen, log_lambda(jnp.where(seen, p, 0.5)), 0.0), _A_MIN, _A_MAX)
    p0 = jnp.where(seen, p, 0.5)
    nan = jnp.asarray(jnp.nan, p.dtype)
    if rule == "dynamic":
        return _dynamic(p0, a, seen, budget, n_min, n_max, shift, rounding, threshold)
    if rule == "equalized":
        counts, t = _equalize(a, seen, budget, n_min, n_max, shift, rounding)
        return counts, seen, t
    if rule == "uniform":
        return _spread(seen, budget), seen, nan
    if rule == "inverse_p":
        # n_q = 1 + (B - P) (1/p_q) / Σ 1/p_j is the waterline with λ -> p and s = 1.
        ap = jnp.clip(jnp.where(seen, jnp.log(p0), 0.0), _A_MIN, _A_MAX)
        t = _waterline_log(ap, seen, budget, n_min, n_max, 1)
        cont = _continuous_counts(ap, seen, t, n_min, n_max, 1)
        frac = cont - jnp.floor(cont)
        counts = _round(  # largest remainder, ties by index
            cont, seen, budget, n_min, n_max, lambda n: -frac, lambda n: frac,
            rel_tol=0.0, tie_by_count=False,
        )
        return counts, seen, nan
    if rule == "knapsack":
        return _greedy_units(_knapsack_key(p0), seen, budget, n_min, n_max), seen, nan
    if rule == "hit_utility":
        al = jnp.where(seen, alpha, 1.0)
        be = jnp.where(seen, beta, 1.0)
        return _greedy_units(_hit_key(al, be), seen, budget, n_min, n_max), seen, nan
    raise ValueError(f"unknown rule {rule!r}")


@functools.partial(jax.jit, static_argnames=("rule", "rounding", "shift", "unseen"))
def _core(p, valid, budget, n_min, n_max, threshold, alpha, beta, *, rule, rounding, shift,
          unseen):
    known = valid & ~jnp.isnan(p)
    hidden = valid & jnp.isnan(p)
    n_valid = jnp.sum(valid, dtype=jnp.int32)
    n_hidden = jnp.sum(hidden, dtype=jnp.int32)
    q = budget // n_valid
    r = budget - q * n_valid
    args = (p, known)

    def fill():
        # Unseen prompts take their share U·B/P (rounded) split as evenly as possible, so
        # the seen ones keep S·q + (r - extra) in [S·n_min, S·n_max].
        n_seen = n_valid - n_hidden
        frac = n_hidden.astype(p.dtype) * r.astype(p.dtype) / n_valid.astype(p.dtype)
        extra = jnp.clip(jnp.round(frac).astype(jnp.int32), jnp.maximum(0, r - n_seen),
                         jnp.minimum(n_hidden, r))
        b_hidden = n_hidden * q + extra
        counts, act, t = _seen_rule(rule, rounding, *args, budget - b_hidden, n_min, n_max,
                                    shift, threshold, alpha, beta)
        counts = counts + _spread(hidden, b_hidden)
        return counts, act | hidden, t

    if unseen == "fallback":
        counts, act, t = lax.cond(
            n_hidden > 0,
            lambda: (_spread(valid, budget), valid, jnp.asarray(jnp.nan, p.dtype)),
            fill,
        )
    else:
        counts, act, t = fill()
    counts = counts.astype(jnp.int32)

    # Diagnostics.
    n0 = budget.astype(p.dtype) / n_valid.astype(p.dtype)
    weights = jnp.where(act, n0 / jnp.maximum(counts, 1).astype(p.dtype), 0.0)
    kap = kappa(jnp.where(known, p, 0.0), counts, shift)
    have = act & known
    nk = jnp.sum(have, dtype=jnp.int32)
    na = jnp.sum(act, dtype=jnp.int32)
    nan = jnp.asarray(jnp.nan, p.dtype)
    tau = jnp.exp(t)
    return Allocation(
        counts=counts,
        weights=weights,
        active=act,
        tau=tau,
        kappa_star=-jnp.expm1(-tau),
        kappa_min=jnp.where(nk > 0, jnp.min(jnp.where(have, kap, jnp.inf)), nan),
        kappa_mean=jnp.where(nk > 0, jnp.sum(jnp.where(have, kap, 0.0)) / jnp.maximum(nk, 1),
                             nan),
        frac_at_n_min=jnp.sum(act & (counts == n_min)) / jnp.maximum(na, 1),
        frac_at_n_max=jnp.sum(act & (counts == n_max)) / jnp.maximum(na, 1),
        num_active=na,
    )


@jax.jit
def _waterline_core(p, valid, budget, n_min, n_max, shift):
    a = jnp.clip(log_lambda(jnp.where(valid, p, 0.5)), _A_MIN, _A_MAX)
    t = _waterline_log(a, valid, budget, n_min, n_max, shift)
    tau = jnp.exp(t)
    return tau, -jnp.expm1(-tau), _continuous_counts(a, valid, t, n_min, n_max, shift)


# ---------------------------------------------------------------------------------------
# Validation (on concrete values, before jit) and the public API.
# ---------------------------------------------------------------------------------------


def _is_traced(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _check_int(name: str, x: Any) -> int | Array:
    if _is_traced(x):
        return x
    if isinstance(x, bool | np.bool_) or not (
        isinstance(x, int | np.integer)
        or (isinstance(x, np.ndarray | jax.Array) and x.ndim == 0
            and jnp.issubdtype(x.dtype, jnp.integer))
    ):
        raise ValueError(
            f"{name} must be an integer number of rollouts, got {x!r} ({type(x).__name__}); "
            f"pass int({name})"
        )
    x = int(x)
    if not 0 <= x <= _INT32_MAX:
        raise ValueError(f"{name} must be in [0, {_INT32_MAX}], got {x}")
    return x


def _prepare(p, budget, n_min, n_max, shift, *, allow_nan: bool, threshold=None):
    """Validate, convert to the canonical float dtype and pad to a power-of-two bucket."""
    if shift not in (0, 1):
        raise ValueError(f"shift must be 0 (conditional) or 1 (centered), got {shift!r}")
    n_min = _check_int("n_min", n_min)
    n_max = _check_int("n_max", n_max)
    budget = _check_int("budget", budget)
    static = lambda *xs: not any(_is_traced(x) for x in xs)
    if static(n_min, n_max):
        if n_min > n_max:
            raise ValueError(f"n_min must be <= n_max, got n_min={n_min} > n_max={n_max}")
        if n_min < shift + 1:
            raise ValueError(
                f"n_min must be >= {shift + 1} with shift={shift} (a group of {shift} "
                f"rollout(s) has no gradient), got n_min={n_min}"
            )
    if threshold is not None and not _is_traced(threshold):
        if not 0.0 <= float(threshold) <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
    dtype = jnp.result_type(float)
    if _is_traced(p):
        if p.ndim != 1:
            raise ValueError(f"p must be a 1-D array (one probability per prompt), got {p.shape}")
        pa = p.astype(dtype)
    else:
        host = np.asarray(p)
        if host.ndim != 1:
            raise ValueError(
                f"p must be a 1-D array (one probability per prompt), got shape {host.shape}")
        if host.size == 0:
            raise ValueError("p is empty: a batch needs at least one prompt")
        if not (np.issubdtype(host.dtype, np.floating) or np.issubdtype(host.dtype, np.integer)
                or host.dtype == bool):
            raise ValueError(f"p must be numeric, got dtype {host.dtype}")
        host = host.astype(np.float64)
        nan = np.isnan(host)
        if nan.any() and not allow_nan:
            raise ValueError(
                f"p contains NaN (unseen prompts) at indices {np.flatnonzero(nan)[:8].tolist()};"
                " allowed range is [0, 1] -- use unseen='fill' or 'fallback' to allocate them"
            )
        bad = ~nan & ~((host >= 0) & (host <= 1))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"p must lie in [0, 1], got p[{i}] = {host[i]!r}")
        pa = host.astype(dtype)
    num = pa.shape[0]
    if static(budget, n_min, n_max) and not num * n_min <= budget <= num * n_max:
        raise ValueError(
            f"budget must be in [P*n_min, P*n_max] = [{num * n_min}, {num * n_max}] for "
            f"P={num}, n_min={n_min}, n_max={n_max}; got {budget}"
        )
    size = max(8, 1 << (num - 1).bit_length())
    xp = jnp if _is_traced(pa) else np
    pad = xp.full((size - num,), 0.5, dtype)
    p_pad = jnp.asarray(xp.concatenate([pa, pad]))
    valid = jnp.arange(size) < num
    ints = [jnp.asarray(x, jnp.int32) for x in (budget, n_min, n_max)]
    return p_pad, valid, num, ints


def _trim(tree, num):
    size = tree.counts.shape[0] if isinstance(tree, Allocation) else tree[2].shape[0]
    if size == num:
        return tree
    return jax.tree.map(lambda x: x[:num] if x.ndim == 1 else x, tree)


def _run(rule, p, budget, *, n_min, n_max, shift, unseen, rounding="leximin", threshold=0.05,
         alpha=None, beta=None):
    if unseen not in _UNSEEN:
        raise ValueError(f"unseen must be one of {_UNSEEN}, got {unseen!r}")
    p_pad, valid, num, (b, lo, hi) = _prepare(
        p, budget, n_min, n_max, shift, allow_nan=unseen != "error", threshold=threshold)
    size = p_pad.shape[0]
    if alpha is not None:
        alpha = jnp.pad(jnp.asarray(alpha, p_pad.dtype), (0, size - num), constant_values=1.0)
        beta = jnp.pad(jnp.asarray(beta, p_pad.dtype), (0, size - num), constant_values=1.0)
    out = _core(p_pad, valid, b, lo, hi, jnp.asarray(threshold, p_pad.dtype), alpha, beta,
                rule=rule, rounding=rounding, shift=shift,
                unseen="fallback" if unseen == "fallback" else "fill")
    return _trim(out, num)


def waterline(
    p: ArrayLike, budget: int, n_min: int, n_max: int, shift: int = 1
) -> tuple[Array, Array, Array]:
    """Bounded continuous SERA solution ``(τ*, κ*, N(τ*))`` (SERA_SPEC §3).

    ``N_q(τ) = clip(s + τ/λ_q, n_min, n_max)`` with ``λ_q = -log(1 - p_q)``, and ``τ*`` the
    smallest root of ``Σ_q N_q(τ) = B`` (``τ* = min_q (n_min - s) λ_q`` when
    ``B = P·n_min``); ``κ* = 1 - exp(-τ*)``. Exact: the final step solves the linear
    equation of the piece that contains the root, so ``Σ N_q = B`` up to float rounding.
    Without active bounds this is the closed form ``τ* = (B - sP) / Σ_q 1/λ_q``.
    """
    p_pad, valid, num, (b, lo, hi) = _prepare(p, budget, n_min, n_max, shift, allow_nan=False)
    tau, kstar, cont = _waterline_core(p_pad, valid, b, lo, hi, shift)
    return tau, kstar, cont[:num]


def allocate(
    p: ArrayLike,
    budget: int,
    *,
    n_min: int,
    n_max: int,
    mode: str = "dynamic",
    rounding: str = "leximin",
    shift: int = 1,
    threshold: float = 0.05,
    unseen: str = "fill",
) -> Allocation:
    """SERA: integer rollout counts maximising ``min_q κ(p_q, N_q)`` leximin (SERA_SPEC §3).

    Args:
      p: float[P] success estimates in [0, 1]; NaN marks an unseen prompt.
      budget: total rollouts B (an int in [P·n_min, P·n_max]), spent exactly.
      n_min, n_max: bounds for an active prompt (``n_min >= shift + 1``).
      mode: ``"dynamic"`` [paper default] top-k prompts by ``u(p, n_max)`` with the largest
        k such that every active prompt keeps ``u(p, N_q) >= threshold``; the rest get 0.
        ``"equalized"``: every prompt active. ``"uniform"``: ``B/P`` each (plain MaxRL).
      rounding: ``"leximin"`` exact leximin-optimal integers (no single rollout moved
        between two prompts within bounds raises the smaller of their κ);
        ``"paper"``: floor + the published smallest-squared-error rounding.
      shift: 1 for the centered estimator, 0 for the conditional one.
      threshold: θ of the dynamic mode.
      unseen: NaN policy. ``"fill"`` [ours]: unseen prompts get ``B/P`` (rounded, split
        evenly) and the seen ones share the rest; ``"fallback"`` [paper]: any NaN makes
        the whole batch uniform; ``"error"``: NaN raises ValueError.
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {rounding!r}")
    return _run(mode, p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen,
                rounding=rounding, threshold=threshold)


def uniform(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
            unseen: str = "fill") -> Allocation:
    """Plain MaxRL: ``floor(B/P)`` rollouts each, one more for the first ``B mod P`` prompts."""
    return _run("uniform", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


def inverse_p(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
              unseen: str = "fill") -> Allocation:
    """Reinforce-Ada-Est (code version): ``n_q = 1 + (B - P)(1/p_q) / Σ_j 1/p_j``.

    Counts are clipped to ``[n_min, n_max]`` by re-solving for the scale (the same exact
    waterline as SERA with ``λ -> p``, ``s = 1``), then rounded by largest remainder with
    ties by index. ``p = 0`` gets ``n_max``.
    """
    return _run("inverse_p", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


def knapsack(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
             unseen: str = "fill") -> Allocation:
    """Knapsack-RL: maximise ``Σ_q V(N_q, p_q)``, ``V = [1 - p^N - (1-p)^N] p (1-p)^2``.

    ``V`` is concave in N (its increments ``p(1-p)^2 [p^N(1-p) + (1-p)^N p]`` decrease), so
    the greedy on marginal gains returns the optimum of the published dynamic programme
    (checked against the DP in the tests) in O(P · 32 · log2(n_max - n_min)) instead of
    O(P · B · n_max). Prompts with p in {0, 1} have V = 0 and get the leftovers evenly.
    """
    return _run("knapsack", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


def hit_utility(
    p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1, unseen: str = "fill",
    alpha: ArrayLike | None = None, beta: ArrayLike | None = None, pseudo_count: float = 4.0,
) -> Allocation:
    """HORA: maximise ``Σ_q [1 - B(α_q, β_q + N_q) / B(α_q, β_q)]`` (expected hits).

    Each term is the posterior probability of at least one success in ``N_q`` rollouts,
    concave in N, so the greedy on marginal gains ``E[(1-p)^N p]`` is optimal. ``alpha``,
    ``beta`` are Beta posterior parameters per prompt (e.g. from the success history);
    without them ``α = 0.5 + c·p̂``, ``β = 0.5 + c·(1 - p̂)`` with ``c = pseudo_count``
    (a Jeffreys prior plus c pseudo-observations at the estimate).
    """
    if (alpha is None) != (beta is None):
        raise ValueError("alpha and beta must be given together (Beta posterior parameters)")
    if not pseudo_count > 0:
        raise ValueError(f"pseudo_count must be > 0, got {pseudo_count!r}")
    if alpha is None:
        ph = jnp.asarray(p, jnp.result_type(float))
        alpha = 0.5 + pseudo_count * ph
        beta = 0.5 + pseudo_count * (1.0 - ph)
    elif not (_is_traced(alpha) or _is_traced(beta)):
        for name, x in (("alpha", alpha), ("beta", beta)):
            x = np.asarray(x, np.float64)
            if x.shape != np.shape(p):
                raise ValueError(f"{name} must have the shape of p {np.shape(p)}, got {x.shape}")
            if not np.all(np.isfinite(x) & (x > 0)):
                raise ValueError(f"{name} must be finite and > 0 (Beta parameters)")
    return _run("hit_utility", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen,
                alpha=alpha, beta=beta)


ALLOCATORS: dict[str, Callable[..., Allocation]] = {
    "sera": allocate,
    "sera_equalized": functools.partial(allocate, mode="equalized"),
    "uniform": uniform,
    "inverse_p": inverse_p,
    "knapsack": knapsack,
    "hit_utility": hit_utility,
}


def get_allocator(name: str) -> Callable[..., Allocation]:
    """The allocator registered as ``name``; all share ``f(p, budget, *, n_min, n_max, ...)``."""
    try:
        return ALLOCATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown allocator {name!r}; valid names: {sorted(ALLOCATORS)}") from None
