"""Allocation rules beyond the paper [ours]: posterior-aware equalisation and the in-step
two-stage (pilot, then waterline) allocation. Same contract as every allocator: integer
counts summing to the budget exactly, each in ``[n_min, n_max]`` (no inactive prompts), the
multiplicity weights ``w_q = N0/N_q``, an :class:`Allocation` with its diagnostics. Both are
registered in ``ALLOCATORS`` (``"posterior"``, ``"sequential"``) and as the methods
``sera_posterior`` / ``sera_sequential`` of ``sera_jax.methods``.

**Posterior-aware equalisation** (``posterior``). SERA equalises ``κ(p̂_q, N_q)`` at the
posterior *mean*. With a Beta posterior ``p_q ~ Beta(α_q, β_q)`` the expected scale factor is

    h_q(N) = E[κ(p_q, N)] = 1 − E[(1 − p_q)^(N−s)] = 1 − B(α_q, β_q + N − s) / B(α_q, β_q),

which is increasing and concave in N, and below κ at the posterior mean (κ is concave in p),
the more so the more uncertain the prompt: Beta(½, ½) has E[(1−p)^m] ≈ 1/√(πm), so an
unseen prompt looks like a hard one and gets rollouts accordingly. The rule is the
leximin allocation of ``h_q``: hand out the ``B − P·n_min`` units (q, N → N+1) in increasing
order of the current level ``h_q(N)`` (the greedy on levels of ``_greedy_units``, exact; the
key is ``−log E[(1−p)^(N−s)]``, monotone in h). Unseen prompts (NaN) are treated by their
uncertainty -- the prior Beta(½, ½) -- not by a fallback. As α + β → ∞ at a fixed mean,
h → κ(mean, N) and the rule becomes SERA equalized (tested).

**In-step two-stage allocation** (``sequential``). Spend a pilot of m rollouts on every
prompt of the batch first (default m = n_min), update the Beta posterior with the pilot's
K¹_q successes, ``(α, β) → (α + K¹, β + m − K¹)``, then allocate the whole budget with
lower bound ``max(n_min, m)`` -- i.e. the remaining ``B − P·m`` rollouts -- by SERA's
waterline (equalized, leximin) on the updated mean (``second_stage="waterline"``) or by the
posterior rule on the updated posterior (``second_stage="posterior"``). It needs the pilot's
outcomes, so it is called as ``sequential(p, B, ..., pilot_successes=K1)`` after the pilot
has been drawn (the allocation lab does this; a plain call raises). No epoch lag and no cold
start: an unseen prompt is allocated from its pilot.

*What the estimator estimates under data-dependent counts.* Take the centred MaxRL
estimator on all N_q rollouts of prompt q (pilot included), ``g_q = (1/N_q) Σ_i A_i S_i``,
``A_i = (r_i − r̄)/r̄`` (ε ignored), ``S_i = ∇ log π(z_i)``, with the multiplicity weight
``N0/N_q`` and the sequence-mean loss, so the batch gradient is ``(1/P) Σ_q g_q``. The counts
depend on the pilot's *rewards* only, never on the sampled answers. Given every reward of
the batch, the answers are independent with ``E[S_i | r_i] = (r_i − p)/(1 − p) ∇ log p``
(a success is drawn from π restricted to the correct answers, a failure from the rest), and
``Σ_i A_i = 0``; hence

    E[g_q | rewards] = c_q ∇ log p_q,   c_q = 1{K_q ≥ 1} (1 − K_q/N_q) / (1 − p_q),

whatever rule chose N_q. So the direction of every prompt's term is exactly ∇ log p_q (the
multiplicity weights keep each prompt at 1/P however many rollouts it drew); only its scale
changes. Given the pilot (k successes of m) and the final N, the second stage adds N − m
fresh draws, and

    E[c | pilot] = (N − m)/N + (m − k)/(N (1 − p)) − 1{k = 0} (1 − p)^(N − m − 1)

(`conditional_scale`), so ``E[batch gradient] = (1/P) Σ_q κ̄_q ∇ log p_q`` with
``κ̄_q = E_pilot[E[c_q | pilot]]``. For a count fixed in advance this is the familiar
``κ(p, N) = 1 − (1 − p)^(N−1)``; for the two-stage counts it is not (a pilot with k < m·p
even gives a conditional scale above 1). The Monte Carlo test in
``tests/test_allocation_beyond.py`` checks ``E[g]`` against this formula.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from sera_jax.allocation._engine import (
    _UNSEEN,
    Allocation,
    _flush_subnormals,
    _is_traced,
    _prepare,
    _run,
    _trim,
    diagnostics,
)
from sera_jax.allocation._peers import _greedy_units
from sera_jax.allocation.api import register

__all__ = ["TWO_STAGE", "conditional_scale", "expected_kappa", "pilot_size", "posterior",
           "sequential"]

#: Jeffreys prior of an unseen prompt (the history's α = β = ½).
PRIOR = 0.5
#: Allocators that need a pilot drawn before they are called (see `pilot_size`); each takes
#: ``pilot_successes`` and the option ``pilot`` (default n_min). ``pilot_commit``: the
#: Pilot-Commit peer (`sera_jax.allocation.peers_2026`).
TWO_STAGE = ("sequential", "pilot_commit")
_SECOND_STAGES = ("waterline", "posterior")


def expected_kappa(alpha: ArrayLike, beta: ArrayLike, n: ArrayLike, shift: int = 1) -> Array:
    """``E[κ(p, N)]`` for ``p ~ Beta(α, β)``: ``1 − B(α, β + N − s)/B(α, β)`` (0 for N ≤ s)."""
    alpha, beta = jnp.asarray(alpha), jnp.asarray(beta)
    m = jnp.maximum(jnp.asarray(n) - shift, 0).astype(alpha.dtype)
    return -jnp.expm1(_log_moment(alpha, beta, m))


def _log_moment(alpha: Array, beta: Array, m: Array) -> Array:
    """``log E[(1 − p)^m] = lgamma(β+m) − lgamma(α+β+m) + lgamma(α+β) − lgamma(β)``."""
    return (lax.lgamma(beta + m) - lax.lgamma(alpha + beta + m)
            + lax.lgamma(alpha + beta) - lax.lgamma(beta))


def conditional_scale(p: ArrayLike, k: ArrayLike, m: ArrayLike, n: ArrayLike) -> Array:
    """``E[c | pilot]`` of the two-stage scheme (module docstring): a pilot of m rollouts
    with k successes, N rollouts in all, centred MaxRL on all N:
    ``(N − m)/N + (m − k)/(N (1 − p)) − 1{k = 0} (1 − p)^(N − m − 1)``.
    With m = 0 (no pilot) it is κ(p, N) = 1 − (1 − p)^(N − 1)."""
    p = jnp.asarray(p)
    k, m, n = (jnp.asarray(x).astype(p.dtype) for x in (k, m, n))
    base = (n - m) / n + (m - k) / (n * (1 - p))
    none = jnp.exp((n - m - 1) * jnp.log1p(-p))  # (1 − p)^(N − m − 1)
    return jnp.where(k == 0, base - none, base)


def pilot_size(allocator: str, options: Mapping[str, Any], n_min: int) -> int:
    """Pilot rollouts per prompt that `allocator` needs drawn first (0: a one-shot rule)."""
    if allocator not in TWO_STAGE:
        return 0
    return int(options.get("pilot", n_min) or n_min)


def _prior(p: Array, alpha, beta, pseudo_count: float) -> tuple[Array, Array]:
    """(α, β) per prompt: the given posterior, or ``½ + c·p̂``, ``½ + c·(1 − p̂)`` for seen
    prompts and the prior ``(½, ½)`` for unseen ones (NaN)."""
    if alpha is not None:
        return jnp.asarray(alpha, p.dtype), jnp.asarray(beta, p.dtype)
    seen = ~jnp.isnan(p)
    ph = jnp.where(seen, p, 0.0)
    return (jnp.where(seen, PRIOR + pseudo_count * ph, PRIOR),
            jnp.where(seen, PRIOR + pseudo_count * (1.0 - ph), PRIOR))


def _check_beta(name: str, x: Any, shape) -> None:
    if _is_traced(x):
        if jnp.shape(x) != shape:
            raise ValueError(f"{name} must have the shape of p {shape}, got {jnp.shape(x)}")
        return
    x = np.asarray(x, np.float64)
    if x.shape != shape:
        raise ValueError(f"{name} must have the shape of p {shape}, got {x.shape}")
    if not np.all(np.isfinite(x) & (x > 0)):
        raise ValueError(f"{name} must be finite and > 0 (Beta posterior parameters)")


def _check_pilot(p, budget, pilot, pilot_successes, n_min, n_max) -> tuple[int, Array]:
    """A two-stage allocator's pilot: `pilot` (default n_min) a Python int in [1, n_max],
    affordable (max(n_min, pilot)·P <= budget), and `pilot_successes` integers in [0, pilot]
    of p's shape (checked on the host when concrete). Returns (pilot, successes)."""
    m = n_min if pilot is None else pilot
    if _is_traced(m) or isinstance(m, bool) or not isinstance(m, int | np.integer):
        raise ValueError(f"pilot must be a Python int (rollouts per prompt), got {m!r}")
    m = int(m)
    if not 1 <= m <= n_max:
        raise ValueError(f"pilot must be in [1, n_max={n_max}], got {m}")
    lo = max(int(n_min), m)
    num = int(np.shape(p)[0]) if np.ndim(p) == 1 else None
    if num is not None and not _is_traced(budget) and lo * num > int(budget):
        raise ValueError(f"pilot={m} per prompt (lower bound {lo}) needs {lo * num} rollouts "
                         f"but budget={budget} for P={num}")
    k1 = jnp.asarray(pilot_successes)
    if k1.shape != jnp.shape(p):
        raise ValueError(f"pilot_successes must have the shape of p {jnp.shape(p)}, "
                         f"got {k1.shape}")
    if not _is_traced(k1):
        host = np.asarray(k1, np.float64)
        if not np.all((host >= 0) & (host <= m) & (host == np.round(host))):
            raise ValueError(f"pilot_successes must be integers in [0, pilot={m}]")
    return m, k1


