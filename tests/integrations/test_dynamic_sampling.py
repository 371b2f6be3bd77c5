"""DAPO dynamic sampling (sera_jax.dynamic_sampling): filter all-equal groups, refill to the
batch, count every generated rollout and token; combined with SERA's ragged counts."""

import numpy as np
import pytest

from sera_jax import dynamic_sampling as ds
from sera_jax import methods


def _round(counts, rewards, tokens_per_rollout=3):
    seg = np.repeat(np.arange(len(counts)), counts)
    rewards = np.asarray(rewards, np.float32)
    assert rewards.shape == seg.shape
    return ds.Round(seg, rewards, np.full(seg.shape, tokens_per_rollout), len(counts))


def test_informative_groups_are_the_mixed_ones():
    seg = np.array([0, 0, 1, 1, 1, 2, 2, 3])
    rew = np.array([0, 1, 1, 1, 1, 0, 0, 1])
    got = ds.informative_groups(seg, rew, 5)  # group 4 is empty (an inactive prompt)
    np.testing.assert_array_equal(got, [True, False, False, False, False])


def test_uniform_groups_refill_to_exactly_the_batch():
    # Round 0: 4 groups of 2, only groups 0 and 2 mixed; round 1: groups 1 and 3 mixed.
    r0 = _round([2, 2, 2, 2], [0, 1, 1, 1, 1, 0, 0, 0])
    r1 = _round([2, 2, 2, 2], [0, 0, 1, 0, 0, 0, 0, 1])
    calls = []

    def draw(i):
        calls.append(i)
        return (r0, r1)[i]

    rounds, sel = ds.fill(draw, batch_rows=8, max_rounds=5, min_group=2)
    assert calls == [0, 1] and sel.rounds == 2 and sel.filled(2)
    assert sel.keep.all() and sel.num_kept == 4 and sel.num_dropped == 4
    # Kept rows: round-0 groups 0, 2 (rows 0-1, 4-5), round-1 groups 1, 3 (rows 8+2.., 8+6..).
    np.testing.assert_array_equal(sel.rows, [0, 1, 4, 5, 10, 11, 14, 15])
    np.testing.assert_array_equal(sel.group, [0, 0, 1, 1, 2, 2, 3, 3])
    # Cost counts every generated rollout and token, dropped ones included.
    assert sel.generated_rollouts == 16 and sel.generated_tokens == 16 * 3
    rewards = np.concatenate([r.rewards for r in rounds])[sel.rows]
    assert ds.informative_groups(sel.group, rewards, 4).all()


def test_max_rounds_bounds_the_cost_and_pads_with_weightless_rows():
    dead = _round([2, 2], [1, 1, 0, 0])  # never informative
    rounds, sel = ds.fill(lambda i: dead, batch_rows=4, max_rounds=3)
    assert len(rounds) == 3 and sel.num_kept == 0 and not sel.keep.any()
    assert sel.generated_rollouts == 12 and sel.padding_rows == 4
    # max_rounds = 1 is filtering without refill.
    one = _round([2, 2], [0, 1, 1, 1])
    _, sel = ds.fill(lambda i: one, batch_rows=4, max_rounds=1)
    np.testing.assert_array_equal(sel.keep, [True, True, False, False])


def test_ragged_groups_pack_first_fit_and_stop_when_no_group_fits():
    # SERA-style counts (one inactive prompt): sizes 5, 0, 3, 4 for a batch of 12 rows.
    r0 = _round([5, 0, 3, 4], [0, 1, 0, 0, 0] + [1, 0, 1] + [1, 1, 1, 1])
    r1 = _round([6, 2, 2, 2], [0, 1, 0, 0, 0, 0] + [0, 1] + [1, 0] + [0, 0])
    rounds, sel = ds.fill(lambda i: (r0, r1)[i], batch_rows=12, max_rounds=4, min_group=2)
    # Round 0 keeps 5 + 3 = 8 rows; round 1's group of 6 does not fit, the two mixed 2s do.
    assert sel.rounds == 2 and sel.num_kept == 4 and sel.padding_rows == 0
    np.testing.assert_array_equal(sel.rows[:8], [0, 1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(sel.rows[8:], [12 + 6, 12 + 7, 12 + 8, 12 + 9])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_rows"):
        ds.select([], 0)
    with pytest.raises(ValueError, match="max_rounds"):
        ds.fill(lambda i: None, 4, 0)
    with pytest.raises(ValueError, match="segment_ids must lie"):
        ds.Round(np.array([0, 3]), np.zeros(2), np.zeros(2, int), 2)


def test_dapo_methods_are_registered_peers():
    dapo, sera_dapo = methods.get_method("dapo"), methods.get_method("sera_dapo")
    assert dapo.dynamic_sampling and dapo.allocator == "uniform"
    assert sera_dapo.dynamic_sampling and sera_dapo.allocator == "sera"
    assert dict(sera_dapo.options) == dict(methods.get_method("sera").options)
    assert sera_dapo.to_dict()["dynamic_sampling"] is True
    assert "dynamic_sampling" not in methods.get_method("sera").to_dict()  # fingerprints kept
    assert methods.resolve("sera_dapo", {"threshold": 0.2}).dynamic_sampling
