"""The published SERA recipe never lets a never-solved prompt leave its active set.

A prompt that is never solved and gets n rollouts per epoch has discounted failures
F_{t+1} = γ F_t + n -> F* = n / (1 − γ), so p̂ = α / (α + β + F*) and

    u(p̂, n) = 1 − (1 − p̂)^n − p̂^n  ->  1 − exp(−α (1 − γ))   (n -> ∞)

= 0.1175 at the published α = β = ½, γ = 0.75: above θ = 0.05 for every n_max, so the
dynamic active set keeps the prompt, at n_max rollouts, every visit (docs/active_set_floor.md).
"""

import math

import numpy as np
import pytest

from sera_jax import history as history_lib
from sera_jax import methods, scaling

ALPHA, BETA, GAMMA = 0.5, 0.5, 0.75
FLOOR = 1.0 - math.exp(-ALPHA * (1.0 - GAMMA))


def test_the_floor_value_is_0_1175():
    assert FLOOR == pytest.approx(0.1175, abs=5e-5)


@pytest.mark.parametrize("n_max", [32, 64, 512, 4096])
def test_a_never_solved_prompt_converges_to_the_floor(n_max):
    h = history_lib.SuccessHistory.create(1, alpha=ALPHA, beta=BETA, gamma=GAMMA)
    for _ in range(60):  # γ^60 ≈ 3e-8: the steady state
        h = history_lib.update(h, np.array([0]), np.array([0.0]), np.array([float(n_max)]))
        h = history_lib.start_epoch(h)
    p_hat = float(history_lib.lookup(h, np.array([0]))[0])
    f_star = n_max / (1.0 - GAMMA)
    assert p_hat == pytest.approx(ALPHA / (ALPHA + BETA + f_star), rel=1e-4)
    u = float(scaling.mixed_group_prob(p_hat, n_max))
    # The finite-n value lies just below the limit and above θ for every n_max.
    assert 0.05 < u <= FLOOR + 1e-6
    assert u == pytest.approx(FLOOR, abs=2e-3)


def test_sera_keeps_the_never_solved_prompt_active_at_n_max():
    """P = 8 prompts, N0 = 16: one at its floor p̂, seven learnable ones; SERA (θ = 0.05)
    keeps the hopeless prompt active at n_max rollouts (half the budget), the seven
    learnable prompts share the other half."""
    n_max, n0, p_count = 64, 16, 8
    p_floor = ALPHA / (ALPHA + BETA + n_max / (1.0 - GAMMA))
    p_hat = np.array([p_floor, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], np.float32)
    alloc = methods.get_method("sera").allocate(p_hat, p_count * n0, n_min=2, n_max=n_max)
    counts = np.asarray(alloc.counts)
    assert counts.sum() == p_count * n0
    assert counts[0] == n_max  # leximin pins the minimum κ at the hopeless prompt
    assert counts[1:].sum() == p_count * n0 - n_max
