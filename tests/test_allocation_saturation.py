"""The dynamic active set ranks by u(p, n_max) even where u rounds to 1 (a saturated
ranking score must not fall back to index order)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.allocation import _waterline, allocate
from sera_jax.studies.allocation_demo import synthetic_success_probs


def _log_deg(p, n):
    with np.errstate(divide="ignore"):
        return np.logaddexp(n * np.log1p(-p), n * np.log(p))  # log(1 - u(p, n)), float64


def test_score_keeps_the_published_order_and_stays_distinct_past_saturation():
    # u below 1 in float64: the key is j = round(2**53 (1 - u)), the published quantum.
    ldeg = jnp.asarray(np.log([0.5, 1e-3, 2.0**-40, 3 * 2.0**-53]), jnp.float32)
    score = np.asarray(_waterline._saturation_score(ldeg))
    np.testing.assert_array_equal(score[2:], [8192.0, 3.0])  # whole quanta, exactly
    np.testing.assert_allclose(score[:2], [2.0**52, 1e-3 * 2.0**53], rtol=1e-5)
    assert np.all(np.diff(score) < 0)
    # u == 1 in float64 (and in float32): still strictly ordered by log(1 - u).
    sat = jnp.asarray(-np.geomspace(40.0, 4e4, 200), jnp.float32)[::-1]  # increasing ldeg
    score = np.asarray(_waterline._saturation_score(sat))
    assert np.all(np.diff(score) > 0) and np.all(score < 0)
    both = np.asarray(_waterline._saturation_score(jnp.concatenate([sat, ldeg])))
    assert both[:200].max() < both[200:].min()  # saturated ones rank before every other


@pytest.mark.parametrize("n_max", [65_536, 4_096])
def test_saturated_active_set_ranks_by_u_not_index(n_max):
    """P = 65,536, N0 = 128 (the demo): the budget is exact, the active set is the top-k by
    u (largest first, within float32 rounding of log(1 - u)), spread over the whole batch,
    and every active prompt is mixed enough."""
    num, n0 = 65_536, 128
    p = synthetic_success_probs(jax.random.key(0), num)
    alloc = allocate(p, num * n0, n_min=2, n_max=n_max)
    counts = np.asarray(alloc.counts)
    active = counts > 0
    assert counts.sum() == num * n0
    p32 = np.asarray(p, np.float32).astype(np.float64)
    ldeg = _log_deg(p32, n_max)
    eligible = ldeg <= np.log1p(-0.05)
    k = int(active.sum())
    # Before the fix: 763 prompts, indices 1..883, at n_max = 65,536.
    assert 0.5 * eligible.sum() < k <= eligible.sum(), (k, int(eligible.sum()))
    assert np.flatnonzero(active).min() < num // 100 and np.flatnonzero(active).max() > num * 0.99
    # Top-k by the published key (u's float64 quantum j where u < 1, ties by index; log(1-u)
    # past it): no inactive eligible prompt ranks before an active one (float32 slack).
    j = np.round(np.exp(ldeg + 53 * np.log(2)))
    key = np.where(j > 0, j, ldeg)
    worst_active = key[active].max()
    best_inactive = key[eligible & ~active].min() if np.any(eligible & ~active) else np.inf
    assert worst_active <= best_inactive + 1 + 1e-5 * abs(best_inactive), (worst_active,
                                                                           best_inactive)
    mixed = -np.expm1(_log_deg(p32[active], counts[active]))
    assert np.all(mixed >= 0.05 * (1 - 1e-5))


def test_saturated_sizes_agree():
    """At both n_max the kept set is about the same size (46,963 at 4,096 before and after)."""
    p = synthetic_success_probs(jax.random.key(0), 65_536)
    ks = [int(allocate(p, 65_536 * 128, n_min=2, n_max=n).num_active) for n in (4_096, 65_536)]
    assert abs(ks[0] - ks[1]) <= 0.01 * ks[0], ks
