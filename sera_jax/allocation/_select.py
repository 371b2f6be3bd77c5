"""Selection without sorting (layer 1 of ``sera_jax.allocation``).

Threshold searches on the bit patterns of the keys, one-pass variadic reduces and selection
by index through a 32-ary tree of partial sums: the primitives every allocator is built
from. Nothing here knows about probabilities or κ.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array, lax

_INT32_MAX = int(np.iinfo(np.int32).max)


# ---------------------------------------------------------------------------------------
# Integer arithmetic that cannot wrap. Counts are int32 (float32 cannot hold budgets above
# 2**24 exactly, int64 needs x64), and a sum over P prompts of up to n_max - n_min units
# each reaches P·n_max, past 2**31 for large batches. Every such quantity is either
# saturated at _INT32_MAX (it is then only compared with a target <= the budget, which
# saturation preserves) or rewritten so that no intermediate can wrap; where nothing
# wraps the value is the same as the plain expression's.
# ---------------------------------------------------------------------------------------


def _sat_mul(a: Array, b: Array) -> Array:
    """``min(a·b, _INT32_MAX)`` for nonnegative int32 ``a``, ``b``."""
    return jnp.where(a <= _INT32_MAX // jnp.maximum(b, 1), a * b, _INT32_MAX)


def _sat_sub(x, y) -> Array:
    """``x - y`` for signed ints, clamped to the dtype's range instead of wrapping."""
    x = jnp.asarray(x, y.dtype if isinstance(x, int) else None)
    y = jnp.asarray(y, x.dtype if isinstance(y, int) else None)
    d = x - y
    info = jnp.iinfo(d.dtype)
    wrapped = (x >= y) != (d >= 0)  # the wrapped difference has the wrong sign
    return jnp.where(wrapped, jnp.where(x >= y, info.max, info.min), d).astype(d.dtype)


def _to_count(x: Array) -> Array:
    """A nonnegative float count as int32, capped at the largest float of its dtype that
    int32 holds: float32 rounds ``n_max = 2**31 - 1`` up to 2**31, out of range."""
    cap = np.asarray(_INT32_MAX, x.dtype)
    if float(cap) > _INT32_MAX:
        cap = np.nextafter(cap, np.zeros((), x.dtype))
    return jnp.minimum(x, cap).astype(jnp.int32)


# ---------------------------------------------------------------------------------------
# Variadic reduces and threshold searches.
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
    """Reduce every operand over axis 0 in ONE pass; ``kinds[i]`` is ``+``, ``<`` (min),
    ``>`` (max) or ``s``: the sum of nonnegative int32 values saturated at ``_INT32_MAX``
    (summed in uint32, where two saturated partial sums cannot wrap).

    One variadic reduce reads the fused producers once. On XLA:CPU this is much cheaper
    per pass than ``jnp.sum``/``min``/``max``: each of those is its own loop, integer sums
    become a tree of reduce-windows and float ones an external (YNN) kernel with a jittery
    thread hand-off. Float min/max go through :func:`_ordered_uint` (the NaN-propagating
    float min/max is not vectorised there: 50x slower).
    """
    cap = np.uint32(_INT32_MAX)  # a NumPy constant: the reducer must not close over tracers
    fns = {"+": lax.add, "<": lax.min, ">": lax.max, "s": lambda a, b: lax.min(a + b, cap)}
    dtypes = [x.dtype for x in ops]
    floats = [k not in "+s" and jnp.issubdtype(d, jnp.floating) for d, k in zip(dtypes, kinds)]
    ops = [_ordered_uint(x) if f else x.astype(jnp.uint32) if k == "s" else x
           for x, f, k in zip(ops, floats, kinds, strict=True)]

    def identity(dtype, kind):
        if kind in "+s":
            return jnp.zeros((), dtype)
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.max if kind == "<" else info.min, dtype)

    inits = tuple(identity(x.dtype, k) for x, k in zip(ops, kinds, strict=True))
    out = lax.reduce(tuple(ops), inits,
                     lambda u, v: tuple(fns[k](a, b) for k, a, b in zip(kinds, u, v)), (0,))
    return tuple(_from_ordered_uint(y, d) if f else y.astype(jnp.int32) if k == "s" else y
                 for y, f, d, k in zip(out, floats, dtypes, kinds))


def _sum(x: Array) -> Array:
    """``Σ x`` over axis 0 in x's own dtype (``jnp.sum`` would widen int32 under x64)."""
    return _reduce((x,), "+")[0]


def _reduce_counts(make_ops, kinds: str, wide: Array) -> tuple[Array, ...]:
    """``_reduce(make_ops(), kinds)`` for per-prompt unit counts, each in ``[0, width]``.

    The ``s`` sums saturate only when ``wide`` (``P·width`` may pass 2**31); otherwise they
    are plain sums, which XLA:CPU vectorises (a reducer of two ops it does not: 3x slower
    per pass). ``make_ops`` is called inside each branch so that the producers fuse there.
    """
    plain = kinds.replace("s", "+")
    return lax.cond(wide, lambda: _reduce(make_ops(), kinds), lambda: _reduce(make_ops(), plain))


