"""The lab's training run: it uses the library's allocator, estimator and weights (patching
them changes its result), it is deterministic under its seed, and methods are paired."""

import dataclasses

import numpy as np
import pytest

from sera_jax import allocation, estimators, methods
from sera_jax.studies.lab import train

SETUP = train.Setup(num_train=8, num_test=8, num_answers=6, feature_dim=4, num_skills=2,
                    prompts_per_step=4, n0=4, n_min=2, n_max=8, num_steps=6, eval_every=2,
                    optimizer=(("learning_rate", 0.1),), ks=(1, 4, 16))
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def tasks():
    return train.seed_keys(0, SEEDS), train.make_tasks(SETUP, 0, SEEDS, "maze")


def _run(name, tasks):
    keys, t = tasks
    return train.Runner(methods.get_method(name), SETUP)(keys, t)


@pytest.fixture(scope="module")
def uniform_runner():
    return train.Runner(methods.get_method("uniform"), SETUP)


@pytest.fixture(scope="module")
def sera_runner():
    return train.Runner(methods.get_method("sera_equalized"), SETUP)


@pytest.fixture(scope="module")
def uniform_run(tasks, uniform_runner):
    return uniform_runner(*tasks)


@pytest.fixture(scope="module")
def sera_run(tasks, sera_runner):
    return sera_runner(*tasks)


def _same(a, b):
    return all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def test_shapes_and_budget(uniform_run, sera_run):
    s = SETUP
    n = len(SEEDS)
    assert sera_run["steps"].shape == (n, s.num_steps, len(train.STEP_METRICS))
    assert sera_run["counts"].shape == (n, s.num_steps, s.prompts_per_step)
    assert sera_run["pass_at_k"].shape == (n, len(s.eval_steps), 2, len(s.ks))
    assert (sera_run["counts"].sum(-1) == s.budget).all()
    assert (uniform_run["counts"] == s.n0).all()
    # Epoch 1 is all unseen: SERA gives N0 each; afterwards it spreads the budget.
    spe = s.steps_per_epoch
    assert (sera_run["counts"][:, :spe] == s.n0).all()
    assert (sera_run["counts"][:, spe:] != s.n0).any()


