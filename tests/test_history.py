"""SuccessHistory: discounted Beta posterior, frozen per epoch, Orbax round-trip."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from sera_jax.history import (
    SuccessHistory,
    lookup,
    start_epoch,
    update,
    update_from_rollouts,
)


def test_posterior_follows_the_hand_computation_over_three_epochs():
    h = start_epoch(SuccessHistory.create(4))  # epoch 1: nothing known yet
    assert np.all(np.isnan(lookup(h, jnp.arange(4))))
    # Epoch 1: prompt 0 gets 3/4, prompt 2 gets 0/2 (in two calls), prompt 1 and 3 nothing.
    h = update(h, jnp.array([0, 2]), jnp.array([3.0, 0.0]), jnp.array([4.0, 1.0]))
    h = update(h, jnp.array([2]), jnp.array([0.0]), jnp.array([1.0]))
    h = start_epoch(h)  # epoch 2
    # S0 = 0.75*0 + 3 = 3, F0 = 1: p = (0.5+3)/(1+4) = 0.7;  S2 = 0, F2 = 2: p = 0.5/3.
    np.testing.assert_allclose(lookup(h, jnp.array([0, 2])), [0.7, 0.5 / 3], rtol=1e-6)
    assert np.all(np.isnan(lookup(h, jnp.array([1, 3]))))
    # Epoch 2: prompt 0 gets 0/2, prompt 1 gets 1/1.
    h = update(h, jnp.array([0, 1]), jnp.array([0.0, 1.0]), jnp.array([2.0, 1.0]))
    h = start_epoch(h)  # epoch 3
    s0, f0 = 0.75 * 3 + 0, 0.75 * 1 + 2
    s2, f2 = 0.75 * 0, 0.75 * 2  # no new data: only the discount acts
    want = [(0.5 + s0) / (1 + s0 + f0), (0.5 + 1) / (1 + 1), (0.5 + s2) / (1 + s2 + f2)]
    np.testing.assert_allclose(lookup(h, jnp.array([0, 1, 2])), want, rtol=1e-6)
    np.testing.assert_allclose(h.successes[:3], [s0, 1, s2], rtol=1e-6)
    np.testing.assert_allclose(h.failures[:3], [f0, 0, f2], rtol=1e-6)
    np.testing.assert_array_equal(h.pending_successes, 0)
    np.testing.assert_array_equal(h.seen, [True, True, True, False])


def test_custom_prior_and_discount():
    h = SuccessHistory.create(2, alpha=1.0, beta=3.0, gamma=0.5)
    h = start_epoch(update(h, jnp.array([1]), jnp.array([2.0]), jnp.array([2.0])))
    h = start_epoch(update(h, jnp.array([1]), jnp.array([0.0]), jnp.array([4.0])))
    s, f = 0.5 * 2, 4.0
    assert float(lookup(h, jnp.array([1]))[0]) == pytest.approx((1 + s) / (4 + s + f), rel=1e-6)


def test_no_within_epoch_leakage():
    h = start_epoch(update(SuccessHistory.create(3), jnp.array([0]), jnp.array([1.0]),
                           jnp.array([2.0])))
    frozen = np.asarray(lookup(h, jnp.arange(3)))
    for _ in range(3):  # many steps of the same epoch: p_hat must not move
        h = update(h, jnp.array([0, 1]), jnp.array([5.0, 5.0]), jnp.array([5.0, 5.0]))
        np.testing.assert_array_equal(lookup(h, jnp.arange(3)), frozen)
    assert float(h.pending_successes[0]) == 15.0
    assert not np.array_equal(lookup(start_epoch(h), jnp.arange(3)), frozen, equal_nan=True)


def test_update_from_rollouts_equals_per_prompt_update():
    h = SuccessHistory.create(10)
    batch_ids = jnp.array([7, 2, 5])  # dataset ids of the batch's prompts
    segment_ids = jnp.array([0, 0, 0, 2, 2])  # prompt 1 (id 2) got no rollouts
    rewards = jnp.array([1.0, 0.0, 1.0, 0.0, 0.0])
    a = update_from_rollouts(h, batch_ids, segment_ids, rewards)
    b = update(h, jnp.array([7, 5]), jnp.array([2.0, 0.0]), jnp.array([3.0, 2.0]))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    # A flat per-rollout form (trials = 1 each, repeated ids) accumulates the same way.
    c = update(h, batch_ids[segment_ids], rewards, jnp.ones(5))
    jax.tree.map(np.testing.assert_array_equal, a, c)
    assert bool(start_epoch(a).seen[7]) and not bool(start_epoch(a).seen[2])


def test_history_is_jittable():
    h = SuccessHistory.create(6)
    ids, seg, r = jnp.array([1, 4]), jnp.array([0, 1, 1]), jnp.array([1.0, 0.0, 1.0])
    step = jax.jit(lambda h: start_epoch(update_from_rollouts(h, ids, seg, r)))
    got = step(h)
    want = start_epoch(update_from_rollouts(h, ids, seg, r))
    jax.tree.map(np.testing.assert_array_equal, got, want)
    np.testing.assert_allclose(jax.jit(lookup)(got, ids), [1.5 / 2, 1.5 / 3], rtol=1e-6)


def test_orbax_round_trip_is_bit_exact(tmp_path):
    h = SuccessHistory.create(5, gamma=0.6)
    h = update(h, jnp.array([0, 3]), jnp.array([1.0, 2.0]), jnp.array([3.0, 2.0]))
    h = update(start_epoch(h), jnp.array([1]), jnp.array([1.0]), jnp.array([1.0]))  # pending
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(tmp_path / "history", h)
    ckptr.wait_until_finished()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, h)
    restored = ckptr.restore(tmp_path / "history", target)
    ckptr.close()
    assert isinstance(restored, SuccessHistory)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(h)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))  # NaN-free, exact
    np.testing.assert_array_equal(lookup(restored, jnp.arange(5)), lookup(h, jnp.arange(5)))
    np.testing.assert_array_equal(lookup(start_epoch(restored), jnp.arange(5)),
                                  lookup(start_epoch(h), jnp.arange(5)))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda h: update(h, jnp.array([3]), jnp.array([1.0]), jnp.array([1.0])), "prompt_ids"),
        (lambda h: update(h, jnp.array([-1]), jnp.array([1.0]), jnp.array([1.0])), "-1"),
        (lambda h: update(h, jnp.array([0]), jnp.array([2.0]), jnp.array([1.0])), "successes"),
        (lambda h: update(h, jnp.array([0]), jnp.array([-1.0]), jnp.array([1.0])), "successes"),
        (lambda h: update(h, jnp.array([0]), jnp.array([1.0, 1.0]), jnp.array([1.0])), "shape"),
        (lambda h: update(h, jnp.array([0.0]), jnp.array([1.0]), jnp.array([1.0])), "integer"),
        (lambda h: lookup(h, jnp.array([5])), "num_prompts=3"),
        (lambda h: update_from_rollouts(h, jnp.array([0]), jnp.array([1]), jnp.array([1.0])),
         "segment_ids"),
        (lambda h: update_from_rollouts(h, jnp.array([0]), jnp.array([0]), jnp.array([2.0])),
         r"\[0, 1\]"),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call(SuccessHistory.create(3))


@pytest.mark.parametrize(
    "kwargs, match",
    [({"num_prompts": 0}, "num_prompts"), ({"num_prompts": 2, "alpha": 0.0}, "alpha"),
     ({"num_prompts": 2, "beta": -1.0}, "beta"), ({"num_prompts": 2, "gamma": 1.5}, "gamma")],
)
def test_create_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SuccessHistory.create(**kwargs)
