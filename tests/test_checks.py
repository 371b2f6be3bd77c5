"""Checked mode (`sera_jax.checks`): bad values are refused under jit too."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import checks, estimators, history
from sera_jax.allocation import allocate


def test_unchecked_entry_points_accept_bad_values_under_jit():
    """What checked mode is for: under plain jit nothing can read the values."""
    counts = jax.jit(lambda p: allocate(p, 64, n_min=2, n_max=16).counts)(
        jnp.array([0.2, -0.5, 1.5, 0.7]))
    assert int(counts.sum()) == 64
    adv = jax.jit(lambda r, s: estimators.maxrl(r, s, 2))(jnp.array([1.0, 2.0, 0.0]),
                                                          jnp.array([0, 1, 5]))
    assert adv.shape == (3,)


# One checked program per module, shared by the parametrised cases (p and the rewards are
# traced, so every case runs the same compiled check; a fresh lambda per case recompiled it).
_CHECKED_ALLOCATE = checks.jit_checked(lambda p: checks.allocate(p, 64, n_min=2, n_max=16).counts)
_CHECKED_MAXRL = checks.jit_checked(lambda r, s: checks.maxrl(r, s, 2))


@pytest.mark.parametrize("bad", [-0.5, 1.5, np.inf])
def test_allocate_refuses_p_outside_the_unit_interval_under_jit(bad):
    fn = _CHECKED_ALLOCATE
    with pytest.raises(checks.CheckError, match=rf"allocate: p\[1\]={bad} is outside \[0, 1\]"):
        fn(jnp.array([0.2, bad, 0.5, 0.7]))
    ok = np.asarray(fn(jnp.array([0.2, np.nan, 0.5, 0.7])))  # NaN = unseen: allowed
    assert ok.sum() == 64
    np.testing.assert_array_equal(
        ok, allocate(jnp.array([0.2, np.nan, 0.5, 0.7]), 64, n_min=2, n_max=16).counts)


@pytest.mark.parametrize("rewards, ids, match", [
    ([1.0, 0.0, 1.0], [0, 1, 2], r"segment_ids\[2\]=2 is outside \[0, 2\)"),
    ([1.0, 0.0, 1.0], [0, -1, 1], r"segment_ids\[1\]=-1 is outside"),
    ([1.0, 2.0, 0.0], [0, 1, 1], r"rewards\[1\]=2\.0; rewards must be binary"),
    ([1.0, np.nan, 0.0], [0, 1, 1], r"rewards\[1\]=nan"),
])
def test_maxrl_refuses_bad_segments_and_rewards_under_jit(rewards, ids, match):
    fn = _CHECKED_MAXRL
    with pytest.raises(checks.CheckError, match=match):
        fn(jnp.asarray(rewards), jnp.asarray(ids, jnp.int32))
    good = fn(jnp.array([1.0, 0.0, 1.0]), jnp.array([0, 0, 1], jnp.int32))
    np.testing.assert_array_equal(good, estimators.maxrl(jnp.array([1.0, 0.0, 1.0]),
                                                         jnp.array([0, 0, 1]), 2))
    # GRPO takes any finite reward: only the range of the ids is checked.
    grpo = checks.jit_checked(lambda r, s: checks.advantages("grpo", r, s, 2))
    assert grpo(jnp.array([0.5, 2.0, 0.0]), jnp.array([0, 0, 1], jnp.int32)).shape == (3,)


def test_history_refuses_ids_out_of_range_under_jit():
    h = history.update(history.SuccessHistory.create(4), jnp.array([0, 1]),
                       jnp.array([1.0, 0.0]), jnp.array([2.0, 2.0]))
    h = history.start_epoch(h)
    fn = checks.jit_checked(checks.lookup)
    with pytest.raises(checks.CheckError, match=r"history\.lookup: prompt_ids\[1\]=4 is outside"
                       r" \[0, 4\)"):
        fn(h, jnp.array([0, 4]))
    np.testing.assert_array_equal(fn(h, jnp.array([0, 2])), history.lookup(h, jnp.array([0, 2])))
    up = checks.jit_checked(checks.update)
    with pytest.raises(checks.CheckError, match=r"successes\[0\]=3\.0, trials\[0\]=2\.0"):
        up(h, jnp.array([0]), jnp.array([3.0]), jnp.array([2.0]))
    roll = checks.jit_checked(checks.update_from_rollouts)
    with pytest.raises(checks.CheckError, match=r"segment_ids\[1\]=2 is outside \[0, 2\)"):
        roll(h, jnp.array([0, 1]), jnp.array([0, 2]), jnp.array([1.0, 0.0]))


def test_checks_raise_eagerly_and_are_value_errors():
    with pytest.raises(ValueError, match=r"p\[0\]=1\.5"):
        checks.allocate(np.array([1.5, 0.5]), 8, n_min=2, n_max=8)
    assert issubclass(checks.CheckError, ValueError)  # one line in every binary (common.main)


def test_a_check_under_plain_jit_says_to_use_checked_mode():
    with pytest.raises(ValueError, match="not functionalized"):
        jax.jit(lambda p: checks.allocate(p, 8, n_min=2, n_max=8).counts)(jnp.array([0.5, 0.5]))
