"""`sera_evidence` (sera_jax.allocation.evidence): with the published history, a planted
never-solved prompt leaves the active set (it does not under `sera`: the 0.1175 floor),
while a prompt with occasional successes stays; `sera` itself is unchanged."""

import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import history as history_lib
from sera_jax import methods
from sera_jax.allocation import evidence, get_allocator

P, N0, N_MIN, N_MAX = 16, 8, 2, 64
#: True success rates: prompt 0 never solved, prompt 1 occasionally (1 in 40), the rest easy.
P_TRUE = np.array([0.0, 1 / 40] + list(np.linspace(0.1, 0.7, P - 2)))


def _simulate(method: methods.Method, epochs: int = 40) -> np.ndarray:
    """Counts [epochs, P]: every prompt every step (one step per epoch), history α = β = ½,
    γ = 0.75; successes = the expected number, carried over deterministically."""
    h = history_lib.SuccessHistory.create(P)
    carry = np.zeros(P)
    out = []
    for _ in range(epochs):
        h = history_lib.start_epoch(h)
        p_hat = np.asarray(history_lib.lookup(h, jnp.arange(P)))
        counts = np.asarray(method.allocate(p_hat, P * N0, n_min=N_MIN, n_max=N_MAX).counts)
        expected = carry + P_TRUE * counts
        succ = np.floor(expected)
        carry = expected - succ
        h = history_lib.update(h, jnp.arange(P), jnp.asarray(succ), jnp.asarray(counts))
        out.append(counts)
    return np.asarray(out)


def test_a_never_solved_prompt_leaves_and_an_occasionally_solved_one_stays():
    sera = _simulate(methods.get_method("sera"))
    capped = _simulate(methods.get_method("sera_evidence"))
    late = slice(20, None)
    assert (sera[late, 0] > 0).all(), "the published recipe keeps a never-solved prompt"
    assert (sera[late, 0] == N_MAX).mean() >= 0.5  # ... at n_max, the floor's waste
    assert (capped[late, 0] == 0).mean() >= 0.6, capped[:, 0]  # it leaves (re-probed rarely)
    assert capped[late, 0].sum() <= 0.4 * sera[late, 0].sum()
    assert (capped[late, 1] > 0).all(), capped[:, 1]  # the occasionally solved prompt stays
    assert (capped.sum(axis=1) == P * N0).all()  # the budget is spent exactly


def test_cap_semantics_and_errors():
    never = 0.5 / (1 + 256)  # p̂ of a never-solved prompt at F* = 256
    once = (0.5 + 4) / (1 + 256)  # one success per epoch at n_max 64: S* = 4
    e = np.asarray(evidence.evidence_without_success([never, once, np.nan]))
    assert e[0] == pytest.approx(256, rel=1e-5) and np.isnan(e[2])
    assert e[1] == pytest.approx(0.5 * 257 / 4.5 - 1, rel=1e-5)  # ≈ 28 < the cap 64
    np.testing.assert_array_equal(evidence.capped([never, once, np.nan], 64.0),
                                  [True, False, False])
    alloc = get_allocator("sera_evidence")
    p = np.array([never, once, 0.3, 0.5, np.nan, 0.6])
    counts = np.asarray(alloc(p, 48, n_min=2, n_max=16).counts)
    assert counts[0] == 0 and counts[1] > 0 and counts[4] > 0 and counts.sum() == 48
    # Without capped prompts it is SERA exactly.
    q = np.array([0.05, 0.3, 0.5, 0.9])
    np.testing.assert_array_equal(alloc(q, 32, n_min=2, n_max=16).counts,
                                  get_allocator("sera")(q, 32, n_min=2, n_max=16).counts)
    with pytest.raises(ValueError, match="evidence_cap"):
        alloc(q, 32, n_min=2, n_max=16, evidence_cap=0.0)
    with pytest.raises(ValueError, match="prior_alpha"):
        alloc(q, 32, n_min=2, n_max=16, prior_alpha=-1.0)


def test_sera_stays_the_published_recipe():
    m = methods.get_method("sera")
    assert (m.allocator, dict(m.options)) == ("sera", {"mode": "dynamic", "rounding": "leximin",
                                                       "threshold": 0.05})
    e = methods.get_method("sera_evidence")
    assert e.allocator == "sera_evidence" and e.options["evidence_cap"] == 64.0
