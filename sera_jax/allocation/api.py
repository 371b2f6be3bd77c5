"""The public allocators (layer 4 of ``sera_jax.allocation``): ``waterline``, ``allocate``
(SERA), the peers ``uniform``, ``inverse_p``, ``knapsack``, ``hit_utility`` and the one
registry. Import them from ``sera_jax.allocation``.

Adding an allocator is one decorated function (plus a line in ``sera_jax.methods.METHODS``
to compare it as a method)::

    @register("my_rule")
    def my_rule(p, budget, *, n_min, n_max, shift=1, unseen="fill", temperature=1.0):
        ...  # -> Allocation

Its options are the keyword parameters beyond the shared ``(p, budget, *, n_min, n_max,
shift, unseen)`` -- here ``temperature`` -- read from the signature, so they are declared
once; ``ALLOCATORS`` and ``ALLOCATOR_OPTIONS`` are filled by ``register`` only.

**Allocator state** (the one mechanism for a rule that learns across steps, e.g. a
controller). ``register(name, init_state=f)`` declares ``f(**options) -> pytree`` (arrays of
static shapes); the allocator then takes the per-call input ``state`` (None: ``f``'s, a
fresh start) and returns its next state in ``Allocation.state``. The caller carries it
from one call to the next (the allocation lab in its scan carry: `studies.lab.train`); a
caller that cannot carry it must refuse the method (`methods.Method.stateful`). Every other
allocator has ``Allocation.state`` None, so its pytree and numbers are unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from sera_jax.allocation._engine import (
    Allocation,
    _is_traced,
    _prepare,
    _run,
    _waterline_core,
    diagnostics,
)

__all__ = [
    "ALLOCATORS",
    "ALLOCATOR_OPTIONS",
    "ALLOCATOR_STATE",
    "Allocation",
    "allocate",
    "allocation_from_counts",
    "check_options",
    "get_allocator",
    "hit_utility",
    "initial_state",
    "inverse_p",
    "knapsack",
    "register",
    "uniform",
    "waterline",
]

_MODES = ("dynamic", "equalized")
_ROUNDINGS = ("leximin", "paper")
#: SERA's former mode="uniform" is the uniform allocator.
_UNIFORM_HINT = {"uniform": " (B/P each is the 'uniform' allocator: method 'uniform')"}


#: Every allocator as ``f(p, budget, *, n_min, n_max, shift=1, unseen="fill", **options)``,
#: refusing options it does not use; filled by ``register`` only. Compared *methods* (an
#: allocator with options, multiplicity and estimator) are in ``sera_jax.methods``.
ALLOCATORS: dict[str, Callable[..., Allocation]] = {}
#: The options each registered allocator takes besides the shared ones (from its signature;
#: filled by ``register`` with ``ALLOCATORS``).
ALLOCATOR_OPTIONS: dict[str, tuple[str, ...]] = {}
#: Stateful allocators: name -> ``init_state(**options)``, the state of a fresh start
#: (module docstring, "Allocator state"); filled by ``register`` only.
ALLOCATOR_STATE: dict[str, Callable[..., Any]] = {}
#: The parameters every allocator takes.
SHARED_PARAMETERS = ("p", "budget", "n_min", "n_max", "shift", "unseen")


def register(name: str, *, init_state: Callable[..., Any] | None = None
             ) -> Callable[[Callable[..., Allocation]], Callable[..., Allocation]]:
    """Decorator: register ``fn`` as allocator ``name`` in ``ALLOCATORS`` (behind the one
    signature, refusing unused options: ``check_options``) with its options, the keyword
    parameters of ``fn`` beyond ``SHARED_PARAMETERS``, in ``ALLOCATOR_OPTIONS``. Returns
    ``fn`` unchanged. ``init_state``: a stateful allocator's fresh state from its options
    (``ALLOCATOR_STATE``; ``fn`` must then take ``state``). Raises TypeError when ``fn``
    lacks a shared parameter (or ``state``) and ValueError when ``name`` is taken."""

    def decorate(fn: Callable[..., Allocation]) -> Callable[..., Allocation]:
        params = inspect.signature(fn).parameters
        missing = [k for k in SHARED_PARAMETERS if k not in params]
        if missing:
            raise TypeError(f"allocator {name!r} ({fn.__qualname__}) lacks the shared "
                            f"parameter(s) {missing}; every allocator takes "
                            f"(p, budget, *, n_min, n_max, shift=1, unseen='fill', ...)")
        if init_state is not None and "state" not in params:
            raise TypeError(f"allocator {name!r} has an init_state but no 'state' parameter")
        if name in ALLOCATORS:
            raise ValueError(f"allocator {name!r} is already registered; choose another name")
        if init_state is not None:
            ALLOCATOR_STATE[name] = init_state
        ALLOCATOR_OPTIONS[name] = tuple(
            k for k, v in params.items()
            if k not in SHARED_PARAMETERS and v.kind is inspect.Parameter.KEYWORD_ONLY)
        ALLOCATORS[name] = _registered(name, fn)
        return fn

    return decorate


def _registered(name: str, fn: Callable[..., Allocation]) -> Callable[..., Allocation]:
    """``fn`` behind the one allocator signature, refusing options it does not use."""

    @functools.wraps(fn)
    def allocator(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
                  unseen: str = "fill", **options: Any) -> Allocation:
        check_options(name, options)
        return fn(p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen, **options)

    return allocator


def allocation_from_counts(p: ArrayLike, counts: ArrayLike, budget: int, *, n_min: int,
                           n_max: int, shift: int = 1) -> Allocation:
    """The ``Allocation`` of integer ``counts`` [P] (summing to ``budget``) chosen by a new
    rule: weights ``N0/N_q`` on active prompts (``N0 = B/P``), κ diagnostics over the active
    prompts with a known p (NaN = unseen), no waterline (τ* NaN). Traceable."""
    p = jnp.asarray(p, jnp.result_type(float))
    counts = jnp.asarray(counts, jnp.int32)
    return diagnostics(p, counts > 0, ~jnp.isnan(p), counts, jnp.asarray(budget, jnp.int32),
                       jnp.asarray(p.shape[0], jnp.int32), jnp.asarray(n_min, jnp.int32),
                       jnp.asarray(n_max, jnp.int32), shift, None)


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


@register("sera")
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
        ``"equalized"``: every prompt active. (Plain MaxRL's ``B/P`` each is the
        ``uniform`` allocator.)
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
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}{_UNIFORM_HINT.get(mode, '')}")
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {rounding!r}")
    return _run(mode, p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen,
                rounding=rounding, threshold=threshold)


@register("uniform")
def uniform(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
            unseen: str = "fill") -> Allocation:
    """Plain MaxRL: ``floor(B/P)`` rollouts each, one more for the first ``B mod P`` prompts."""
    return _run("uniform", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


@register("inverse_p")
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


@register("knapsack")
def knapsack(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
             unseen: str = "fill") -> Allocation:
    """Knapsack-RL: maximise ``Σ_q V(N_q, p_q)``, ``V = [1 - p^N - (1-p)^N] p (1-p)^2``.

    ``V`` is concave in N (its increments ``p(1-p)^2 [p^N(1-p) + (1-p)^N p]`` decrease), so
    the greedy on marginal gains returns the optimum of the published dynamic programme
    (checked against the DP in the tests) in O(P · 32 · log2(n_max - n_min)) instead of
    O(P · B · n_max). Prompts with p in {0, 1} have V = 0 and get the leftovers evenly.
    """
    return _run("knapsack", p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)


@register("hit_utility")
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
            hint = _UNIFORM_HINT.get(options[key], "") if key == "mode" else ""
            raise ValueError(f"allocator {name!r}: {key}={options[key]!r}; allowed: "
                             f"{allowed}{hint}")
    if "threshold" in options and options.get("mode", "dynamic") != "dynamic":
        raise ValueError(f"allocator {name!r}: threshold is used only by mode='dynamic', not "
                         f"mode={options['mode']!r}; remove it")
    if "threshold" in options:
        t = options["threshold"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= float(t) <= 1.0:
            raise ValueError(f"allocator {name!r}: threshold={t!r}; allowed: a number in [0, 1]")


def initial_state(name: str, options: Any = None) -> Any:
    """The fresh state of stateful allocator ``name`` with ``options`` (its
    ``init_state``), None for a stateless one."""
    init = ALLOCATOR_STATE.get(name)
    return None if init is None else init(**dict(options or {}))


def get_allocator(name: str) -> Callable[..., Allocation]:
    """The allocator registered as ``name`` (the one signature of ``ALLOCATORS``)."""
    try:
        return ALLOCATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown allocator {name!r}; valid names: {sorted(ALLOCATORS)}") from None
