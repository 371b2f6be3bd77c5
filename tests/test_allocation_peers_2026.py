"""The 2026 peers (sera_jax.allocation.peers_2026): VIP, Rollout-GDRO, Pilot-Commit.

Each against a hand-worked example (the expected counts derived in the comments), the
contract as properties (exact budget, bounds, weights N0/N_q) and under jit / vmap; GDRO's
state carried across calls; the one state mechanism (`register(init_state=...)`)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sera_jax import allocation, methods
from sera_jax.allocation import beyond, peers_2026
from sera_jax.allocation.peers_2026 import GdroState, gdro, pilot_commit, vip

PROPS = settings(max_examples=25, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def _contract(a, budget, lo, n_max):
    counts = np.asarray(a.counts)
    assert counts.sum() == budget
    assert counts.min() >= lo and counts.max() <= n_max
    n0 = budget / counts.size
    np.testing.assert_allclose(np.asarray(a.weights), n0 / counts, rtol=1e-6)
    return counts


def test_registered_as_allocators_and_methods():
    for name in ("vip", "gdro", "pilot_commit"):
        assert name in allocation.ALLOCATORS and name in methods.METHODS
        assert methods.get_method(name).allocator == name
    assert methods.get_method("gdro").stateful and not methods.get_method("vip").stateful
    assert methods.get_method("pilot_commit").two_stage and "pilot_commit" in beyond.TWO_STAGE
    assert not (methods.get_method("vip").two_stage or methods.get_method("gdro").two_stage)
    assert methods.get_method("pilot_commit").pilot_size(2) == 2
    assert set(allocation.ALLOCATOR_STATE) == {"gdro"}  # every other allocator is stateless
    assert methods.get_method("vip").init_state() is None
    st0 = methods.get_method("gdro").init_state()
    assert isinstance(st0, GdroState) and st0.variance.shape == (3,)
    assert np.isnan(np.asarray(st0.variance)).all() and np.isnan(float(st0.log_price))


# --------------------------------------------------------------------------------- VIP


def test_vip_hand_worked():
    # p = (.5, .1, .9, 0): v = p(1-p) = (.25, .09, .09, 0); n_min 2, n_max 8, B 16, s = 1.
    # From N = 2 each (8 rollouts), 8 units go to the largest decreases v/((N-1)N):
    #   q0: 2→3 .125, 3→4 .0417, 4→5 .0208, 5→6 .0125 | q1, q2: 2→3 .045, 3→4 .015 | q3: 0.
    # The 8 largest: .125, .045, .045, .0417, .0208, .015, .015, .0125 (next: q0 .0083) ->
    # q0 +4, q1 +2, q2 +2: (6, 4, 4, 2). KKT check: N - 1 = t·√v on q0..q2 with q3 at n_min:
    # 3 + t(.5 + .3 + .3) = 14 -> t = 10 -> N = (6, 4, 4): the continuous optimum is integer.
    a = vip(np.array([0.5, 0.1, 0.9, 0.0]), 16, n_min=2, n_max=8)
    np.testing.assert_array_equal(_contract(a, 16, 2, 8), [6, 4, 4, 2])
    # A bound binds, ties and a zero-variance prompt: p = (.5, .5, .02, 1), n_min 2, n_max 5,
    # B 18 (10 units). q0, q1: 2→3 .125, 3→4 .0417, 4→5 .0208, then at n_max (3 units each,
    # q0 before q1 on every tie: same N, lower index). q2 (v = .0196): 2→3 .0098, 3→4 .0033,
    # 4→5 .0016 (3 units). The 10th unit has only q3 (v = 0) left: (5, 5, 5, 3).
    b = vip(np.array([0.5, 0.5, 0.02, 1.0]), 18, n_min=2, n_max=5)
    np.testing.assert_array_equal(_contract(b, 18, 2, 5), [5, 5, 5, 3])
    # With one unit less (B 17) q3 gets none.
    c = vip(np.array([0.5, 0.5, 0.02, 1.0]), 17, n_min=2, n_max=5)
    np.testing.assert_array_equal(np.asarray(c.counts), [5, 5, 5, 2])


def _vip_objective(p, counts, shift=1):
    return float(np.sum(p * (1 - p) / (np.asarray(counts) - shift)))


@PROPS
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=4), st.integers(2, 3),
       st.integers(0, 3), st.data())
def test_vip_is_the_integer_optimum(p, n_min, width, data):
    """Brute force over every feasible integer vector: VIP attains the minimum variance."""
    p = np.asarray(p, np.float32).astype(np.float64)
    n_max = n_min + width
    num = len(p)
    budget = data.draw(st.integers(num * n_min, num * n_max))
    counts = _contract(vip(p, budget, n_min=n_min, n_max=n_max), budget, n_min, n_max)
    best = min(_vip_objective(p, c) for c in itertools.product(range(n_min, n_max + 1),
                                                               repeat=num)
               if sum(c) == budget)
    assert _vip_objective(p, counts) <= best * (1 + 1e-5) + 1e-12


# --------------------------------------------------------------------------------- GDRO


def test_gdro_hand_worked_two_steps():
    # Edges (.4, .75): bins [0, .4), [.4, .75), [.75, 1]; n_min 2, n_max 8, B 16 (n̄ = 4).
    # Step 1, p = (.1, .5, .6, .9): bins (0, 1, 1, 2); p(1-p) = (.09, .25, .24, .09); bin
    # means (.09, .245, .09) set the fresh EMA. Need √s = (.3, .49497, .49497, .3), mean
    # .397487; first price √μ0 = .397487/4 = .0993719 (log μ0 = -4.61778). Proposal √s/√μ0 =
    # (3.0190, 4.9810, 4.9810, 3.0190), sum 16: floor (3, 4, 4, 3) = 14, the 2 left go to the
    # highest need (q1, q2): (3, 5, 5, 3). Excess 0: the price stays.
    a = gdro(np.array([0.1, 0.5, 0.6, 0.9]), 16, n_min=2, n_max=8)
    np.testing.assert_array_equal(_contract(a, 16, 2, 8), [3, 5, 5, 3])
    np.testing.assert_allclose(np.asarray(a.state.variance), [0.09, 0.245, 0.09], rtol=1e-5)
    np.testing.assert_allclose(float(a.state.log_price), 2 * np.log(0.0993719), rtol=1e-5)
    # Step 2, p = (.2, .3, .5, .8): bins (0, 0, 1, 2); batch bin means (.185, .25, .16); EMA
    # (β .4): (.6·.09 + .4·.185, .6·.245 + .4·.25, .6·.09 + .4·.16) = (.128, .247, .118).
    # Need (.35777, .35777, .49699, .34351); at the carried √μ = .0993719 the proposal is
    # (3.6003, 3.6003, 5.0013, 3.4568), sum 15.659: floor (3, 3, 5, 3) = 14; 2 left: q2
    # (need .497), then q0 (tied with q1 at .358, lower index): (4, 3, 6, 3). Dual step:
    # log μ += 1 · (15.659/4 - 4)/4 = -0.021325.
    b = gdro(np.array([0.2, 0.3, 0.5, 0.8]), 16, n_min=2, n_max=8, state=a.state)
    np.testing.assert_array_equal(_contract(b, 16, 2, 8), [4, 3, 6, 3])
    np.testing.assert_allclose(np.asarray(b.state.variance), [0.128, 0.247, 0.118], rtol=1e-5)
    np.testing.assert_allclose(float(b.state.log_price),
                               float(a.state.log_price) - 0.021325, atol=2e-5)
    # The same batch from a fresh controller: bin means (.185, .25, .16), need (.43012,
    # .43012, .5, .4), mean .440058, proposal 4·need/mean = (3.9096, 3.9096, 4.5448, 3.6359):
    # floor (3, 3, 4, 3) = 13; 3 left to q2, q0, q1: (4, 4, 5, 3). The state matters.
    c = gdro(np.array([0.2, 0.3, 0.5, 0.8]), 16, n_min=2, n_max=8)
    np.testing.assert_array_equal(np.asarray(c.counts), [4, 4, 5, 3])


def test_gdro_state_rules():
    p = np.array([0.5, 0.55, 0.6, 0.7])  # all in bin 1
    a = gdro(p, 16, n_min=2, n_max=8)
    v = np.asarray(a.state.variance)
    assert np.isnan(v[0]) and np.isnan(v[2]) and np.isfinite(v[1])  # unobserved bins: NaN
    # Only unseen prompts: the state does not move (no bin, no price), they get B/P each.
    unseen = gdro(np.full(4, np.nan), 16, n_min=2, n_max=8, state=a.state)
    np.testing.assert_array_equal(np.asarray(unseen.counts), [4, 4, 4, 4])
    for x, y in zip(jax.tree.leaves(unseen.state), jax.tree.leaves(a.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # A price far too low (every proposal at n_max) is raised by the dual step.
    cheap = a.state.replace(log_price=jnp.asarray(-20.0, jnp.float32))
    b = gdro(p, 16, n_min=2, n_max=8, state=cheap)
    _contract(b, 16, 2, 8)
    assert float(b.state.log_price) == pytest.approx(-20.0 + (8 - 4) / 4, abs=1e-5)
    with pytest.raises(ValueError, match="GdroState of 3 bins"):
        gdro(p, 16, n_min=2, n_max=8, state=peers_2026.gdro_state(edges=(0.5,)))
    with pytest.raises(ValueError, match="edges"):
        gdro(p, 16, n_min=2, n_max=8, edges=(0.7, 0.2))
    with pytest.raises(ValueError, match="ema_beta"):
        gdro(p, 16, n_min=2, n_max=8, ema_beta=0.0)


@PROPS
@given(st.sampled_from([3, 5, 8]), st.integers(2, 3), st.integers(0, 6), st.data())
def test_gdro_budget_and_bounds_over_steps(num, n_min, width, data):
    n_max = n_min + width
    state = None
    for _ in range(3):  # the carried state keeps the contract at every step
        p = np.asarray(data.draw(st.lists(st.one_of(st.floats(0.0, 1.0), st.just(np.nan)),
                                          min_size=num, max_size=num)), np.float64)
        budget = data.draw(st.integers(num * n_min, num * n_max))
        a = gdro(p, budget, n_min=n_min, n_max=n_max, state=state)
        _contract(a, budget, n_min, n_max)
        state = a.state


# --------------------------------------------------------------------------------- Pilot-Commit


def test_pilot_commit_hand_worked():
    # Pilot m 2, K¹ = (1, 0, 2, 1): accuracy (.5, 0, 1, .5); keep .125 <= a <= .75 -> q0, q3.
    # n_min 2, n_max 8, B 23: lower bound 2 each (8), commit 15. Kept q0, q3 take up to 6 each
    # (12, equal split: (8, ., ., 8)); the 3 left go to q1, q2 (equal pilot variance 0) one
    # at a time, fewer rollouts first, then lower index: q1, q2, q1 -> (8, 4, 3, 8).
    p = np.full(4, np.nan)  # p̂ is not used (unseen is fine)
    a = pilot_commit(p, 23, n_min=2, n_max=8, pilot_successes=np.array([1, 0, 2, 1]))
    np.testing.assert_array_equal(_contract(a, 23, 2, 8), [8, 4, 3, 8])
    # Pilot m 4, K¹ = (2, 1, 3, 0, 4): accuracy (.5, .25, .75, 0, 1); kept q0, q1, q2 (.75 is
    # in the band), pilot variance (.25, .1875, .1875). Lower bound max(n_min, m) = 4 (20), B
    # 34: commit 14 over three kept prompts: 4 each (12), then 2 more, the higher variance
    # first (q0), then q1 (tied with q2: lower index): (9, 9, 8, 4, 4).
    b = pilot_commit(np.full(5, 0.3), 34, n_min=2, n_max=10, pilot=4,
                     pilot_successes=np.array([2, 1, 3, 0, 4]))
    np.testing.assert_array_equal(_contract(b, 34, 4, 10), [9, 9, 8, 4, 4])
    # Nothing kept: the commit is spread over every prompt, higher pilot variance first.
    c = pilot_commit(np.full(3, 0.5), 9, n_min=2, n_max=8, pilot=2,
                     pilot_successes=np.array([0, 2, 0]))
    np.testing.assert_array_equal(np.asarray(c.counts), [3, 3, 3])


def test_pilot_commit_refuses_a_call_without_its_pilot():
    p = np.full(4, 0.5)
    with pytest.raises(ValueError, match="two-stage"):
        pilot_commit(p, 16, n_min=2, n_max=8)
    with pytest.raises(ValueError, match=r"integers in \[0, pilot=2\]"):
        pilot_commit(p, 16, n_min=2, n_max=8, pilot_successes=np.array([0, 3, 1, 1]))
    with pytest.raises(ValueError, match="needs 20 rollouts"):
        pilot_commit(p, 16, n_min=2, n_max=8, pilot=5, pilot_successes=np.zeros(4, int))
    with pytest.raises(ValueError, match="diversity_lower"):
        pilot_commit(p, 16, n_min=2, n_max=8, pilot_successes=np.zeros(4, int),
                     diversity_lower=1.5)


@PROPS
@given(st.sampled_from([3, 5, 8, 11]), st.integers(2, 3), st.integers(1, 4),
       st.integers(0, 8), st.data())
def test_pilot_commit_budget_and_bounds(num, n_min, m, width, data):
    lo = max(n_min, m)
    n_max = lo + width
    budget = data.draw(st.integers(num * lo, num * n_max))
    k1 = np.asarray(data.draw(st.lists(st.integers(0, m), min_size=num, max_size=num)))
    a = pilot_commit(np.full(num, 0.5), budget, n_min=n_min, n_max=n_max, pilot=m,
                     pilot_successes=k1)
    counts = _contract(a, budget, lo, n_max)
    acc = k1 / m
    kept = (acc >= 0.125) & (acc <= 0.75)
    if kept.any() and (~kept).any():  # kept prompts fill up before any other gets a commit
        assert counts[~kept].max() == lo or counts[kept].min() == n_max


@PROPS
@given(st.sampled_from([3, 8, 12]), st.integers(2, 4), st.integers(0, 12), st.data())
def test_vip_budget_and_bounds(num, n_min, width, data):
    n_max = n_min + width
    p = np.asarray(data.draw(st.lists(st.one_of(st.floats(0.0, 1.0), st.just(np.nan)),
                                      min_size=num, max_size=num)), np.float64)
    budget = data.draw(st.integers(num * n_min, num * n_max))
    _contract(vip(p, budget, n_min=n_min, n_max=n_max), budget, n_min, n_max)


# --------------------------------------------------------------------------------- jit, vmap


def test_jit_and_vmap_match_eager():
    ps = jnp.array([[0.1, 0.5, 0.6, 0.9, 0.3, 0.05], [0.7, 0.2, 0.45, 0.99, 0.5, 0.3]])
    k1 = jnp.array([[0, 1, 2, 1, 1, 0], [2, 0, 1, 2, 1, 1]])
    kw = dict(n_min=2, n_max=10)

    def all_three(p, k, state):
        g = gdro(p, 30, state=state, **kw)
        return (vip(p, 30, **kw), g, pilot_commit(p, 30, pilot_successes=k, **kw))

    st0 = peers_2026.gdro_state()
    batched = jax.jit(jax.vmap(all_three, in_axes=(0, 0, None)))(ps, k1, st0)
    for i in range(2):
        eager = all_three(np.asarray(ps[i]), np.asarray(k1[i]), None)
        for e, b in zip(eager, batched):
            for x, y in zip(jax.tree.leaves(e), jax.tree.leaves(b)):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y)[i], rtol=1e-6)
    # Carried through a jitted scan (the lab's way): every step spends the budget.
    def step(state, p):
        a = gdro(p, 30, state=state, **kw)
        return a.state, a.counts

    final, counts = jax.jit(lambda s: jax.lax.scan(step, s, jnp.concatenate([ps, ps])))(st0)
    assert (np.asarray(counts).sum(-1) == 30).all() and np.isfinite(float(final.log_price))


# --------------------------------------------------------------------------------- methods


def test_methods_weights_and_scales():
    p = np.array([0.1, 0.5, 0.6, 0.9])
    for name in ("vip", "gdro"):
        m = methods.get_method(name)
        a = m.allocate(p, 16, n_min=2, n_max=8)
        np.testing.assert_allclose(m.prompt_weights(np.asarray(a.counts), np.asarray(a.weights)),
                                   4 / np.asarray(a.counts), rtol=1e-6)
    g = methods.get_method("gdro")
    a = g.allocate(p, 16, n_min=2, n_max=8)
    b = g.allocate(np.array([0.2, 0.3, 0.5, 0.8]), 16, n_min=2, n_max=8, state=a.state)
    np.testing.assert_array_equal(np.asarray(b.counts), [4, 3, 6, 3])  # the hand example
    pc = methods.get_method("pilot_commit")
    k1 = np.array([1, 0, 2, 1])
    c = pc.allocate(p, 23, n_min=2, n_max=8, pilot_successes=k1)
    counts = np.asarray(c.counts)
    np.testing.assert_allclose(pc.expected_scale(p, counts, n_min=2, pilot_successes=k1),
                               beyond.conditional_scale(p, k1, 2, counts), rtol=1e-6)
    with pytest.raises(ValueError, match="does not use option"):
        methods.get_method("vip").allocate(p, 16, n_min=2, n_max=8, state=a.state)
    with pytest.raises(ValueError, match="one-shot, stateless allocator"):
        methods.Method("x", "x", "gdro", dynamic_sampling=True)


def test_register_a_stateful_allocator_needs_a_state_parameter():
    with pytest.raises(TypeError, match="no 'state' parameter"):
        allocation.register("stateless_with_init", init_state=lambda **_: None)(
            allocation.uniform)
    assert "stateless_with_init" not in allocation.ALLOCATORS