def _check_common(p, unseen, alpha, beta, pseudo_count):
    if unseen not in _UNSEEN:
        raise ValueError(f"unseen must be one of {_UNSEEN}, got {unseen!r}")
    if (alpha is None) != (beta is None):
        raise ValueError("alpha and beta must be given together (Beta posterior parameters)")
    if alpha is not None:
        _check_beta("alpha", alpha, jnp.shape(p))
        _check_beta("beta", beta, jnp.shape(p))
    if isinstance(pseudo_count, bool) or not (isinstance(pseudo_count, int | float)
                                              and pseudo_count > 0):
        raise ValueError(f"pseudo_count must be a number > 0, got {pseudo_count!r}")
    if unseen == "error" and not _is_traced(p):
        host = np.asarray(p, np.float64)
        if np.isnan(host).any():
            raise ValueError(f"p contains NaN (unseen prompts) at indices "
                             f"{np.flatnonzero(np.isnan(host))[:8].tolist()} and unseen='error'")


def _as_probs(p: ArrayLike) -> Array:
    """p as the canonical float dtype (validation of the values happens in `_prepare`)."""
    return jnp.asarray(p, jnp.result_type(float))


@functools.partial(jax.jit, static_argnames=("shift",))
def _posterior_core(p, alpha, beta, num, budget, n_min, n_max, *, shift):
    p = _flush_subnormals(p)
    valid = jnp.arange(p.shape[0]) < num
    known = valid & ~jnp.isnan(p)
    al = jnp.where(valid, alpha, 1.0)
    be = jnp.where(valid, beta, 1.0)
    # Unit (q, N -> N+1) has key −log E[(1−p)^(N−s)], increasing in the level h_q(N).
    key = lambda n: -_log_moment(al, be, jnp.maximum(n - shift, 0).astype(al.dtype))
    counts = _greedy_units(key, valid, budget, n_min, n_max).astype(jnp.int32)
    return _diagnostics(p, valid, known, counts, budget, num, n_min, n_max, shift)


