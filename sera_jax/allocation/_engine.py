"""The jitted core shared by every allocator, and the validation in front of it (layer 3 of
``sera_jax.allocation``).

``_prepare`` validates on concrete (host) values before jit, converts to the canonical float
dtype and pads to a power-of-two bucket; ``_core`` (one ``jax.jit`` per static
configuration) applies a rule to the seen prompts, spreads the unseen ones and computes the
diagnostics of the :class:`Allocation` it returns.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import Array, lax

from sera_jax.allocation._peers import _greedy_units, _hit_key, _knapsack_key, _vip_key
from sera_jax.allocation._select import _INT32_MAX, _reduce, _spread, _sum
from sera_jax.allocation._waterline import (
    _A_MAX,
    _A_MIN,
    _continuous_counts,
    _dynamic,
    _equalize,
    _rates,
    _round,
    _waterline_log,
)
from sera_jax.scaling import kappa

_UNSEEN = ("fill", "fallback", "error")


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
    state: a stateful allocator's state after this call (a pytree of arrays: feed it to the
      next call; `api.initial_state`), None for every other allocator (no leaves: the
      pytree of a stateless allocation is unchanged).
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
    state: Any = None


def _seen_rule(rule, rounding, p, seen, budget, n_min, n_max, shift, threshold, alpha, beta,
               aux=None):
    """Counts for the seen prompts (those with a finite p) sharing ``budget``. ``aux``: the
    per-prompt inputs of a rule that computes them outside the core (``gdro``: its
    proposal and need, `peers_2026.gdro`)."""
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
    if rule == "vip":  # VIP: the exact integer minimiser of Σ p(1-p)/(N - s) (peers_2026)
        return _greedy_units(_vip_key(p0, shift), seen, budget, n_min, n_max), seen, nan
    if rule == "gdro":  # Rollout-GDRO: the controller's proposal made exact (peers_2026)
        proposal, need = aux
        counts = _round(jnp.where(seen, proposal, 0.0), seen, budget, n_min, n_max,
                        lambda n: -need, lambda n: need)  # add to high need, take from low
        return counts, seen, nan
    raise ValueError(f"unknown rule {rule!r}")


def _flush_subnormals(p: Array) -> Array:
    """XLA flushes subnormals to zero on CPU but not everywhere: make it explicit."""
    return jnp.where(jnp.abs(p) < jnp.finfo(p.dtype).tiny, jnp.zeros((), p.dtype), p)


@functools.partial(jax.jit, static_argnames=("rule", "rounding", "shift", "unseen", "padded",
                                             "maybe_nan"))
def _core(p, num, budget, n_min, n_max, threshold, alpha, beta, aux=None, *, rule, rounding,
          shift, unseen, padded=True, maybe_nan=True):
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
                              alpha, beta, aux)
        # Unseen prompts take their share U·B/P (rounded) split as evenly as possible, so
        # the seen ones keep S·q + (r - extra) in [S·n_min, S·n_max].
        n_seen = n_valid - n_hidden
        frac = n_hidden.astype(p.dtype) * r.astype(p.dtype) / n_valid.astype(p.dtype)
        extra = jnp.clip(jnp.round(frac).astype(jnp.int32), jnp.maximum(0, r - n_seen),
                         jnp.minimum(n_hidden, r))
        b_hidden = n_hidden * q + extra
        counts, act, t = _seen_rule(rule, rounding, *args, budget - b_hidden, n_min, n_max,
                                    shift, threshold, alpha, beta, aux)
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

    return diagnostics(p, act, known, counts, budget, n_valid, n_min, n_max, shift, jnp.exp(t))


def diagnostics(p: Array, act: Array, known: Array, counts: Array, budget: Array, num: Array,
                n_min: Array, n_max: Array, shift: int, tau: Array | None) -> Allocation:
    """The `Allocation` of int32 `counts` (traced): weights N0/N_q on active prompts
    (N0 = budget / num valid prompts), κ min / mean over active prompts with a known p,
    fractions at the bounds, τ* and κ* = 1 − exp(−τ*) (NaN when `tau` is None: no
    waterline)."""
    n0 = jnp.asarray(budget, p.dtype) / jnp.asarray(num, p.dtype)
    weights = jnp.where(act, n0 / jnp.maximum(counts, 1).astype(p.dtype), 0.0)
    have = act & known
    kap = kappa(jnp.where(known, p, 0.0), counts, shift)
    i32 = lambda m: m.astype(jnp.int32)
    k_min, k_sum, nk, na, at_min, at_max = _reduce(
        (jnp.where(have, kap, jnp.inf), jnp.where(have, kap, 0.0), i32(have), i32(act),
         i32(act & (counts == n_min)), i32(act & (counts == n_max))), "<+++++")
    nan = jnp.asarray(jnp.nan, p.dtype)
    tau = nan if tau is None else tau
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
# Validation (on concrete values, before jit) and the call of the core.
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
         alpha=None, beta=None, aux=None):
    if unseen not in _UNSEEN:
        raise ValueError(f"unseen must be one of {_UNSEEN}, got {unseen!r}")
    p_pad, num, (n, b, lo, hi), maybe_nan = _prepare(
        p, budget, n_min, n_max, shift, allow_nan=unseen != "error", threshold=threshold)
    size = p_pad.shape[0]
    if alpha is not None:
        alpha = jnp.pad(jnp.asarray(alpha, p_pad.dtype), (0, size - num), constant_values=1.0)
        beta = jnp.pad(jnp.asarray(beta, p_pad.dtype), (0, size - num), constant_values=1.0)
    if aux is not None:
        aux = tuple(jnp.pad(jnp.asarray(x, p_pad.dtype), (0, size - num)) for x in aux)
    out = _core(p_pad, n, b, lo, hi, np.asarray(threshold, p_pad.dtype), alpha, beta, aux,
                rule=rule, rounding=rounding, shift=shift,
                unseen="fallback" if unseen == "fallback" else "fill",
                padded=size > num, maybe_nan=maybe_nan)
    return _trim(out, num)
