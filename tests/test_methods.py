"""The one method registry: presets, overrides that take effect or fail, one allocator
signature that refuses unused options."""

import numpy as np
import pytest

from sera_jax import allocation, methods
from sera_jax.allocation import beyond

P = np.array([1e-4, 0.02, 0.3, 0.9, 0.999, 0.5, 0.05, 0.7])


def test_presets_allocate_with_the_library_allocators():
    for name, m in methods.METHODS.items():
        if m.two_stage:  # allocates after an in-step pilot (the lab draws it)
            with pytest.raises(ValueError, match="pilot"):
                m.allocate(P, 8 * 16, n_min=2, n_max=64)
            continue
        a = m.allocate(P, 8 * 16, n_min=2, n_max=64)
        counts = np.asarray(a.counts)
        assert counts.sum() == 128, name
        assert np.all((counts == 0) | ((counts >= 2) & (counts <= 64))), name
        w = m.prompt_weights(counts, np.asarray(a.weights))
        if m.multiplicity:
            np.testing.assert_allclose(w[counts > 0], 16 / counts[counts > 0], rtol=1e-6)
        else:
            np.testing.assert_array_equal(w, (counts > 0).astype(np.float32))
    assert methods.get_method("grpo").estimator == "grpo"
    assert methods.get_method("sera").kappa_shift == 1


def test_an_override_takes_effect():
    eq = methods.resolve("sera", {"mode": "equalized"})
    assert eq.options["mode"] == "equalized" and "threshold" not in eq.options
    direct = allocation.allocate(P, 128, n_min=2, n_max=64, mode="equalized")
    np.testing.assert_array_equal(eq.allocate(P, 128, n_min=2, n_max=64).counts, direct.counts)
    assert np.all(np.asarray(direct.counts) > 0)
    assert methods.resolve("sera", {"threshold": 0.3}).options["threshold"] == 0.3
    assert methods.resolve("uniform", {"estimator": "rloo"}).estimator == "rloo"
    assert not methods.resolve("sera", {"multiplicity": False}).multiplicity
    swapped = methods.resolve("sera", {"allocator": "knapsack"})
    assert swapped.allocator == "knapsack" and dict(swapped.options) == {}
    assert methods.resolve("sera", {"mode": None}) == methods.get_method("sera")  # None = preset


@pytest.mark.parametrize("name, overrides, match", [
    ("uniform", {"mode": "equalized"}, r"allocator 'uniform' does not use option\(s\) \['mode'\]"),
    ("sera_equalized", {"threshold": 0.1}, "threshold is used only by mode='dynamic'"),
    ("sera", {"mode": "dynamical"}, "mode='dynamical'"),
    ("sera", {"threshold": float("nan")}, "threshold=nan"),
    ("sera", {"allocator": "nope"}, "unknown allocator 'nope'"),
    ("sera", {"estimator": "ppo"}, "estimator='ppo'"),
    ("sera", {"stepz": 1}, r"unknown override\(s\) \['stepz'\]"),
    ("serra", {}, "did you mean 'sera'"),
])
def test_an_override_that_cannot_apply_fails_loudly(name, overrides, match):
    with pytest.raises(ValueError, match=match):
        methods.resolve(name, overrides)


def test_every_allocator_has_one_signature_and_refuses_unused_options():
    for name, fn in allocation.ALLOCATORS.items():
        options = ({"pilot_successes": np.ones(P.size, np.int32)} if name in beyond.TWO_STAGE
                   else {})
        try:
            a = fn(P, 64, n_min=2, n_max=32, shift=1, unseen="fill", **options)
        except TypeError as e:  # pragma: no cover - the failure this test exists for
            pytest.fail(f"{name}: {e}")
        assert int(np.asarray(a.counts).sum()) == 64
        with pytest.raises(ValueError, match=f"allocator {name!r} does not use"):
            fn(P, 64, n_min=2, n_max=32, not_an_option=1)
    with pytest.raises(ValueError, match="does not use option"):
        allocation.ALLOCATORS["uniform"](P, 64, n_min=2, n_max=32, mode="equalized")


def test_per_call_inputs_and_the_expected_scale():
    """`Method.allocate` passes the pilot / posterior inputs only to allocators that use them;
    `expected_scale` is κ(p, N) one-shot and the scale given the pilot two-stage."""
    seq, sera = methods.get_method("sera_sequential"), methods.get_method("sera")
    assert seq.pilot_size(2) == 2 and sera.pilot_size(2) == 0
    k1 = np.array([0, 0, 1, 2, 2, 1, 0, 2])
    a = seq.allocate(P, 128, n_min=2, n_max=64, pilot_successes=k1)
    direct = allocation.get_allocator("sequential")(P, 128, n_min=2, n_max=64, pilot=2,
                                                    pilot_successes=k1)
    np.testing.assert_array_equal(a.counts, direct.counts)
    with pytest.raises(ValueError, match=r"does not use option\(s\) \['pilot_successes'\]"):
        sera.allocate(P, 128, n_min=2, n_max=64, pilot_successes=k1)
    counts = np.asarray(a.counts)
    np.testing.assert_allclose(sera.expected_scale(P, counts, n_min=2),
                               1 - (1 - P) ** (counts - 1), rtol=1e-5)
    got = np.asarray(seq.expected_scale(P, counts, n_min=2, pilot_successes=k1))
    want = (counts - 2) / counts + (2 - k1) / (counts * (1 - P)) - (k1 == 0) * (1 - P) ** (
        counts - 3)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    with pytest.raises(ValueError, match="pilot_successes"):
        seq.expected_scale(P, counts, n_min=2)


def test_a_toy_allocator_added_in_one_file_allocates_exactly():
    """`tests/toy_allocator.py` registers an allocator with one decorator (its option read
    from its signature) and wraps it in a `Method`: it allocates the budget exactly, eagerly
    and under jit + vmap, and refuses options it does not take."""
    import jax
    import jax.numpy as jnp

    from sera_jax import objective
    from tests import toy_allocator

    name = toy_allocator.NAME
    assert allocation.ALLOCATOR_OPTIONS[name] == ("unseen_p",)
    toy = toy_allocator.TOY
    p = P.copy()
    p[2] = np.nan  # unseen: counts as p = 0.5
    a = toy.allocate(p, 8 * 6, n_min=2, n_max=12)
    counts = np.asarray(a.counts)
    assert counts.sum() == 48 and counts.min() >= 2 and counts.max() <= 12
    np.testing.assert_array_equal(counts, [12, 12, 4, 2, 2, 2, 12, 2])  # hardest first
    np.testing.assert_allclose(np.asarray(a.weights), 6 / counts, rtol=1e-6)
    batch = jnp.stack([jnp.asarray(P), jnp.asarray(P[::-1])])
    plans = jax.jit(jax.vmap(lambda q: objective.plan_rollouts(toy, q, 48, n_min=2, n_max=12))
                    )(batch)
    np.testing.assert_array_equal(np.asarray(plans.counts).sum(axis=1), [48, 48])
    with pytest.raises(ValueError, match=f"allocator '{name}' does not use"):
        methods.Method("bad", "bad", name, {"mode": "dynamic"})


def test_register_refuses_a_taken_name_and_a_foreign_signature():
    with pytest.raises(ValueError, match="already registered"):
        allocation.register("sera")(allocation.uniform)
    with pytest.raises(TypeError, match=r"lacks the shared parameter\(s\) \['shift', 'unseen'\]"):
        allocation.register("no_shift")(lambda p, budget, *, n_min, n_max: None)
    assert "no_shift" not in allocation.ALLOCATORS
