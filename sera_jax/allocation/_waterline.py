"""The continuous waterline (exact) and its integer roundings (layer 2 of
``sera_jax.allocation``).

``λ_q = -log(1 - p_q)``, the bracketed-Newton waterline ``t* = log τ*``, the leximin and
[paper] roundings, and the [paper] dynamic active set (its window prediction and the
bisection over k). See the package docstring for how each step is computed.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from sera_jax.allocation._select import (
    _INT32_MAX,
    _any,
    _ordered_uint,
    _reduce,
    _reduce_counts,
    _sat_mul,
    _search,
    _select_smallest,
    _select_units,
    _sum,
    _to_count,
    _wide,
)
from sera_jax.scaling import log1m

# log λ is clamped to [_A_MIN, _A_MAX]: below log of the smallest positive float64
# (−744.4), so p = 0 ranks as harder than any representable p; above the largest finite
# value −log(1 − nextafter(1, 0)) = 36.7 (log: 3.6), so p = 1 ranks as easier than any.
_A_MIN = -750.0
_A_MAX = 10.0
# exp(t - a_q) = exp(t) * exp(-a_q): with exp(-a) precomputed, the passes of the waterline
# and of the leximin search need no transcendental per prompt. Valid (no overflow, no
# clamping of a prompt that can be free) while t > _FAST_T; below, exp(t - a) is used.
_FAST_T = -50.0
_W_CLAMP = -75.0


def _waterline_log(
    a: Array, active: Array, budget: Array, n_min: Array, n_max: Array, shift: int,
    t_guess: Array | None = None, w: Array | None = None,
) -> tuple[Array, Array]:
    """``t* = log τ*``: the smallest ``t >= min_q log((n_min - s) λ_q)`` with ``F(t) = B``.

    ``F(t) = Σ_active clip(s + exp(t - a_q), n_min, n_max)``. Returned as ``(t, d)`` with
    ``t* = t + d`` (see the polish step); NaN if nothing is active.
    """
    dt = a.dtype
    if w is None:
        w = _inv_lambda(a)
    c1 = jnp.log((n_min - shift).astype(dt))
    c2 = jnp.log((n_max - shift).astype(dt))
    inf = jnp.asarray(jnp.inf, dt)
    i32 = lambda m: m.astype(jnp.int32)
    k, t_lo, t_hi, sum_w = _reduce(
        (i32(active), jnp.where(active, a + c1, inf), jnp.where(active, a + c2, -inf),
         jnp.where(active, w, 0.0)), "+<>+")

    def pieces(t, exp_x):
        """``(#at n_max, #at n_min, Σ_free exp(t - a))`` in one pass."""
        x = t - a
        hi = active & (x >= c2)
        lo = active & (x <= c1) & ~hi
        free = active & ~hi & ~lo
        return _reduce((i32(hi), i32(lo), jnp.where(free, exp_x(x), 0.0)), "+++")

    def stats(t):
        # exp(t - a) = exp(t) / λ: no transcendental per prompt while exp(-a) is exact.
        nhi, nlo, s = lax.cond(
            t > _FAST_T,
            lambda: pieces(t, lambda x: w),
            lambda: pieces(t, lambda x: jnp.exp(jnp.minimum(x, c2))),
        )
        s = jnp.where(t > _FAST_T, jnp.exp(t) * s, s)
        return residual(nhi, nlo), s, nhi, nlo

    def residual(nhi, nlo):
        """``B - (n_max·#hi + n_min·#lo + s·#free)``, the budget left to the free prompts.
        Integer part in int32: float32 cannot hold budgets above 2**24 exactly. n_max·#hi
        can pass 2**31: saturated, the residual is then <= 0 either way, and only a
        positive one is used as a number."""
        rest = budget - n_min * nlo - shift * (k - nhi - nlo)  # in [0, B]: k·n_min <= B
        return rest - _sat_mul(n_max, nhi)

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

    # Start from the closed form with no bound active: τ = (B - sP) / Σ 1/λ (a start only:
    # w is clamped and its sum may overflow, which the `inside` test below catches).
    t0 = jnp.log(jnp.maximum(budget - shift * k, 1).astype(dt)) - jnp.log(sum_w)
    inside = (t0 > t_lo) & (t0 < t_hi)
    t0 = jnp.where(inside, t0, t_lo + (t_hi - t_lo) / 2)
    if t_guess is not None:  # warm start (the dynamic search solves nested active sets)
        use = (t_guess > t_lo) & (t_guess < t_hi)
        t0 = jnp.where(use, t_guess, t0)
        inside = inside & ~use
    zero = jnp.int32(0)
    init = (t_lo, t_hi, t0, zero, zero, inside, jnp.bool_(False), t_hi, zero)
    degenerate = (budget <= k * n_min) | (k <= budget // n_max)  # k·n_max <= B, unwrapped

    def solve():
        st = lax.while_loop(lambda st: ~st[6] & (st[8] < 400), body, init)
        return st[7]

    t = lax.cond(degenerate, lambda: jnp.where(budget <= k * n_min, t_lo, t_hi), solve)
    # Polish: t - a_q loses eps·|a_q| to cancellation when λ is tiny (|a| ~ 100s), but for
    # the free prompts a_q is within log((n_max-s)/(n_min-s)) of t, so t - a_q is exact
    # (Sterbenz); re-solve the piece's linear equation for a small offset d on top of t.
    nhi, nlo, s = pieces(t, lambda x: jnp.exp(jnp.minimum(x, c2)))
    r = residual(nhi, nlo)
    ok = (s > 0) & (r > 0)
    d = jnp.where(ok, jnp.log(jnp.where(ok, r.astype(dt), 1.0)) - jnp.log(jnp.where(ok, s, 1.0)),
                  0.0)
    nan = jnp.asarray(jnp.nan, dt)
    return jnp.where(k > 0, t, nan), jnp.where(k > 0, d, nan)


def _rates(p: Array, mask: Array) -> tuple[Array, Array]:
    """``a = log λ`` (clipped to ``[_A_MIN, _A_MAX]``, 0 off ``mask``) and ``w = 1/λ`` as
    :func:`_inv_lambda` clamps it, from one ``log1p``: a division instead of a second
    transcendental pass over the batch."""
    lam = -log1m(p)
    a = jnp.clip(jnp.where(mask, jnp.log(lam), 0.0), _A_MIN, _A_MAX)
    w = jnp.where(mask, 1.0 / jnp.clip(lam, float(np.exp(_W_CLAMP)), float(np.exp(_A_MAX))),
                  1.0)
    return a, w


def _inv_lambda(a: Array) -> Array:
    """``exp(-a) = 1/λ``, clamped where it could overflow (see ``_FAST_T``)."""
    return jnp.exp(-jnp.maximum(a, _W_CLAMP))


def _continuous_counts(a, active, t, n_min, n_max, shift):
    """``clip(s + exp(t - a_q), n_min, n_max)`` with ``t = (t_base, d)`` from the waterline."""
    t_base, d = t
    x = jnp.where(active, (t_base - a) + d, 0.0)
    n = jnp.clip(shift + jnp.exp(x), n_min.astype(a.dtype), n_max.astype(a.dtype))
    return jnp.where(active, n, 0.0)


def _clip_count(x: Array, lo: Array, hi: Array) -> Array:
    """``clip(x, lo, hi)`` of a float ``x`` as int32, exact at the bounds even where the
    float cannot hold them (float32 above 2**24): at +inf it must be ``hi``, not the float
    nearest to it. Monotone in x."""
    return jnp.where(x <= lo.astype(x.dtype), lo, jnp.where(x >= hi.astype(x.dtype), hi,
                                                            _to_count(x)))


def _round(cont, active, budget, n_min, n_max, add_key, remove_key):
    """Floor ``cont``, then hand out (take back) single rollouts, at most one per prompt per
    pass, to the prompts with the smallest ``add_key(n)`` (``remove_key(n)``), ties by index.
    After an accurate waterline one pass of additions suffices; the loop only guards
    against float error in the floor (a float32 count near 2**31 is off by hundreds). Each
    pass moves ``min(|r|, #candidates)`` rollouts towards the budget, never past it, so the
    loop ends with ``Σ n = B`` unless no prompt can move (an infeasible active set).
    """
    n0 = jnp.where(active, _clip_count(jnp.floor(cont), n_min, n_max), 0)

    def body(st):
        n, r, _ = st
        add = r > 0  # one selection call site for both directions keeps the program small
        cand = active & jnp.where(add, n < n_max, n > n_min)
        sel = _select_smallest(jnp.where(add, add_key(n), remove_key(n)), cand, jnp.abs(r))
        n = n + jnp.where(add, 1, -1) * sel.astype(jnp.int32)
        # Σ n may wrap int32 (x64 off) but B - Σ n is small: the wrapped difference is exact.
        r2 = budget - jnp.sum(n)
        return n, r2, r2 != r

    n, _, _ = lax.while_loop(
        lambda st: (st[1] != 0) & st[2], body, (n0, budget - jnp.sum(n0), jnp.bool_(True))
    )
    return n


def _level(n, a, shift):
    """``log(N - s) + log λ``: κ is increasing in it (NaN-free for N <= s)."""
    return jnp.log(jnp.maximum(n - shift, 1).astype(a.dtype)) + a


def _units_below(v: Array, a: Array, active: Array, n_min: Array, n_max: Array, shift: int,
                 ref: Array | None = None, w_ref: Array | None = None) -> Array:
    """Per prompt, its units (rollouts beyond ``n_min``) with level ``log(N - s) + a_q <= v``:
    ``clip(floor(s + exp(v - a_q)) + 1 - n_min, 0, n_max - n_min)``, nondecreasing in v.

    With ``w_ref = exp(ref - a)`` given, ``exp(v - a) = exp(v - ref) · w_ref``: no
    transcendental per prompt in a search whose levels stay near ``ref``.
    """
    if w_ref is None:
        e = jnp.exp(jnp.where(active, jnp.minimum(v - a, 80.0), 0.0))
    else:
        # v = +inf (a search that lost its bracket) must count every unit, even where
        # w_ref underflowed to 0.
        e = jnp.where(v == jnp.inf, jnp.inf, jnp.exp(jnp.minimum(v - ref, 80.0)) * w_ref)
    j = _clip_count(jnp.floor(shift + e), n_min - 1, n_max - 1) + 1 - n_min
    return jnp.where(active, jnp.clip(j, 0, n_max - n_min), 0)


def _leximin(a, active, budget, n_min, n_max, shift, t_c):
    """Exact leximin integers: the ``B - Σ n_min`` units with the lowest levels.

    Counting and ordering both go through one monotone formula (:func:`_units_below`), so
    they agree exactly. The K-th smallest level lies in ``[t_c - log 2, t_c]`` (``t_c`` the
    continuous waterline: at ``t_c`` every prompt holds at least its continuous count, at
    ``t_c - log 2`` at most it), so the search starts bracketed, and every level it visits
    is within ``log 2`` of ``t_c``: ``exp(t_c - a_q)`` is computed once.
    """
    dt = a.dtype
    ref = jnp.where(jnp.isfinite(t_c), t_c, 0.0)
    # exp(80) already exceeds any n_max: the clamp only avoids inf * 0.
    w_ref = jnp.exp(jnp.where(active, jnp.minimum(ref - a, 80.0), -jnp.inf))
    count = lambda v: _units_below(v, a, active, n_min, n_max, shift, ref, w_ref)
    pad = 1e-4 * jnp.maximum(jnp.abs(t_c), 1.0)
    # The unit count is about linear in exp(v): interpolate there.
    warp = (lambda v: jnp.exp(jnp.clip(v - ref, -80.0, 80.0)), lambda y: ref + jnp.log(y))
    return _select_units(count, active, budget, n_min, n_max, _ordered_uint(t_c - np.log(2) - pad),
                         _ordered_uint(t_c + pad), dt, rel_tol=4 * float(jnp.finfo(dt).eps),
                         warp=warp)


def _equalize(a, active, budget, n_min, n_max, shift, rounding, t_guess=None, w=None):
    w = _inv_lambda(a) if w is None else w
    t = _waterline_log(a, active, budget, n_min, n_max, shift, t_guess, w)
    cont = _continuous_counts(a, active, t, n_min, n_max, shift)
    t = t[0] + t[1]
    if rounding == "leximin":
        counts = _leximin(a, active, budget, n_min, n_max, shift, t)
    else:
        # [paper] smallest change of (κ(N) - κ*)^2. With L = (N - s) λ,
        # κ(N) - κ* = -exp(-τ) expm1(τ - L): drop the common factor exp(-2τ), which keeps
        # the order and avoids κ saturating at 1.
        lam = jnp.exp(a)
        tau = jnp.exp(jnp.where(jnp.isfinite(t), t, 0.0))
        dev = lambda n: jnp.square(jnp.expm1(jnp.minimum(tau - (n - shift) * lam, 80.0)))
        counts = _round(cont, active, budget, n_min, n_max,
                        lambda n: dev(n + 1) - dev(n), lambda n: dev(n - 1) - dev(n))
    return counts, t


def _required_counts(log_deg: Callable[[Array], Array], log_q: Array, lthr: Array,
                     n_max: Array) -> Array:
    """``m_q``: the fewest rollouts with ``log(1 - u(p_q, m)) <= lthr`` (``n_max + 1`` if none
    in ``[1, n_max]``). ``1 - u >= q^m`` with ``q = max(p, 1 - p)``, so ``m >= lthr / log q``;
    the other term ``min(p, 1-p)^m`` is tiny there, so stepping up from that bound (one
    below, against rounding) ends after a step or two."""
    # p in {0, 1} (log q = 0) is never mixed: the bound is +inf.
    bound = jnp.where(log_q < 0, lthr / jnp.where(log_q < 0, log_q, -1.0), jnp.inf)
    top = jnp.minimum(n_max, _INT32_MAX - 1)  # top + 1 must not wrap
    m = jnp.clip(_to_count(jnp.floor(jnp.clip(bound, 0.0, 2.0**31))), 1, top + 1)
    short = lambda m: (m <= top) & (log_deg(m.astype(lthr.dtype)) > lthr)

    def body(c):
        m, below = c
        m = m + below.astype(jnp.int32)
        return m, short(m)  # one evaluation of log_deg per step, shared with the test

    return lax.while_loop(lambda c: _any(c[1]), body, (m, short(m)))[0]


def _predict_k(a, w, seen, ukey, m_req, budget, n_min, n_max, shift):
    """A window ``[k_safe, k_up]`` for the largest k whose top-k set (ascending ``ukey``, ties
    by index) is feasible for the leximin allocation, found without allocating.

    Let ``R_S = max_S log(m_q - 1 - s) + a_q`` be the highest required level of a set S and
    ``need(S, v) = Σ_S (units_q(v) + n_min) - B``. If the units up to ``R_S`` fit in the
    budget (``need(S, R_S) <= 0``) every required unit is handed out: S is feasible. If the
    units strictly below ``R_S`` already fill it (``need(S, R_S^-) >= 0``) it is not. Only
    near-ties at ``R_S`` (many prompts with one p, broken by index) fall in between.
    ``need`` grows with S, so each bound is a threshold search over ``ukey`` (then over the
    index inside the tie group at the boundary), two passes per step.
    """
    dt = a.dtype
    inf = jnp.asarray(jnp.inf, dt)
    lvl = _level(m_req - 1, a, shift)
    req = jnp.where(m_req > n_max, inf, jnp.where(m_req > n_min, lvl, -inf))
    tol = 64 * float(jnp.finfo(dt).eps)
    i32 = lambda m: m.astype(jnp.int32)
    wide = _wide(n_max - n_min, seen.shape[0])

    def need(mask, side):
        (r,) = _reduce((jnp.where(mask, req, -inf),), ">")
        v = r + side * tol * jnp.maximum(jnp.abs(r), 1.0)

        def units(fast):
            u = lambda: _units_below(v, a, mask, n_min, n_max, shift, *((0.0, w) if fast else ()))
            return _reduce_counts(lambda: (u(), i32(mask)), "s+", wide)

        # The unit total is saturated (it reaches |S|·(n_max - n_min)); B - n_min·|S| >= 0,
        # so `feasible` stays in [-B, 2**31) and keeps its sign.
        total, size = lax.cond(v > _FAST_T, lambda: units(True), lambda: units(False))
        feasible = total - (budget - n_min * size)
        # Sets holding a prompt that can never be mixed enough: positive, still monotone.
        return jnp.where(r == inf, jnp.maximum(_sat_mul(n_max, size) - budget, 0) + 1,
                         feasible)

    idx = jnp.arange(seen.shape[0], dtype=jnp.int32)
    big = jnp.asarray(jnp.iinfo(ukey.dtype).max, ukey.dtype)
    n_seen, vmin, vmax = _reduce(
        (i32(seen), jnp.where(seen, ukey, big), jnp.where(seen, ukey, jnp.zeros_like(big))),
        "+<>")

    def largest_below(side, target, v_lo):
        """(largest k with need(top-k, side) < target, the ukey threshold it stopped at)."""

        def boundary():
            v = _search(lambda v: need(seen & (ukey <= v), side), target, v_lo, vmax)
            base = seen & (ukey < v)
            tie = seen & (ukey == v)
            n_base, n_tie, i_min, i_max = _reduce(
                (i32(base), i32(tie), jnp.where(tie, idx, seen.shape[0]),
                 jnp.where(tie, idx, -1)), "++<>")
            i = lax.cond(n_tie == 1, lambda: i_min,
                         lambda: _search(lambda i: need(base | (tie & (idx <= i)), side), target,
                                         i_min - 1, i_max))
            return n_base + _sum((tie & (idx < i)).astype(jnp.int32)), v

        return lax.cond(need(seen, side) < target, lambda: (n_seen, vmax), boundary)

    def bound(i, c):
        # Pass 0: k_safe = largest k with need(top-k, R) < 1. Pass 1: k_up = largest k with
        # need(top-k, R^-) < 0; need(., R^-) <= need(., R), so it starts where pass 0
        # stopped. One loop, not two calls: each call site of `largest_below` is compiled
        # (two searches over `need`), and it was most of the dynamic rule's program.
        k_safe, v_safe, _ = c
        first = i == 0
        side = jnp.where(first, 1.0, -2.0).astype(dt)
        v_lo = lax.cond(first, lambda: vmin - 1, lambda: jnp.where(
            need(seen & (ukey < v_safe), side) < 0, v_safe - 1, vmin - 1))
        k, v = largest_below(side, jnp.where(first, 1, 0), v_lo)
        return jnp.where(first, k, k_safe), jnp.where(first, v, v_safe), k

    k_safe, _, k_up = lax.fori_loop(0, 2, bound, (jnp.int32(0), vmin, jnp.int32(0)))
    return k_safe, jnp.maximum(k_up, k_safe)


def _saturation_score(ldeg: Array) -> Array:
    """The ranking key of the dynamic active set (ascending = highest ``u(p, n_max)``
    first), from ``ldeg = log(1 - u(p, n_max)) = log((1-p)^n + p^n)``.

    [paper] ranks by u in float64, where u near 1 is quantised to ``1 - j·2**-53``: where
    ``j >= 1`` the key is ``j = round(2**53 (1 - u))`` (its order and its ties, broken by
    index, in any float width). Where u rounds to 1 (``j = 0``; for n_max = 65,536 most of
    a batch) float64 keeps no order at all and ranking would fall back to index order; the
    key there is ``ldeg`` itself (< log(2**-54) < 0, below every ``j >= 1``), which stays
    distinct in log space: the published order wherever u is representable, the order of
    the exact u beyond it.
    """
    x53 = jnp.exp(ldeg + 53 * np.log(2))
    j = jnp.where(x53 < 2.0**24, jnp.round(x53), x53)
    return jnp.where(j > 0, j, ldeg)


def _dynamic(p, a, w, seen, budget, n_min, n_max, shift, rounding, threshold):
    """[paper] dynamic active set: the largest feasible top-k by ``u(p, n_max)``
    (:func:`_saturation_score`: distinct even where u rounds to 1).

    The paper binary-searches k, allocating every candidate. Here the answer is predicted
    first (:func:`_predict_k`, no allocation) and then verified by allocating k and k + 1;
    only when that fails (near-ties, paper rounding) does a bisection continue inside the
    bracket the two allocations left, so the result is the paper's for any rounding.
    """
    lthr = jnp.log1p(-threshold).astype(a.dtype)
    lp, l1p = jnp.log(p), jnp.log1p(-p)
    log_deg = lambda n: jnp.logaddexp(n * l1p, n * lp)  # log(1 - u(p, n)), see scaling
    ldeg = jnp.where(seen, log_deg(n_max.astype(a.dtype)), 0.0)
    n_elig = _sum((seen & (ldeg <= lthr)).astype(jnp.int32))
    score = _saturation_score(ldeg)
    k_lo = budget // n_max + (budget % n_max > 0)  # ceil(B / n_max); B + n_max can wrap
    k_hi = jnp.maximum(n_elig, k_lo)

    m_req = _required_counts(log_deg, jnp.maximum(lp, l1p), lthr, n_max)
    s_lo, s_hi = _predict_k(a, w, seen, _ordered_uint(score), m_req, budget, n_min, n_max,
                            shift)
    s_lo, s_hi = jnp.clip(s_lo, k_lo, k_hi), jnp.clip(s_hi, k_lo, k_hi)

    def evaluate(k, t_guess):
        act = _select_smallest(score, seen, k)  # top-k by score, ties by index
        counts, t = _equalize(a, act, budget, n_min, n_max, shift, rounding, t_guess, w)
        ok = ~_any(act & (log_deg(counts.astype(a.dtype)) > lthr))
        return ok, (counts, act, t)

    # Invariant: the answer is in [lo, hi]; lo is feasible, or lo == k_lo (the answer when
    # nothing is feasible). Probes bisect the predicted window [s_lo, s_hi] first; if the
    # answer turns out to lie outside, they gallop away from it (±1, 2, 4, ...) until one
    # disagrees, then bisect [lo, hi]. Ends once the allocation of lo is in hand.
    def body(c):
        lo, hi, j, bisect, best_k, best, t_last = c
        w_lo, w_hi = jnp.maximum(lo, s_lo - 1), jnp.minimum(hi, s_hi)
        in_window = ~bisect & (w_lo < w_hi)
        up = ~bisect & ~in_window & (lo >= w_hi)
        down = ~bisect & ~in_window & ~up
        step = jnp.left_shift(jnp.int32(1), jnp.minimum(j, 30))
        k = jnp.where(in_window, w_lo + (w_hi - w_lo + 1) // 2,
                      jnp.where(up, lo + jnp.minimum(step, hi - lo),  # min(lo + step, hi)
                                jnp.where(down, hi - jnp.minimum(step - 1, hi - lo - 1),
                                          lo + (hi - lo + 1) // 2)))
        k = jnp.where(lo >= hi, lo, k)
        ok, alloc = evaluate(k, t_last)
        take = ok | (k == lo)
        best = jax.tree.map(lambda new, old: jnp.where(take, new, old), alloc, best)
        lo2 = jnp.where(ok, jnp.maximum(lo, k), lo)
        hi2 = jnp.where(ok, hi, jnp.maximum(jnp.minimum(hi, k - 1), lo))
        galloped = up | down
        return (lo2, hi2, j + galloped.astype(jnp.int32), bisect | (up & ~ok) | (down & ok),
                jnp.where(take, k, best_k), best, alloc[2])

    nan = jnp.asarray(jnp.nan, a.dtype)
    empty = (jnp.zeros_like(seen, jnp.int32), jnp.zeros_like(seen), nan)
    init = (k_lo, k_hi, jnp.int32(0), jnp.bool_(False), jnp.int32(-1), empty, nan)
    out = lax.while_loop(lambda c: (c[0] < c[1]) | (c[4] != c[0]), body, init)
    return out[5]