def test_paired_and_deterministic(tasks, sera_runner, uniform_run, sera_run):
    """Same initial policy and the same random numbers: identical while the allocations
    coincide (the whole first epoch); a second run is bit-identical, another seed is not."""
    spe = SETUP.steps_per_epoch
    # Two different programs: equal up to XLA's choice of fusion and reduction order (bit for
    # bit with the default CPU flags, within 1e-7 with the suite's faster-compiling ones);
    # unpaired random numbers or policies would differ by O(1e-1).
    equal = dict(rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(uniform_run["steps"][:, :spe], sera_run["steps"][:, :spe], **equal)
    np.testing.assert_allclose(uniform_run["pass_at_k"][:, 0], sera_run["pass_at_k"][:, 0],
                               **equal)
    assert _same(sera_runner(*tasks), sera_run)
    other = sera_runner(train.seed_keys(1, SEEDS), train.make_tasks(SETUP, 1, SEEDS, "maze"))
    assert not np.array_equal(other["pass_at_k"], sera_run["pass_at_k"])


def test_uses_the_library_allocator(tasks, uniform_run, sera_run, monkeypatch):
    """Replacing ALLOCATORS['sera'] by the uniform allocator turns the lab's SERA run into
    its uniform run: the lab calls the registry, it has no allocator of its own."""
    assert not _same(uniform_run, sera_run)
    plain = allocation.ALLOCATORS["uniform"]
    calls = []

    def fake(p, budget, *, n_min, n_max, shift=1, unseen="fill", **options):
        calls.append(options)
        return plain(p, budget, n_min=n_min, n_max=n_max, shift=shift, unseen=unseen)

    monkeypatch.setitem(allocation.ALLOCATORS, "sera", fake)
    patched = _run("sera_equalized", tasks)
    assert calls and calls[0]["mode"] == "equalized"
    assert _same(patched, uniform_run)


def test_uses_the_library_estimator_and_weights(tasks, uniform_runner, uniform_run,
                                                monkeypatch):
    """A zero advantage estimator or zero prompt weights leave the policy untouched."""
    est = estimators.ADVANTAGE_ESTIMATORS["maxrl"]
    zero = dataclasses.replace(est, group_fn=lambda r, s, **kw: 0.0 * r)
    monkeypatch.setitem(estimators.ADVANTAGE_ESTIMATORS, "maxrl", zero)
    frozen = _run("uniform", tasks)
    pk = frozen["pass_at_k"]
    np.testing.assert_allclose(pk, np.broadcast_to(pk[:, :1], pk.shape), rtol=1e-6)
    assert not np.allclose(uniform_run["pass_at_k"][:, -1], uniform_run["pass_at_k"][:, 0])
    monkeypatch.undo()

    # Method.prompt_weights is traced into the step: a runner built after the patch uses it.
    monkeypatch.setattr(methods.Method, "prompt_weights",
                        lambda self, counts, weights: np.zeros(np.shape(weights), np.float32))
    unweighted = train.Runner(methods.get_method("uniform"), SETUP)(*tasks)
    np.testing.assert_allclose(unweighted["pass_at_k"], pk, rtol=1e-6)


def test_two_stage_method_in_the_lab(tasks):
    """sera_sequential: counts >= its pilot, no uniform first epoch, budget exact."""
    run = _run("sera_sequential", tasks)
    c = run["counts"]
    assert (c.sum(-1) == SETUP.budget).all() and c.min() >= 2
    assert (c[:, : SETUP.steps_per_epoch] != SETUP.n0).any()
    assert np.isfinite(run["pass_at_k"]).all()


@pytest.mark.parametrize("name", ["vip", "gdro", "pilot_commit"])
def test_2026_peers_in_the_lab(tasks, name):
    """The 2026 peers run by name (pilot_commit with its pilot drawn, gdro with its state in
    the carry): the budget exactly, counts in bounds, finite results."""
    run = _run(name, tasks)
    c = run["counts"]
    assert (c.sum(-1) == SETUP.budget).all()
    assert c.min() >= SETUP.n_min and c.max() <= SETUP.n_max
    assert np.isfinite(run["pass_at_k"]).all()
    if name == "pilot_commit":  # no uniform first epoch: it allocates from its pilot
        assert (c[:, : SETUP.steps_per_epoch] != SETUP.n0).any()


def test_gdro_carries_its_state_across_steps(tasks):
    """The lab's carry holds gdro's controller: fresh at step 0, moved once p̂ is seen (epoch
    2), fed to the next step; a three-part carry is refused; the checked first step passes."""
    import jax
    import jax.numpy as jnp

    from sera_jax import optim

    method = methods.get_method("gdro")
    keys, (tr, _, params) = tasks
    tx = optim.make_optimizer(dict(SETUP.optimizer))
    one = lambda x: x[0]  # noqa: E731  (seed 0)
    tr0, p0 = jax.tree.map(one, tr), jax.tree.map(one, params)
    k_data, k_roll = jax.random.split(jax.random.fold_in(jax.random.wrap_key_data(keys[0]), 1))
    step = jax.jit(train._make_step(method, SETUP, tx))
    carry = train.initial_carry(method, SETUP, tx, p0)
    assert len(carry) == 4 and np.isnan(float(carry[3].log_price))
    prices = []
    for t in range(2 * SETUP.steps_per_epoch):
        carry, (_, counts) = step(carry, jnp.int32(t), tr0, k_data, k_roll)
        assert int(counts.sum()) == SETUP.budget
        prices.append(float(carry[3].log_price))
    spe = SETUP.steps_per_epoch
    assert np.isnan(prices[:spe]).all() and np.isfinite(prices[spe:]).all()  # epoch 1 unseen
    with pytest.raises(ValueError, match="allocator state"):
        step(carry[:3], jnp.int32(0), tr0, k_data, k_roll)
    train.check_first_step(method, SETUP, keys, tasks[1])


def test_setup_validation():
    with pytest.raises(ValueError, match="multiple of prompts_per_step"):
        train.Setup(num_train=10, prompts_per_step=4)
    with pytest.raises(ValueError, match="n_min <= n0 <= n_max"):
        train.Setup(n0=100, n_max=64)
    with pytest.raises(ValueError, match="rl.optimizer.schedule must be 'constant'"):
        train.Setup(optimizer=(("schedule", "cosine"), ("warmup_steps", 0)))
    with pytest.raises(ValueError, match=r"config.rl.optimizer.learning_rate=-1"):
        train.Setup(optimizer=(("learning_rate", -1),))


def test_seed_s_is_the_same_in_any_seed_tuple():
    """Seed s is fold_in(key(seed), s) with task rng [seed, s], whichever tuple holds it:
    a run on (3, 1) is rows 3 and 1 of a run on (0, 1, 2, 3)."""
    import jax

    full, sub = train.seed_keys(7, (0, 1, 2, 3)), train.seed_keys(7, (3, 1))
    np.testing.assert_array_equal(sub, full[np.array([3, 1])])
    np.testing.assert_array_equal(
        sub[0], jax.random.key_data(jax.random.fold_in(jax.random.key(7), 3)))
    t_full, t_sub = train.make_tasks(SETUP, 7, (0, 1, 2, 3)), train.make_tasks(SETUP, 7, (3, 1))
    for a, b in zip(jax.tree.leaves(t_full), jax.tree.leaves(t_sub)):
        np.testing.assert_array_equal(np.asarray(a)[np.array([3, 1])], b)
