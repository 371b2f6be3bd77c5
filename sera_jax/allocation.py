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
  so leximin over κ is leximin over levels. Handing out rollouts one at a time to the
  prompt whose current level is lowest yields the leximin allocation (the exchange and
  brute-force tests check it), i.e. the ``B - Σ n_min`` single-rollout "units" with the
  lowest levels. They are found as a second waterline on integer levels: prompt q holds
  ``floor(s + exp(v - a_q)) + 1`` rollouts at level v, and the threshold v is searched
  (secant steps in exp(v), bisection as the safeguard, no sort) inside ``[t* - log 2, t*]``.
  Near-ties (within ``4 ulp``) go to the prompt with fewer rollouts, whose next rollout
  raises κ most, then to the lower index. (Floor-then-top-up is *not* exact: a prompt
  clipped at ``n_max`` may have to give a rollout back.)
* **Active set [paper].** The top-k prompts by the mixed-group probability
  ``u(p, n_max)`` share the budget, k the largest for which every active prompt keeps
  ``u(p, N_q) >= θ``. The paper bisects k, allocating every candidate. Here a window for k
  is predicted without allocating (a set is feasible when the units below its highest
  required level fit in the budget -- two cheap passes per threshold step), then k is
  bisected inside the window with full allocations (usually 2-4), galloping outwards if
  the window was wrong, so the result is the bisection's for either rounding. The ranking
  reproduces the paper's float64 one, ties included (u is quantised to multiples of 2**-53
  near 1, tied prompts keep index order).
* **Passes.** Each step of every search is one pass over P; sums and integer min/max
  share one variadic reduce (see ``_reduce``), selection by index uses a 32-ary tree of
  partial sums (no cumsum, no sort).
* **Paper rounding.** Floor, then +1 for the prompts with the smallest change of
  ``(κ(N) - κ*)^2``, ties by index -- evaluated as ``expm1(τ* - L)^2`` (the common factor
  ``exp(-2τ*)`` dropped) so it does not saturate when ``κ*`` rounds to 1; a float64
  implementation of the formula falls back to index order there (see
  docs/results_allocation.md).

``p = 0`` is treated as the limit ``p -> 0+`` (harder than every representable p: it gets
``n_max`` first) and ``p = 1`` as ``p -> 1-`` (easier than all: ``n_min``); this is what
SERA_SPEC §3 prescribes. Inputs are float32 unless ``jax_enable_x64`` is on, in which case
every step runs in float64 (p down to 1e-300); float32 subnormals (p < 1.2e-38) are 0.
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

from sera_jax.scaling import kappa, log1m

__all__ = [
    "ALLOCATORS",
    "ALLOCATOR_OPTIONS",
    "Allocation",
    "allocate",
    "check_options",
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
# exp(t - a_q) = exp(t) * exp(-a_q): with exp(-a) precomputed, the passes of the waterline
# and of the leximin search need no transcendental per prompt. Valid (no overflow, no
# clamping of a prompt that can be free) while t > _FAST_T; below, exp(t - a) is used.
_FAST_T = -50.0
_W_CLAMP = -75.0
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


def _from_ordered_uint(u: Array, dtype) -> Array:
    """Inverse of :func:`_ordered_uint`."""
    bits = jnp.finfo(dtype).bits
    top = jnp.asarray(1 << (bits - 1), u.dtype)
    return lax.bitcast_convert_type(jnp.where(u >= top, u ^ top, ~u), dtype)


def _reduce(ops: tuple[Array, ...], kinds: str) -> tuple[Array, ...]:
    """Reduce every operand over axis 0 in ONE pass; ``kinds[i]`` is ``+``, ``<`` (min) or
    ``>`` (max).

    One variadic reduce reads the fused producers once. On XLA:CPU this is much cheaper
    per pass than ``jnp.sum``/``min``/``max``: each of those is its own loop, integer sums
    become a tree of reduce-windows and float ones an external (YNN) kernel with a jittery
    thread hand-off. Float min/max go through :func:`_ordered_uint` (the NaN-propagating
    float min/max is not vectorised there: 50x slower).
    """
    fns = {"+": lax.add, "<": lax.min, ">": lax.max}
    dtypes = [x.dtype for x in ops]
    floats = [k != "+" and jnp.issubdtype(d, jnp.floating) for d, k in zip(dtypes, kinds)]
    ops = [_ordered_uint(x) if f else x for x, f in zip(ops, floats, strict=True)]

    def identity(dtype, kind):
        if kind == "+":
            return jnp.zeros((), dtype)
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.max if kind == "<" else info.min, dtype)

    inits = tuple(identity(x.dtype, k) for x, k in zip(ops, kinds, strict=True))
    out = lax.reduce(tuple(ops), inits,
                     lambda u, v: tuple(fns[k](a, b) for k, a, b in zip(kinds, u, v)), (0,))
    return tuple(_from_ordered_uint(y, d) if f else y
                 for y, f, d in zip(out, floats, dtypes))


