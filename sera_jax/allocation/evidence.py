"""SERA with an evidence cap [ours]: a prompt that has piled up failure evidence without a
success leaves the active set, so the published recipe's floor (docs/active_set_floor.md)
no longer holds it there. Registered as allocator ``"sera_evidence"`` and as the method
``sera_evidence`` of ``sera_jax.methods``; ``sera`` is unchanged.

**Rule.** The trainer's history gives the frozen estimate ``p̂ = (α + S)/(α + β + S + F)``.
Its *failure evidence without success* is

    E(p̂) = α/p̂ − α − β,

which is exactly the discounted failures F of a prompt with S = 0, and for S > 0 is
``F − S(β + E)/α``-ish smaller (each recent success counts against it). A seen prompt with
``E(p̂) ≥ evidence_cap`` (equivalently ``p̂ ≤ α/(α + β + evidence_cap)``) gets 0 rollouts;
the rest is SERA's dynamic leximin allocation (threshold θ) on the other prompts. Unseen
prompts (NaN) are never capped.

**Why it escapes the floor.** A never-solved prompt at n_max rollouts per epoch settles at
``F* = n_max/(1 − γ)`` (256 at n_max 64, γ 0.75), so any cap below F* removes it. The preset
cap 64 (one n_max visit of failures at the maze default, F*/4) removes it after its first
full visit without success. A prompt with one success per epoch at n_max 64 has
``S* = 1/(1 − γ) = 4``, p̂ ≈ 4.5/257, E ≈ 28 < 64: it stays (and one solved 1 time in 40
at ~20-50 rollouts an epoch stays too: tests/test_allocation_evidence.py). Once capped, a
prompt draws no rollouts, so its S and F decay by γ per epoch and E falls below the cap
again: a capped prompt is re-probed (at n_max 64, γ 0.75: one epoch in three), so a prompt
that becomes learnable is found again; the floor's waste falls to about a third.

**What it is, honestly.** The allocator sees only p̂ (the trainer passes no S and F), so the
cap is a threshold on p̂, expressed in evidence units: at a fixed n_max it is the same as
ranking SERA's top-k with a floor ``p̂ > α/(α + β + cap)`` instead of ``u(p̂, n_max) ≥ θ``;
unlike raising θ it leaves the ``u(p̂, N_q) ≥ θ`` condition of the prompts it keeps alone.
``prior_alpha``/``prior_beta`` must equal the history's α, β (the maze study checks it).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.typing import ArrayLike

from sera_jax.allocation._engine import Allocation
from sera_jax.allocation.api import allocate as sera_allocate
from sera_jax.allocation.api import register


def evidence_without_success(p_hat: ArrayLike, prior_alpha: float = 0.5,
                             prior_beta: float = 0.5) -> jnp.ndarray:
    """``E(p̂) = α/p̂ − α − β`` (the module docstring): the discounted failures of a prompt
    without successes; NaN (unseen) stays NaN; traceable."""
    p = jnp.asarray(p_hat, jnp.result_type(float))
    return prior_alpha / p - prior_alpha - prior_beta


def capped(p_hat: ArrayLike, evidence_cap: float, prior_alpha: float = 0.5,
           prior_beta: float = 0.5) -> jnp.ndarray:
    """bool[P]: seen prompts whose evidence without success reaches the cap (NaN: False)."""
    return evidence_without_success(p_hat, prior_alpha, prior_beta) >= evidence_cap


@register("sera_evidence")
def sera_evidence(p: ArrayLike, budget: int, *, n_min: int, n_max: int, shift: int = 1,
                  unseen: str = "fill", rounding: str = "leximin", threshold: float = 0.05,
                  evidence_cap: float = 64.0, prior_alpha: float = 0.5,
                  prior_beta: float = 0.5) -> Allocation:
    """SERA (dynamic, leximin) after removing the prompts with ``E(p̂) ≥ evidence_cap``
    (their p is set to 0, which SERA's active set never admits while other prompts can take
    the budget). Same contract as ``sera``; raises ValueError for a cap or prior <= 0."""
    if not evidence_cap > 0:
        raise ValueError(f"evidence_cap={evidence_cap!r}; must be > 0 (failures without "
                         "success, in rollouts)")
    if not (prior_alpha > 0 and prior_beta > 0):
        raise ValueError(f"prior_alpha={prior_alpha!r}, prior_beta={prior_beta!r}; both must "
                         "be > 0 (the history's Beta prior)")
    p = jnp.asarray(p, jnp.result_type(float))
    p = jnp.where(capped(p, evidence_cap, prior_alpha, prior_beta), 0.0, p)
    return sera_allocate(p, budget, n_min=n_min, n_max=n_max, mode="dynamic",
                         rounding=rounding, shift=shift, threshold=threshold, unseen=unseen)


__all__ = ["capped", "evidence_without_success", "sera_evidence"]