def _diagnostics(p, act, known, counts, budget, num, n_min, n_max, shift) -> Allocation:
    """The `Allocation` of counts where every valid prompt is active (`_engine.diagnostics`;
    τ and κ* are NaN: no waterline)."""
    return diagnostics(p, act, known, counts, budget, num, n_min, n_max, shift, None)


@register("posterior")
def posterior(
    p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1, unseen: str = "fill",
    alpha: ArrayLike | None = None, beta: ArrayLike | None = None, pseudo_count: float = 4.0,
) -> Allocation:
    """Posterior-aware equalisation: leximin over q of ``E[κ(p_q, N_q)]``, p_q ~ Beta(α_q, β_q).

    ``E[κ] = 1 − B(α, β + N − s)/B(α, β)`` (`expected_kappa`). ``alpha``/``beta``: the Beta
    posterior per prompt (e.g. the history's ``α + S``, ``β + F``); without them
    ``α = ½ + c·p̂``, ``β = ½ + c·(1 − p̂)``, c = ``pseudo_count``, and unseen prompts (NaN)
    get the prior Beta(½, ½) (``unseen="error"`` refuses NaN instead; ``"fill"`` and
    ``"fallback"`` both use the prior -- there is nothing to fall back from). Every prompt is
    active; counts in ``[n_min, n_max]`` sum to ``budget``; ``weights = N0/N_q``; ``kappa_*``
    diagnostics use κ at ``p`` (NaN prompts excluded).
    """
    _check_common(p, unseen, alpha, beta, pseudo_count)
    pa = _as_probs(p)
    a, b = _prior(pa, alpha, beta, float(pseudo_count))
    p_pad, num, (n, bud, lo, hi), _ = _prepare(pa, budget, n_min, n_max, shift, allow_nan=True)
    size = p_pad.shape[0]
    pad = lambda x: jnp.pad(jnp.asarray(x, p_pad.dtype), (0, size - num), constant_values=1.0)
    return _trim(_posterior_core(p_pad, pad(a), pad(b), n, bud, lo, hi, shift=shift), num)