def _wide(width: Array, size: int) -> Array:
    """Whether ``size`` counts in ``[0, width]`` can sum past ``_INT32_MAX``."""
    return width > _INT32_MAX // size


def _any(x: Array) -> Array:
    return _reduce((x.astype(jnp.int32),), ">")[0] > 0


def _at_both(fn, x0: Array, x1: Array) -> tuple[Array, Array]:
    """``(fn(x0), fn(x1))`` for a scalar-valued ``fn`` through ONE traced copy of ``fn``
    (``lax.map``: a two-step loop). Why: every call site of a function is compiled
    separately, and the searches' ``total`` can be large (the dynamic rule's feasibility
    count holds four passes over the batch): two inlined copies made the rule's program
    half again as big to compile, for the same passes at run time."""
    ys = lax.map(fn, jnp.stack([x0, x1]))
    return ys[0], ys[1]


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
        t = (_sat_sub(target, ca).astype(jnp.float32)
             / jnp.where(flat, 1, _sat_sub(cb, ca)).astype(jnp.float32))
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
        # Progress is the residual of the end that moved, not the bracket width
        # (2x > y as x > y // 2: 2x can wrap).
        slow = jnp.where(ok, _sat_sub(cm, target) > _sat_sub(chi, target) // 2,
                         _sat_sub(target, cm) > _sat_sub(target, clo) // 2)
        return (lo2, hi2, jnp.where(ok, clo, cm), jnp.where(ok, cm, chi), slow & ~bisect,
                cm == target, lx, lc, mid, cm)

    clo, chi = _at_both(total, lo, hi) if ends is None else ends
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
    # Unit totals reach P·(n_max - n_min): saturated, exact up to K = B - Σ n_min < 2**31.
    wide = _wide(width, mask.shape[0])
    total = lambda u: _reduce_counts(lambda: (count_fn(as_f(u)),), "s", wide)[0]
    # Both bracket ends and the prompt count in one pass over the batch.
    c_lo, c_hi, num = _reduce_counts(
        lambda: (count_fn(as_f(lo)), count_fn(as_f(hi)), mask.astype(jnp.int32)), "ss+", wide)
    kk = budget - n_min * num
    all_units = _sat_mul(num, width)

    def solve():
        inf = jnp.asarray(jnp.inf, dtype)
        lo_ok, hi_ok = c_lo < kk, c_hi >= kk
        lo2 = jnp.where(lo_ok, lo, _ordered_uint(-inf))
        hi2 = jnp.where(hi_ok, hi, _ordered_uint(inf))
        hi3 = _search(total, kk, lo2, jnp.maximum(hi2, lo2 + 1), dtype,
                      ends=(jnp.where(lo_ok, c_lo, 0), jnp.where(hi_ok, c_hi, all_units)),
                      warp=warp)
        # Now total(< hi3) < K <= total(hi3): widen to the tolerance band around hi3.
        vh = as_f(hi3)
        tol = jnp.where(jnp.isfinite(vh), rel_tol * jnp.maximum(jnp.abs(vh), 1.0), 0.0)
        lo_q = count_fn(jnp.where(tol > 0, vh - tol, as_f(hi3 - 1)))
        hi_q = count_fn(vh + tol)
        s_lo, s_hi = _reduce_counts(lambda: (lo_q, hi_q), "ss", wide)
        # Usually the band holds exactly the units still needed: no tie to break.
        return lax.cond(s_hi == kk, lambda: hi_q, lambda: break_ties(lo_q, hi_q, kk - s_lo))

    def break_ties(lo_q, hi_q, need):
        # Tied units: level by level in N (fewest rollouts first), then by index. Unit j of
        # a prompt is in the band when lo_q <= j < hi_q; m is the smallest j whose band
        # units, with all band units below j, cover `need`. (A scatter-add histogram over
        # j was measured slower than this search on XLA:CPU.)
        band = mask & (hi_q > lo_q)
        m_lo, m_hi = _reduce((jnp.where(band, lo_q, width), jnp.where(band, hi_q - 1, 0)), "<>")
        upto_m = lambda m: _reduce_counts(
            lambda: (jnp.clip(jnp.minimum(hi_q, m + 1) - lo_q, 0),), "s", wide)[0]
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
        lambda: lax.cond(kk >= all_units, lambda: jnp.where(mask, width, 0), solve),
    )
    return jnp.where(mask, n_min + taken, 0)


def _spread(mask: Array, budget: Array) -> Array:
    """Uniform split of ``budget`` over ``mask``: ``B // m`` each, +1 for the first ``B % m``."""
    m = jnp.maximum(_sum(mask.astype(jnp.int32)), 1)
    q = budget // m
    extra = _first_by_index(mask, budget - q * m)
    return jnp.where(mask, q + extra.astype(jnp.int32), 0)