def _sum(x: Array) -> Array:
    """``Σ x`` over axis 0 in x's own dtype (``jnp.sum`` would widen int32 under x64)."""
    return _reduce((x,), "+")[0]


def _any(x: Array) -> Array:
    return _reduce((x.astype(jnp.int32),), ">")[0] > 0


def _search(total, target, lo, hi, dtype=None, ends=None, warp=None):
    """Smallest ``v`` in ``(lo, hi]`` (unsigned or int keys) with ``total(v) >= target`` for
    a nondecreasing step function ``total``, given ``total(lo) < target <= total(hi)``.

    Steps take the secant through the last two probes (at first the bracket ends), in the
    float values when ``dtype`` says ``v`` is ``_ordered_uint`` of a float (in ``f`` of them
    with ``warp = (f, f_inv)``, where ``total`` is closer to linear), falling back to the
    bracket ends when the secant leaves the bracket. That ends after a handful of passes on
    smooth data; a step that fails to halve the residual ``|total - target|`` of the end it
    moved is followed by a bisection, so the search takes at most about
    ``2·(bits + log2(total(hi) - total(lo)))`` passes. Stops early when
    ``total(hi) == target``. ``ends = (total(lo), total(hi))`` when already known.
    """
    f, f_inv = warp if warp is not None else (lambda x: x, lambda y: y)

    def line(a, ca, b, cb, lo, hi):
        """Key where the line through (a, ca), (b, cb) reaches ``target``, and whether it is
        usable (strictly inside ``(lo, hi)``)."""
        flat = cb == ca
        t = (target - ca).astype(jnp.float32) / jnp.where(flat, 1, cb - ca).astype(jnp.float32)
        if dtype is not None:
            fa, fb = f(_from_ordered_uint(a, dtype)), f(_from_ordered_uint(b, dtype))
            x = f_inv(fa + (fb - fa) * t.astype(dtype))
            g = _ordered_uint(jnp.where(jnp.isfinite(x), x, 0.0))
            usable = jnp.isfinite(x) & jnp.isfinite(fb - fa)
            # A step below one ulp rounds onto the end it started from: still usable (the
            # clip below moves it one key inwards).
        else:
            # Offsets from a, in the key's own integer type (b - a may be negative).
            up = b >= a
            d = jnp.where(up, b - a, a - b).astype(jnp.float32)
            step = jnp.abs(t) * d
            forward = up == (t >= 0)
            room = jnp.where(forward, hi - a, a - lo).astype(jnp.float32)
            s = jnp.minimum(jnp.round(step), room).astype(a.dtype)
            g = jnp.where(forward, a + s, a - s)
            usable = jnp.isfinite(step)
        return g, usable & ~flat & (g >= lo) & (g <= hi)

    def body(c):
        lo, hi, clo, chi, bisect, _, px, pc, lx, lc = c
        g_sec, ok_sec = line(px, pc, lx, lc, lo, hi)
        g_rf, ok_rf = line(lo, clo, hi, chi, lo, hi)
        half = lo + (hi - lo) // 2
        mid = jnp.where(bisect, half, jnp.where(ok_sec, g_sec, jnp.where(ok_rf, g_rf, half)))
        mid = jnp.clip(mid, lo + 1, hi - 1)
        cm = total(mid)
        ok = cm >= target
        lo2, hi2 = jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)
        # Progress is the residual of the end that moved, not the bracket width.
        slow = jnp.where(ok, 2 * (cm - target) > chi - target, 2 * (target - cm) > target - clo)
        return (lo2, hi2, jnp.where(ok, clo, cm), jnp.where(ok, cm, chi), slow & ~bisect,
                cm == target, lx, lc, mid, cm)

    clo, chi = (total(lo), total(hi)) if ends is None else ends
    init = (lo, hi, clo, chi, jnp.bool_(False), jnp.bool_(False), lo, clo, hi, chi)
    return lax.while_loop(lambda c: (c[1] - c[0] > 1) & ~c[5], body, init)[1]