@register("sequential")
def sequential(
    p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1, unseen: str = "fill",
    pilot_successes: ArrayLike | None = None, pilot: int | None = None,
    alpha: ArrayLike | None = None, beta: ArrayLike | None = None, pseudo_count: float = 4.0,
    rounding: str = "leximin", second_stage: str = "waterline",
) -> Allocation:
    """In-step two-stage allocation: the final counts after a pilot of ``pilot`` rollouts
    (default n_min) per prompt with ``pilot_successes`` K¹ (int[P] in [0, pilot]).

    Posterior ``(α + K¹, β + pilot − K¹)`` (α, β as in `posterior`: given, or from p̂ with
    ``pseudo_count``, the prior for unseen prompts), then all of ``budget`` with lower bound
    ``max(n_min, pilot)``: SERA equalized with ``rounding`` on the updated mean
    (``second_stage="waterline"``) or `posterior` on the updated posterior. Counts are
    >= pilot, so the pilot rollouts are part of them. E[g] under these data-dependent counts:
    see the module docstring (`conditional_scale`).
    """
    if pilot_successes is None:
        raise ValueError(
            "sequential is a two-stage allocator: draw `pilot` rollouts (default n_min) of "
            "every prompt first and pass their successes as pilot_successes=... (see "
            "sera_jax.studies.lab.train for the protocol)")
    if second_stage not in _SECOND_STAGES:
        raise ValueError(f"second_stage must be one of {_SECOND_STAGES}, got {second_stage!r}")
    if rounding not in ("leximin", "paper"):
        raise ValueError(f"rounding must be 'leximin' or 'paper', got {rounding!r}")
    m, k1 = _check_pilot(p, budget, pilot, pilot_successes, n_min, n_max)
    lo = max(int(n_min), m)  # every prompt keeps its pilot
    _check_common(p, unseen, alpha, beta, pseudo_count)
    pa = _as_probs(p)
    a, b = _prior(pa, alpha, beta, float(pseudo_count))
    k1 = k1.astype(pa.dtype)
    a2, b2 = a + k1, b + (m - k1)
    p2 = a2 / (a2 + b2)
    if second_stage == "posterior":
        return posterior(p2, budget, n_min=lo, n_max=n_max, shift=shift, alpha=a2, beta=b2)
    return _run("equalized", p2, budget, n_min=lo, n_max=n_max, shift=shift, unseen="error",
                rounding=rounding)