def _kth_smallest(ukey: Array, mask: Array, k: Array) -> Array:
    """The k-th smallest ``ukey`` over ``mask`` (``1 <= k <= #mask``)."""
    big = jnp.asarray(jnp.iinfo(ukey.dtype).max, ukey.dtype)
    vmin, vmax = _reduce((jnp.where(mask, ukey, big), jnp.where(mask, ukey, jnp.zeros_like(big))),
                         "<>")
    count = lambda v: _sum((mask & (ukey <= v)).astype(jnp.int32))
    c_min = count(vmin)
    hi = lax.cond(c_min >= k, lambda: vmin,
                  lambda: _search(count, k, vmin, jnp.maximum(vmax, vmin + 1),
                                  ends=(c_min, _sum(mask.astype(jnp.int32)))))
    return _reduce((jnp.where(mask & (ukey <= hi), ukey, jnp.zeros_like(big)),), ">")[0]


def _kth_position(c: Array, k: Array) -> tuple[Array, Array]:
    """For nonnegative int counts ``c``: the smallest j with ``Σ_{i<=j} c_i >= k`` and
    ``Σ_{i<j} c_i``. A 32-ary tree of partial sums (one pass over ``c``, then a few tiny
    32x32 prefix sums): XLA:CPU's cumsum is a reduce-window, slow even on 1,024 items."""
    size = c.shape[0]
    if size <= 32:
        lower = jnp.arange(size)[None, :] < jnp.arange(size)[:, None]
        before = jnp.sum(jnp.where(lower, c[None, :], 0), axis=1)
        j = jnp.minimum(jnp.sum(before + c < k, dtype=jnp.int32), size - 1)
        return j, before[j]
    groups = -(-size // 32)
    c = jnp.pad(c, (0, groups * 32 - size))
    g, skipped = _kth_position(jnp.sum(c.reshape(groups, 32), axis=1), k)
    j, inside = _kth_position(lax.dynamic_slice_in_dim(c, g * 32, 32), k - skipped)
    return g * 32 + j, skipped + inside


def _first_by_index(mask: Array, k: Array) -> Array:
    """The ``k`` lowest-index True entries of ``mask`` (``0 <= k <= #mask``)."""
    # Only the index of the last one goes through the cond: the mask itself then fuses
    # into its consumer instead of being materialised by both branches.
    last = lax.cond(k > 0, lambda: _kth_position(mask.astype(jnp.int32), k)[0].astype(jnp.int32),
                    lambda: jnp.int32(-1))
    return mask & (jnp.arange(mask.shape[0], dtype=jnp.int32) <= last)


def _select_smallest(key: Array, mask: Array, k: Array) -> Array:
    """Exactly ``min(k, #mask)`` entries of ``mask`` with the smallest ``key``, ties by index."""
    k = jnp.clip(k, 0, _sum(mask.astype(jnp.int32)))
    key = jnp.where(mask, key, jnp.zeros_like(key))

    def select():
        u = _ordered_uint(key)
        v = _kth_smallest(u, mask, k)
        below = mask & (u < v)
        tie = mask & (u == v)
        n_below, n_tie = _reduce((below.astype(jnp.int32), tie.astype(jnp.int32)), "++")
        need = k - n_below
        take = lax.cond(n_tie == need, lambda: tie, lambda: _first_by_index(tie, need))
        return below | take

    return lax.cond(k > 0, select, lambda: jnp.zeros_like(mask))


def _select_units(count_fn, mask, budget, n_min, n_max, lo, hi, dtype, rel_tol, warp=None):
    """Hand out ``K = B - Σ n_min`` single rollouts ("units" ``N -> N+1``) in increasing order
    of their keys (nondecreasing in N for every prompt): the K smallest unit keys.

    ``count_fn(v)`` gives per prompt the number of its units with key ``<= v``; it must be
    nondecreasing in v, 0 at ``-inf`` and all units at ``+inf``. ``lo``/``hi`` (ordered
    uints) should bracket the K-th smallest key; where they do not, ``∓inf`` are used. Keys
    within ``rel_tol`` of the K-th smallest count as tied: tied units go to the prompt with
    fewer rollouts, then the lower index -- for κ levels that is the unit that raises κ
    most, as leximin wants.
    """
    width = n_max - n_min
    as_f = lambda u: _from_ordered_uint(u, dtype)
    total = lambda u: _sum(count_fn(as_f(u)))
    # Both bracket ends and the prompt count in one pass over the batch.
    c_lo, c_hi, num = _reduce(
        (count_fn(as_f(lo)), count_fn(as_f(hi)), mask.astype(jnp.int32)), "+++")
    kk = budget - n_min * num

    def solve():
        inf = jnp.asarray(jnp.inf, dtype)
        lo_ok, hi_ok = c_lo < kk, c_hi >= kk
        lo2 = jnp.where(lo_ok, lo, _ordered_uint(-inf))
        hi2 = jnp.where(hi_ok, hi, _ordered_uint(inf))
        hi3 = _search(total, kk, lo2, jnp.maximum(hi2, lo2 + 1), dtype,
                      ends=(jnp.where(lo_ok, c_lo, 0), jnp.where(hi_ok, c_hi, num * width)),
                      warp=warp)
        # Now total(< hi3) < K <= total(hi3): widen to the tolerance band around hi3.
        vh = as_f(hi3)
        tol = jnp.where(jnp.isfinite(vh), rel_tol * jnp.maximum(jnp.abs(vh), 1.0), 0.0)
        lo_q = count_fn(jnp.where(tol > 0, vh - tol, as_f(hi3 - 1)))
        hi_q = count_fn(vh + tol)
        s_lo, s_hi = _reduce((lo_q, hi_q), "++")
        # Usually the band holds exactly the units still needed: no tie to break.
        return lax.cond(s_hi == kk, lambda: hi_q, lambda: break_ties(lo_q, hi_q, kk - s_lo))

    def break_ties(lo_q, hi_q, need):
        # Tied units: level by level in N (fewest rollouts first), then by index. Unit j of
        # a prompt is in the band when lo_q <= j < hi_q; m is the smallest j whose band
        # units, with all band units below j, cover `need`. (A scatter-add histogram over
        # j was measured slower than this search on XLA:CPU.)
        band = mask & (hi_q > lo_q)
        m_lo, m_hi = _reduce((jnp.where(band, lo_q, width), jnp.where(band, hi_q - 1, 0)), "<>")
        upto_m = lambda m: _sum(jnp.clip(jnp.minimum(hi_q, m + 1) - lo_q, 0))
        top = jnp.maximum(m_hi, m_lo + 1)
        c_lo = upto_m(m_lo)
        m = lax.cond(c_lo >= need, lambda: m_lo,
                     lambda: _search(upto_m, need, m_lo, top, ends=(c_lo, upto_m(top))))
        take = jnp.clip(jnp.minimum(hi_q, m) - lo_q, 0)
        tie = mask & (lo_q <= m) & (m < hi_q)
        extra = _first_by_index(tie, need - _sum(take))
        return lo_q + take + extra.astype(jnp.int32)

    taken = lax.cond(
        kk <= 0, lambda: jnp.zeros_like(mask, jnp.int32),
        lambda: lax.cond(kk >= num * width, lambda: jnp.where(mask, width, 0), solve),
    )
    return jnp.where(mask, n_min + taken, 0)


def _spread(mask: Array, budget: Array) -> Array:
    """Uniform split of ``budget`` over ``mask``: ``B // m`` each, +1 for the first ``B % m``."""
    m = jnp.maximum(_sum(mask.astype(jnp.int32)), 1)
    q = budget // m
    extra = _first_by_index(mask, budget - q * m)
    return jnp.where(mask, q + extra.astype(jnp.int32), 0)


# ---------------------------------------------------------------------------------------
# The continuous waterline (exact) and its integer roundings.
# ---------------------------------------------------------------------------------------


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
        nfree = k - nhi - nlo
        # Integer part in int32: float32 cannot hold budgets above 2**24 exactly.
        fixed = n_max * nhi + n_min * nlo + shift * nfree
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
    degenerate = (budget <= k * n_min) | (budget >= k * n_max)

    def solve():
        st = lax.while_loop(lambda st: ~st[6] & (st[8] < 400), body, init)
        return st[7]

    t = lax.cond(degenerate, lambda: jnp.where(budget <= k * n_min, t_lo, t_hi), solve)
    # Polish: t - a_q loses eps·|a_q| to cancellation when λ is tiny (|a| ~ 100s), but for
    # the free prompts a_q is within log((n_max-s)/(n_min-s)) of t, so t - a_q is exact
    # (Sterbenz); re-solve the piece's linear equation for a small offset d on top of t.
    nhi, nlo, s = pieces(t, lambda x: jnp.exp(jnp.minimum(x, c2)))
    r = budget - (n_max * nhi + n_min * nlo + shift * (k - nhi - nlo))
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


def _round(cont, active, budget, n_min, n_max, add_key, remove_key):
    """Floor ``cont``, then hand out (take back) single rollouts, at most one per prompt per
    pass, to the prompts with the smallest ``add_key(n)`` (``remove_key(n)``), ties by index.
    After an accurate waterline one pass of additions suffices; the loop only guards
    against float error in the floor.
    """
    n0 = jnp.where(active, jnp.clip(jnp.floor(cont).astype(jnp.int32), n_min, n_max), 0)

    def body(st):
        n, r, it = st
        add = r > 0  # one selection call site for both directions keeps the program small
        cand = active & jnp.where(add, n < n_max, n > n_min)
        sel = _select_smallest(jnp.where(add, add_key(n), remove_key(n)), cand, jnp.abs(r))
        n = n + jnp.where(add, 1, -1) * sel.astype(jnp.int32)
        return n, budget - jnp.sum(n), it + 1

    n, _, _ = lax.while_loop(
        lambda st: (st[1] != 0) & (st[2] < 64), body, (n0, budget - jnp.sum(n0), 0)
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
    j = jnp.clip(jnp.floor(shift + e), n_min - 1, n_max - 1)
    j = j.astype(jnp.int32) + 1 - n_min
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
    m = jnp.clip(jnp.floor(jnp.clip(bound, 0.0, 2.0**30)).astype(jnp.int32), 1, n_max + 1)
    short = lambda m: (m <= n_max) & (log_deg(m.astype(lthr.dtype)) > lthr)

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

    def need(mask, side):
        (r,) = _reduce((jnp.where(mask, req, -inf),), ">")
        v = r + side * tol * jnp.maximum(jnp.abs(r), 1.0)

        def units(fast):
            u = _units_below(v, a, mask, n_min, n_max, shift, *((0.0, w) if fast else ()))
            return _reduce((u, i32(mask)), "++")

        total, size = lax.cond(v > _FAST_T, lambda: units(True), lambda: units(False))
        feasible = total + n_min * size - budget
        # Sets holding a prompt that can never be mixed enough: positive, still monotone.
        return jnp.where(r == inf, jnp.maximum(n_max * size - budget, 0) + 1, feasible)

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

    k_safe, v_safe = largest_below(1.0, 1, vmin - 1)
    # need(., R^-) <= need(., R): the second search starts where the first one stopped.
    v_lo = jnp.where(need(seen & (ukey < v_safe), -2.0) < 0, v_safe - 1, vmin - 1)
    k_up, _ = largest_below(-2.0, 0, v_lo)
    return k_safe, jnp.maximum(k_up, k_safe)


def _dynamic(p, a, w, seen, budget, n_min, n_max, shift, rounding, threshold):
    """[paper] dynamic active set: the largest feasible top-k by ``u(p, n_max)``.

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
    # [paper] ranks by u in float64, where u near 1 is quantised to 1 - j·2**-53 (u == 1
    # once 1 - u < 2**-54): prompts in one quantum tie and keep their index order. Ranking
    # by round(2**53 (1 - u)) reproduces that order in any float width.
    x53 = jnp.exp(ldeg + 53 * np.log(2))
    score = jnp.where(x53 < 2.0**24, jnp.round(x53), x53)
    k_lo = (budget + n_max - 1) // n_max
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
                      jnp.where(up, jnp.minimum(lo + step, hi),
                                jnp.where(down, jnp.maximum(hi - step + 1, lo + 1),
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


# ---------------------------------------------------------------------------------------
# Peers whose objective is a sum of concave per-prompt terms: greedy on marginal gains.
# ---------------------------------------------------------------------------------------


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
            mid = (lo + hi) // 2
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


# ---------------------------------------------------------------------------------------
# The jitted core shared by every allocator.
# ---------------------------------------------------------------------------------------


def _seen_rule(rule, rounding, p, seen, budget, n_min, n_max, shift, threshold, alpha, beta):
    """Counts for the seen prompts (those with a finite p) sharing ``budget``."""
    p0 = jnp.where(seen, p, 0.5)
    a, w = _rates(p0, seen)
    nan = jnp.asarray(jnp.nan, p.dtype)
    if rule == "dynamic":
        return _dynamic(p0, a, w, seen, budget, n_min, n_max, shift, rounding, threshold)
    if rule == "equalized":
        counts, t = _equalize(a, seen, budget, n_min, n_max, shift, rounding, w=w)
        return counts, seen, t
    if rule == "uniform":
        return _spread(seen, budget), seen, nan
    if rule == "inverse_p":
        # n_q = 1 + (B - P) (1/p_q) / Σ 1/p_j is the waterline with λ -> p and s = 1.
        ap = jnp.clip(jnp.where(seen, jnp.log(p0), 0.0), _A_MIN, _A_MAX)
        t = _waterline_log(ap, seen, budget, n_min, n_max, 1)
        cont = _continuous_counts(ap, seen, t, n_min, n_max, 1)
        frac = cont - jnp.floor(cont)
        counts = _round(cont, seen, budget, n_min, n_max,  # largest remainder
                        lambda n: -frac, lambda n: frac)
        return counts, seen, nan
    if rule == "knapsack":
        return _greedy_units(_knapsack_key(p0), seen, budget, n_min, n_max), seen, nan
    if rule == "hit_utility":
        al = jnp.where(seen, alpha, 1.0)
        be = jnp.where(seen, beta, 1.0)
        return _greedy_units(_hit_key(al, be), seen, budget, n_min, n_max), seen, nan
    raise ValueError(f"unknown rule {rule!r}")


def _flush_subnormals(p: Array) -> Array:
    """XLA flushes subnormals to zero on CPU but not everywhere: make it explicit."""
    return jnp.where(jnp.abs(p) < jnp.finfo(p.dtype).tiny, jnp.zeros((), p.dtype), p)


@functools.partial(jax.jit, static_argnames=("rule", "rounding", "shift", "unseen", "padded",
                                             "maybe_nan"))
def _core(p, num, budget, n_min, n_max, threshold, alpha, beta, *, rule, rounding, shift,
          unseen, padded=True, maybe_nan=True):
    # `padded` / `maybe_nan` False (known on the host) drop the masks and passes that only
    # padding or unseen prompts need: each pass costs ~20-50 us at 65,536 prompts on CPU.
    p = _flush_subnormals(p)
    valid = jnp.arange(p.shape[0]) < num if padded else jnp.ones(p.shape, bool)
    if maybe_nan:
        known = valid & ~jnp.isnan(p)
        hidden = valid & jnp.isnan(p)
        n_hidden = _sum(hidden.astype(jnp.int32))
    else:
        known, hidden, n_hidden = valid, None, jnp.int32(0)
    n_valid = jnp.asarray(num, jnp.int32)
    q = budget // n_valid
    r = budget - q * n_valid
    args = (p, known)

    def fill():
        if hidden is None:
            return _seen_rule(rule, rounding, *args, budget, n_min, n_max, shift, threshold,
                              alpha, beta)
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

    if unseen == "fallback" and hidden is not None:
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
    have = act & known
    kap = kappa(jnp.where(known, p, 0.0), counts, shift)
    i32 = lambda m: m.astype(jnp.int32)
    k_min, k_sum, nk, na, at_min, at_max = _reduce(
        (jnp.where(have, kap, jnp.inf), jnp.where(have, kap, 0.0), i32(have), i32(act),
         i32(act & (counts == n_min)), i32(act & (counts == n_max))), "<+++++")
    nan = jnp.asarray(jnp.nan, p.dtype)
    tau = jnp.exp(t)
    frac = lambda n: n.astype(p.dtype) / jnp.maximum(na, 1).astype(p.dtype)
    return Allocation(
        counts=counts,
        weights=weights,
        active=act,
        tau=tau,
        kappa_star=-jnp.expm1(-tau),
        kappa_min=jnp.where(nk > 0, k_min, nan),
        kappa_mean=jnp.where(nk > 0, k_sum / jnp.maximum(nk, 1), nan),
        frac_at_n_min=frac(at_min),
        frac_at_n_max=frac(at_max),
        num_active=na,
    )


@jax.jit
def _waterline_core(p, num, budget, n_min, n_max, shift):
    p = _flush_subnormals(p)
    valid = jnp.arange(p.shape[0]) < num
    a, w = _rates(jnp.where(valid, p, 0.5), valid)
    t = _waterline_log(a, valid, budget, n_min, n_max, shift, w=w)
    tau = jnp.exp(t[0] + t[1])
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
    maybe_nan = True
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
        # min/max propagate NaN: two fast reductions settle the common case.
        maybe_nan = not (host.min() >= 0 and host.max() <= 1)
        if maybe_nan:
            nan = np.isnan(host) if np.issubdtype(host.dtype, np.floating) else None
            if nan is not None and not allow_nan and nan.any():
                raise ValueError(
                    f"p contains NaN (unseen prompts) at indices "
                    f"{np.flatnonzero(nan)[:8].tolist()}; allowed range is [0, 1] -- use "
                    "unseen='fill' or 'fallback' to allocate them"
                )
            bad = (host < 0) | (host > 1)  # False for NaN, True for +-inf
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"p must lie in [0, 1], got p[{i}] = {host[i]!r}")
        pa = host.astype(dtype, copy=False)
    num = pa.shape[0]
    if static(budget, n_min, n_max) and not num * n_min <= budget <= num * n_max:
        raise ValueError(
            f"budget must be in [P*n_min, P*n_max] = [{num * n_min}, {num * n_max}] for "
            f"P={num}, n_min={n_min}, n_max={n_max}; got {budget}"
        )
    size = max(8, 1 << (num - 1).bit_length())
    if size > num:
        xp = jnp if _is_traced(pa) else np
        pa = xp.concatenate([pa, xp.full((size - num,), 0.5, dtype)])
    p_pad = pa  # a host array goes straight to the jitted call (one transfer)
    ints = [x if _is_traced(x) else np.int32(x) for x in (num, budget, n_min, n_max)]
    return p_pad, num, ints, maybe_nan


def _trim(tree, num):
    size = tree.counts.shape[0] if isinstance(tree, Allocation) else tree[2].shape[0]
    if size == num:
        return tree
    return jax.tree.map(lambda x: x[:num] if x.ndim == 1 else x, tree)


def _run(rule, p, budget, *, n_min, n_max, shift, unseen, rounding="leximin", threshold=0.05,
         alpha=None, beta=None):
    if unseen not in _UNSEEN:
        raise ValueError(f"unseen must be one of {_UNSEEN}, got {unseen!r}")
    p_pad, num, (n, b, lo, hi), maybe_nan = _prepare(
        p, budget, n_min, n_max, shift, allow_nan=unseen != "error", threshold=threshold)
    size = p_pad.shape[0]
    if alpha is not None:
        alpha = jnp.pad(jnp.asarray(alpha, p_pad.dtype), (0, size - num), constant_values=1.0)
        beta = jnp.pad(jnp.asarray(beta, p_pad.dtype), (0, size - num), constant_values=1.0)
    out = _core(p_pad, n, b, lo, hi, np.asarray(threshold, p_pad.dtype), alpha, beta,
                rule=rule, rounding=rounding, shift=shift,
                unseen="fallback" if unseen == "fallback" else "fill",
                padded=size > num, maybe_nan=maybe_nan)
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
    p_pad, num, (n, b, lo, hi), _ = _prepare(p, budget, n_min, n_max, shift, allow_nan=False)
    tau, kstar, cont = _waterline_core(p_pad, n, b, lo, hi, shift)
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
    if not _is_traced(n_min) and n_min < 2:
        raise ValueError(f"inverse_p needs n_min >= 2 (its formula is 1 + ...), got n_min={n_min}")
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


#: Options each registered allocator takes besides the shared
#: ``(p, budget, *, n_min, n_max, shift, unseen)``.
ALLOCATOR_OPTIONS: dict[str, tuple[str, ...]] = {
    "sera": ("mode", "rounding", "threshold"),
    "uniform": (),
    "inverse_p": (),
    "knapsack": (),
    "hit_utility": ("alpha", "beta", "pseudo_count"),
}


def check_options(name: str, options: Any) -> None:
    """Raise ValueError unless ``name`` is a registered allocator that uses every option.

    An option an allocator does not use is an error, never dropped: a user who asks for
    ``mode="equalized"`` from ``uniform`` must learn that it has no effect.
    """
    if name not in ALLOCATOR_OPTIONS:
        raise ValueError(f"unknown allocator {name!r}; valid names: {sorted(ALLOCATOR_OPTIONS)}")
    unused = sorted(set(options) - set(ALLOCATOR_OPTIONS[name]))
    if unused:
        takes = ", ".join(ALLOCATOR_OPTIONS[name]) or "none"
        raise ValueError(f"allocator {name!r} does not use option(s) {unused} (its options: "
                         f"{takes}); remove them or choose an allocator that uses them")
    choices = {"mode": _MODES, "rounding": _ROUNDINGS}
    for key, allowed in choices.items():
        if key in options and options[key] not in allowed:
            raise ValueError(f"allocator {name!r}: {key}={options[key]!r}; allowed: {allowed}")
    if "threshold" in options and options.get("mode", "dynamic") != "dynamic":
        raise ValueError(f"allocator {name!r}: threshold is used only by mode='dynamic', not "
                         f"mode={options['mode']!r}; remove it")
    if "threshold" in options:
        t = options["threshold"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= float(t) <= 1.0:
            raise ValueError(f"allocator {name!r}: threshold={t!r}; allowed: a number in [0, 1]")


def _registered(name: str, fn: Callable[..., Allocation]) -> Callable[..., Allocation]:
    """``fn`` behind the one allocator signature, refusing options it does not use."""

    @functools.wraps(fn)
    def allocator(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
                  unseen: str = "fill", **options: Any) -> Allocation:
        check_options(name, options)
        return fn(p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen, **options)

    return allocator


#: Every allocator as ``f(p, budget, *, n_min, n_max, shift=1, unseen="fill", **options)``;
#: the options each takes are ``ALLOCATOR_OPTIONS[name]``. Compared *methods* (an allocator
#: with options, multiplicity and estimator) are in ``sera_jax.methods``.
ALLOCATORS: dict[str, Callable[..., Allocation]] = {
    "sera": _registered("sera", allocate),
    "uniform": _registered("uniform", uniform),
    "inverse_p": _registered("inverse_p", inverse_p),
    "knapsack": _registered("knapsack", knapsack),
    "hit_utility": _registered("hit_utility", hit_utility),
}


def get_allocator(name: str) -> Callable[..., Allocation]:
    """The allocator registered as ``name`` (the one signature of ``ALLOCATORS``)."""
    try:
        return ALLOCATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown allocator {name!r}; valid names: {sorted(ALLOCATORS)}") from None
