"""sera_jax.allocation: the SERA contract, exactness, the paper's reference and the peers.

Every hypothesis example has P <= 8, so the jitted core runs at one padded size (8) and
each static configuration compiles once per session.
"""

import functools
import itertools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sera_jax.allocation import (
    ALLOCATORS,
    Allocation,
    allocate,
    get_allocator,
    hit_utility,
    inverse_p,
    knapsack,
    uniform,
    waterline,
)
from sera_jax.allocation._engine import _core
from sera_jax.allocation._waterline import _A_MAX, _A_MIN

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from published_numpy import allocate_published  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
SPECIAL = [0.0, 1.0, 1e-300, 1e-38, 1e-7, 0.5, 0.75, 1 - 1e-7, 1 - 1e-16]
prob = st.one_of(st.sampled_from(SPECIAL), st.floats(0.0, 1.0))


@st.composite
def instances(draw, p_strategy=prob, max_p=8):
    """(p, budget, n_min, n_max) with a feasible budget."""
    p = np.array(draw(st.lists(p_strategy, min_size=1, max_size=max_p)))
    n_min = draw(st.integers(2, 4))
    n_max = draw(st.integers(n_min, n_min + 24))
    budget = draw(st.integers(len(p) * n_min, len(p) * n_max))
    return p, budget, n_min, n_max


def p32(p):
    """The probabilities the float32 allocator actually sees (subnormals -> 0), in float64."""
    q = np.asarray(p, np.float32)
    return np.where(q < np.finfo(np.float32).tiny, 0.0, q).astype(np.float64)


def kappa_np(p, n, shift=1):
    n = np.asarray(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        k = -np.expm1((n - shift) * np.log1p(-p))
    return np.where(n > shift, k, 0.0)


def level_np(p, n, shift=1):
    """log(N - s) + log λ with the allocator's clamp: κ is increasing in it."""
    with np.errstate(divide="ignore"):
        a = np.clip(np.log(-np.log1p(-p)), _A_MIN, _A_MAX)
    return np.log(np.maximum(n - shift, 1)) + a


def check_contract(alloc, p, budget, n_min, n_max):
    counts = np.asarray(alloc.counts)
    active = np.asarray(alloc.active)
    assert counts.dtype == np.int32 and counts.shape == (len(p),)
    assert counts.sum() == budget
    assert np.all(active == (counts > 0))
    assert np.all((counts[active] >= n_min) & (counts[active] <= n_max))
    n0 = budget / len(p)
    w = np.asarray(alloc.weights)
    np.testing.assert_allclose(w[active] * counts[active], n0, rtol=1e-5)
    assert np.all(w[~active] == 0)
    assert int(alloc.num_active) == active.sum()


def check_exchange(p, counts, n_min, n_max, shift=1):
    """No single rollout moved i -> j (within bounds) raises min(κ_i, κ_j)."""
    pp, n = p32(p), np.asarray(counts)
    act = n > 0
    give = np.flatnonzero(act & (n > n_min))
    take = np.flatnonzero(act & (n < n_max))
    for i in give:
        for j in take:
            if i == j:
                continue
            before = min(kappa_np(pp[i], n[i], shift), kappa_np(pp[j], n[j], shift))
            after = min(kappa_np(pp[i], n[i] - 1, shift), kappa_np(pp[j], n[j] + 1, shift))
            assert after <= before * (1 + 1e-5) + 1e-300, (i, j, n, p)
            # The same in level space, where κ near 1 does not saturate.
            lb = min(level_np(pp[i], n[i], shift), level_np(pp[j], n[j], shift))
            la = min(level_np(pp[i], n[i] - 1, shift), level_np(pp[j], n[j] + 1, shift))
            assert la <= lb + 1e-4 * max(1.0, abs(lb)), (i, j, n, p)


# --------------------------------------------------------------------------- contract


@SETTINGS
@given(instances(), st.sampled_from([("dynamic", "leximin"), ("dynamic", "paper"),
                                     ("equalized", "leximin"), ("equalized", "paper")]))
def test_allocate_contract(inst, mode_rounding):
    p, budget, n_min, n_max = inst
    mode, rounding = mode_rounding
    alloc = allocate(p, budget, n_min=n_min, n_max=n_max, mode=mode, rounding=rounding)
    check_contract(alloc, p, budget, n_min, n_max)
    counts = np.asarray(alloc.counts)
    if mode != "dynamic":
        assert np.all(counts > 0)
    # Diagnostics agree with a float64 recomputation.
    act = counts > 0
    kap = kappa_np(p32(p)[act], counts[act])
    np.testing.assert_allclose(float(alloc.kappa_min), kap.min(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(alloc.kappa_mean), kap.mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(alloc.frac_at_n_min), np.mean(counts[act] == n_min))
    np.testing.assert_allclose(float(alloc.frac_at_n_max), np.mean(counts[act] == n_max))


@SETTINGS
@given(instances(), st.sampled_from(["uniform", "inverse_p", "knapsack", "hit_utility"]))
def test_peers_contract(inst, name):
    p, budget, n_min, n_max = inst
    alloc = get_allocator(name)(p, budget, n_min=n_min, n_max=n_max)
    check_contract(alloc, p, budget, n_min, n_max)
    assert np.all(np.asarray(alloc.active))


@SETTINGS
@given(instances(), st.sampled_from(["equalized", "dynamic"]))
def test_leximin_exchange_optimal(inst, mode):
    p, budget, n_min, n_max = inst
    alloc = allocate(p, budget, n_min=n_min, n_max=n_max, mode=mode)
    check_exchange(p, alloc.counts, n_min, n_max)


@SETTINGS
@given(instances(p_strategy=st.floats(0.05, 0.95)), st.integers(2, 64))
def test_waterline_closed_form_when_slack(inst, n0):
    p = inst[0]
    budget = len(p) * n0
    lam = -np.log1p(-p32(p))
    tau = (budget - len(p)) / np.sum(1 / lam)
    assume(np.all(1 + tau / lam >= 2.0 + 1e-3))  # the lower bound must not bind
    t, kstar, cont = waterline(p, budget, 2, 10**6)
    np.testing.assert_allclose(float(t), tau, rtol=1e-5)
    np.testing.assert_allclose(float(kstar), -np.expm1(-tau), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(cont), 1 + tau / lam, rtol=1e-5)


@SETTINGS
@given(instances())
def test_waterline_exact_with_bounds(inst):
    p, budget, n_min, n_max = inst
    t, kstar, cont = waterline(p, budget, n_min, n_max)
    cont = np.asarray(cont, np.float64)
    np.testing.assert_allclose(cont.sum(), budget, rtol=1e-6)
    assert np.all((cont >= n_min) & (cont <= n_max))
    # Free prompts sit exactly on the waterline: (N - 1) λ = τ (λ clamped as documented).
    lam = np.exp(level_np(p32(p), 2))
    free = (cont > n_min + 1e-3) & (cont < n_max - 1e-3)
    np.testing.assert_allclose((cont[free] - 1) * lam[free], float(t), rtol=1e-4)


def test_waterline_exact_large_batch():
    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 0.3, 4096)
    p[:8] = [0.0, 1.0, 1e-30, 1e-7, 1 - 1e-7, 0.5, 1e-3, 0.999]
    for budget in (4096 * 2, 4096 * 16 + 7, 4096 * 128, 4096 * 512):
        _, _, cont = waterline(p, budget, 2, 512)
        np.testing.assert_allclose(np.sum(np.asarray(cont, np.float64)), budget, rtol=1e-6)


@SETTINGS
@given(instances(), st.data())
def test_monotone_in_p(inst, data):
    p, budget, n_min, n_max = inst
    q = data.draw(st.integers(0, len(p) - 1))
    raised = p.copy()
    raised[q] = data.draw(st.floats(p[q], 1.0))
    base = allocate(p, budget, n_min=n_min, n_max=n_max, mode="equalized")
    up = allocate(raised, budget, n_min=n_min, n_max=n_max, mode="equalized")
    assert int(up.counts[q]) <= int(base.counts[q])
    c0 = np.asarray(waterline(p, budget, n_min, n_max)[2])
    c1 = np.asarray(waterline(raised, budget, n_min, n_max)[2])
    assert c1[q] <= c0[q] * (1 + 1e-5)


# --------------------------------------------------------------------------- brute force


def _enumerate(num, n_min, n_max, budget):
    grid = np.array(list(itertools.product(range(n_min, n_max + 1), repeat=num)))
    return grid[grid.sum(1) == budget]


def _lex_not_worse(ours, best, rtol=1e-5):
    """ours >= best lexicographically, up to float noise (first *clear* difference decides)."""
    for o, b in zip(ours, best):
        if abs(o - b) > rtol * max(abs(o), abs(b)) + 1e-300:
            return o > b
    return True


GRID = [1e-6, 0.05, 0.1, 0.19, 0.25, 0.5, 0.75, 0.9, 0.9375, 0.99, 1 - 1e-6]


def _small_instances():
    rng = np.random.default_rng(1)
    for num in range(1, 5):
        tuples = [rng.choice(GRID, num) for _ in range(6)] + [np.full(num, 0.5)]
        for p in tuples:
            for n_min in (2, 3):
                for n_max in range(n_min, 9):
                    for budget in range(num * n_min, min(20, num * n_max) + 1):
                        yield p, budget, n_min, n_max


def test_leximin_brute_force_all_small_instances():
    cases = list(_small_instances())
    assert len(cases) > 1000
    # One vmapped call of the jitted core over every instance (padded to P = 8).
    pad = np.full((len(cases), 8), 0.5, np.float32)
    for i, (p, *_) in enumerate(cases):
        pad[i, : len(p)] = p
    cols = [np.array([c[k] for c in cases], np.int32) for k in (1, 2, 3)]
    nums = np.array([len(c[0]) for c in cases], np.int32)
    core = functools.partial(_core, threshold=np.float32(0.05), alpha=None, beta=None,
                             rule="equalized", rounding="leximin", shift=1, unseen="fill")
    run = jax.jit(jax.vmap(lambda p, n, b, lo, hi: core(p, n, b, lo, hi).counts))
    counts = np.asarray(run(jnp.asarray(pad), nums, *cols))
    for (p, budget, n_min, n_max), row in zip(cases, counts):
        ours = row[: len(p)]
        assert ours.sum() == budget and ours.min() >= n_min and ours.max() <= n_max
        cands = _enumerate(len(p), n_min, n_max, budget)
        kap = np.sort(kappa_np(p32(p)[None, :], cands), axis=1)
        best = kap[np.lexsort(kap.T[::-1])[-1]]
        mine = np.sort(kappa_np(p32(p), ours))
        assert _lex_not_worse(mine, best), (p, budget, n_min, n_max, ours, mine, best)


# --------------------------------------------------------------------------- paper reference


@pytest.mark.parametrize("seed", range(12))
def test_paper_mode_matches_published_numpy(seed):
    rng = np.random.default_rng(seed)
    num = int(rng.integers(2, 9))
    p = rng.uniform(0.01, 0.99, num).astype(np.float32).astype(np.float64)
    n_max = int(rng.integers(4, 17))
    budget = int(rng.integers(num * 2, num * n_max + 1))
    for mode in ("dynamic", "equalized"):
        ours = allocate(p, budget, n_min=2, n_max=n_max, mode=mode, rounding="paper")
        ref = allocate_published(p, budget, 2, n_max, dynamic=mode == "dynamic")
        np.testing.assert_array_equal(np.asarray(ours.counts), ref)


def _mixed_np(p, n):
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.expm1(np.logaddexp(n * np.log1p(-p), n * np.log(p)))


@pytest.mark.parametrize("seed", range(4))
def test_dynamic_k_is_the_largest_feasible(seed):
    """The predicted-window search returns what bisecting k would: the top-k set (by
    u(p, n_max), ties by index) is feasible and the top-(k+1) set is not. The batches are
    tie-heavy (p drawn from a few values, as success histories give) and large enough
    that the predicted window has several candidates."""
    rng = np.random.default_rng(seed)
    num, n_max, n_min = 256, 64, 2
    values = np.concatenate([rng.beta(0.3, 0.3, 12), [1e-4, 0.999, 0.97, 0.01]])
    p = p32(rng.choice(values, num) if seed % 2 else rng.beta(0.3, 0.3, num))
    budget = num * int(rng.choice([8, 16, 32]))
    alloc = allocate(p, budget, n_min=n_min, n_max=n_max)
    counts = np.asarray(alloc.counts)
    k = int(alloc.num_active)
    order = np.argsort(-_mixed_np(p, n_max), kind="stable")
    np.testing.assert_array_equal(np.sort(np.flatnonzero(counts)), np.sort(order[:k]))
    assert np.all(_mixed_np(p[counts > 0], counts[counts > 0]) >= 0.05 * (1 - 1e-5))
    n_elig = int(np.sum(_mixed_np(p, n_max) >= 0.05))
    if k < max(n_elig, -(-budget // n_max)):
        sub = order[: k + 1]
        bigger = allocate(p[sub], budget, n_min=n_min, n_max=n_max, mode="equalized")
        c = np.asarray(bigger.counts)
        assert np.any(_mixed_np(p[sub], c) < 0.05), "top-(k+1) is feasible: k not largest"


def test_dynamic_drops_degenerate_prompts():
    p = np.array([0.0, 1.0, 0.3, 0.6, 1e-9, 0.5, 0.999999, 0.2])
    alloc = allocate(p, 8 * 16, n_min=2, n_max=64)
    counts = np.asarray(alloc.counts)
    assert np.all(counts[[0, 1, 4, 6]] == 0)  # u(p, n_max) < θ: no rollouts
    u = 1 - (1 - p) ** counts - p**counts
    assert np.all(u[counts > 0] >= 0.05)
    # Few eligible prompts cannot absorb the budget: k falls back to ceil(B / n_max).
    alloc = allocate(np.array([0.0, 1.0, 0.5, 1.0]), 4 * 8, n_min=2, n_max=8)
    assert int(alloc.num_active) == 4 and int(alloc.counts.sum()) == 32


# --------------------------------------------------------------------------- unseen prompts


@SETTINGS
@given(instances(), st.lists(st.booleans(), min_size=8, max_size=8))
def test_unseen_fill_equalises_the_rest(inst, hide):
    p, budget, n_min, n_max = inst
    hide = np.array(hide[: len(p)])
    assume(hide.any())
    q = p.copy()
    q[hide] = np.nan
    alloc = allocate(q, budget, n_min=n_min, n_max=n_max, mode="equalized")
    check_contract(alloc, q, budget, n_min, n_max)
    counts = np.asarray(alloc.counts)
    n0 = budget / len(p)
    assert np.all((counts[hide] >= np.floor(n0)) & (counts[hide] <= np.ceil(n0)))
    if (~hide).any():
        rest = allocate(p[~hide], int(budget - counts[hide].sum()), n_min=n_min, n_max=n_max,
                        mode="equalized")
        np.testing.assert_array_equal(counts[~hide], np.asarray(rest.counts))


def test_unseen_fallback_is_whole_batch_uniform():
    p = np.array([0.1, np.nan, 0.9, 0.5, 1e-4])
    alloc = allocate(p, 5 * 10 + 3, n_min=2, n_max=64, unseen="fallback")
    np.testing.assert_array_equal(np.asarray(alloc.counts), [11, 11, 11, 10, 10])
    seen = np.array([0.1, 0.2, 0.9, 0.5, 1e-4])
    a = allocate(seen, 53, n_min=2, n_max=64, unseen="fallback")
    b = allocate(seen, 53, n_min=2, n_max=64)
    np.testing.assert_array_equal(np.asarray(a.counts), np.asarray(b.counts))
    everything_unseen = allocate(np.full(4, np.nan), 4 * 9, n_min=2, n_max=64)
    np.testing.assert_array_equal(np.asarray(everything_unseen.counts), [9, 9, 9, 9])


# --------------------------------------------------------------------------- peers


def _dp_best(values):
    """max Σ_q values[q][N_q - n_min] s.t. Σ N_q = B: the published DP over the budget."""
    best = {0: 0.0}
    for row in values:
        nxt = {}
        for used, v in best.items():
            for j, x in enumerate(row):
                nxt[used + j] = max(nxt.get(used + j, -np.inf), v + x)
        best = nxt
    return best


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_and_hit_utility_match_dynamic_programme(seed):
    rng = np.random.default_rng(seed)
    num, n_min, n_max = int(rng.integers(1, 5)), 2, int(rng.integers(3, 12))
    p = p32(rng.beta(0.5, 0.5, num))
    budget = int(rng.integers(num * n_min, num * n_max + 1))
    ns = np.arange(n_min, n_max + 1)
    ks = (budget - num * n_min)
    value = (1 - p[:, None] ** ns - (1 - p[:, None]) ** ns) * (p * (1 - p) ** 2)[:, None]
    counts = np.asarray(knapsack(p, budget, n_min=n_min, n_max=n_max).counts)
    ours = value[np.arange(num), counts - n_min].sum()
    np.testing.assert_allclose(ours, _dp_best(value)[ks], rtol=1e-5, atol=1e-12)

    alpha, beta = rng.uniform(0.3, 5, num), rng.uniform(0.3, 5, num)
    from scipy.special import betaln  # scipy ships with scikit-learn
    hit = 1 - np.exp(betaln(alpha[:, None], beta[:, None] + ns) - betaln(alpha, beta)[:, None])
    counts = np.asarray(hit_utility(p, budget, n_min=n_min, n_max=n_max, alpha=alpha,
                                    beta=beta).counts)
    ours = hit[np.arange(num), counts - n_min].sum()
    np.testing.assert_allclose(ours, _dp_best(hit)[ks], rtol=1e-5)


def test_inverse_p_formula_when_slack():
    p = np.array([0.05, 0.1, 0.2, 0.4, 0.8, 0.3])
    budget = 6 * 40
    cont = 1 + (budget - 6) * (1 / p32(p)) / np.sum(1 / p32(p))
    counts = np.asarray(inverse_p(p, budget, n_min=2, n_max=1000).counts)
    floor = np.floor(cont).astype(int)
    extra = np.argsort(-(cont - floor), kind="stable")[: budget - floor.sum()]
    floor[extra] += 1
    np.testing.assert_array_equal(counts, floor)
    # p = 0 is the hardest prompt: it gets n_max.
    assert int(inverse_p(np.array([0.0, 0.5, 0.9]), 30, n_min=2, n_max=20).counts[0]) == 20


def test_uniform_and_registry():
    alloc = uniform(np.linspace(0, 1, 7), 7 * 5 + 2, n_min=2, n_max=9)
    np.testing.assert_array_equal(np.asarray(alloc.counts), [6, 6, 5, 5, 5, 5, 5])
    assert set(ALLOCATORS) >= {"sera", "uniform", "inverse_p", "knapsack", "hit_utility"}
    for name, fn in ALLOCATORS.items():
        assert get_allocator(name) is fn
    with pytest.raises(ValueError, match="valid names"):
        get_allocator("sera2")


def test_sera_has_no_uniform_mode():
    """B/P each is the uniform allocator's job alone; the old mode names its new home."""
    with pytest.raises(ValueError, match="'uniform' allocator"):
        allocate(np.full(4, 0.5), 16, n_min=2, n_max=8, mode="uniform")


# --------------------------------------------------------------------------- numerics, jit


def test_numerical_extremes_float32():
    p = np.array([0.0, 1e-300, 1e-45, 1e-7, 0.5, 1 - 1e-7, 1 - 1e-16, 1.0])
    alloc = allocate(p, 8 * 20, n_min=2, n_max=40, mode="equalized")
    counts = np.asarray(alloc.counts)
    assert counts.sum() == 160 and np.all(np.isfinite(np.asarray(alloc.weights)))
    assert list(counts[:3]) == [40, 40, 40]  # p -> 0: n_max first
    assert list(counts[-3:]) == [2, 2, 2]  # p -> 1: n_min
    assert np.isfinite(float(alloc.kappa_mean))


def test_numerical_extremes_float64():
    with jax.enable_x64(True):
        p = np.array([1e-300, 1e-200, 1e-10, 0.5, 1 - 1e-16, 1.0, 0.9, 1e-3])
        tau, kstar, cont = waterline(p, 8 * 80, 2, 256)
        cont = np.asarray(cont)
        assert cont.dtype == np.float64 and np.isfinite(float(tau)) and float(tau) > 0
        np.testing.assert_allclose(cont.sum(), 640, rtol=1e-12)
        assert cont[0] == 256 and cont[1] == 256 and cont[4] == 2 and cont[5] == 2
        assert float(kstar) == pytest.approx(-np.expm1(-float(tau)))


def test_allocate_under_jit_and_is_pytree():
    p = jnp.array([0.1, 0.4, 0.9, 0.02])
    eager = allocate(p, 40, n_min=2, n_max=20, mode="equalized")
    jitted = jax.jit(lambda q: allocate(q, 40, n_min=2, n_max=20, mode="equalized"))(p)
    assert isinstance(jitted, Allocation)
    for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert len(jax.tree.leaves(eager)) == 10


@pytest.mark.slow
def test_million_prompts():
    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 0.3, 1 << 20)
    alloc = allocate(p, (1 << 20) * 128, n_min=2, n_max=512)
    assert int(alloc.counts.sum()) == (1 << 20) * 128


# --------------------------------------------------------------------------- int32 range
# Counts are int32; sums over the batch (units below a level, n_max · #prompts at n_max)
# reach P·n_max, which passes 2**31 long before the budget does. The budget identity must
# hold for every accepted input of every allocator.

INT32_MAX = 2**31 - 1
RULES = [("sera", dict(mode=m, rounding=r)) for m in ("dynamic", "equalized")
         for r in ("leximin", "paper")] + [
    (name, {}) for name in ("uniform", "inverse_p", "knapsack", "hit_utility")]
RULE_IDS = [f"{n}-{'-'.join(o.values())}" if o else n for n, o in RULES]
P8 = np.array([0.0, 1e-12, 1e-6, 0.02, 0.3, 0.5, 0.97, 1.0])
WIDE = {  # all of P = 8 without NaN: one compilation per rule and float width
    # P·n_max = 1.7e10, a budget 10**7 times smaller: n_max far above any count.
    "n_max_far_above_budget": (P8, 8 * 16, 2, INT32_MAX),
    # Every sum of counts is near 2**31: the budget at the int32 limit.
    "budget_at_int32_limit": (P8, INT32_MAX, 2, INT32_MAX),
    # One prompt (p = 0) takes almost all of it, the others (p = 1) stay at n_min.
    "budget_near_limit_one_prompt": (np.array([0.0] + [1.0] * 7), INT32_MAX - 1000, 2,
                                     INT32_MAX),
    "budget_near_limit_uneven": (np.array([1e-6, 0.5, 0.999, 0.3, 0.3, 1.0, 0.9, 0.02]),
                                 INT32_MAX - 7, 3, 2**31 - 2),
    # P·n_max just past 2**31 with a budget far below it.
    "p_n_max_just_past": (P8, 8 * 1000, 2, 2**28 + 1),
}


@pytest.mark.parametrize("x64", [False, True], ids=["f32", "x64"])
@pytest.mark.parametrize(("name", "options"), RULES, ids=RULE_IDS)
def test_budget_identity_past_int32(name, options, x64):
    with jax.enable_x64(x64):
        for case, (p, budget, n_min, n_max) in WIDE.items():
            alloc = get_allocator(name)(p, budget, n_min=n_min, n_max=n_max, **options)
            assert int(np.asarray(alloc.counts, np.int64).sum()) == budget, case
            check_contract(alloc, p, budget, n_min, n_max)


@st.composite
def wide_instances(draw):
    """(p, budget, n_min, n_max) with P·n_max > 2**31; budgets anywhere up to the limit."""
    p = np.array(draw(st.lists(prob, min_size=1, max_size=8)))
    n_min = draw(st.integers(2, 4))
    past = min(2**31 // len(p) + 1, INT32_MAX)  # P·n_max > 2**31 (but for P = 1)
    n_max = draw(st.one_of(st.just(INT32_MAX), st.integers(past, INT32_MAX)))
    top = min(len(p) * n_max, INT32_MAX)
    budget = draw(st.one_of(st.integers(len(p) * n_min, len(p) * n_min + 64),
                            st.integers(len(p) * n_min, top), st.integers(top - 64, top)))
    return p, budget, n_min, n_max


@settings(SETTINGS, max_examples=12)
@given(inst=wide_instances())
@pytest.mark.parametrize(("name", "options"), RULES, ids=RULE_IDS)
def test_budget_identity_property_past_int32(name, options, inst):
    p, budget, n_min, n_max = inst
    alloc = get_allocator(name)(p, budget, n_min=n_min, n_max=n_max, **options)
    check_contract(alloc, p, budget, n_min, n_max)


def test_budget_identity_large_batch_past_int32():
    # `experiments.allocation_demo --num_prompts=65536 --n0=128 --n_max=65536`: the counts
    # summed to 4,224,909,312 for a budget of 8,388,608.
    p = np.random.default_rng(0).beta(0.3, 0.3, 1 << 16)
    alloc = allocate(p, 128 << 16, n_min=2, n_max=1 << 16)
    check_contract(alloc, p, 128 << 16, 2, 1 << 16)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "options"), RULES, ids=RULE_IDS)
def test_budget_identity_million_prompts_past_int32(name, options):
    # The example: P·n_max = 4.1e9; the counts summed to 3,942,178,816.
    p = np.random.default_rng(0).beta(0.3, 0.3, 10**6)
    alloc = get_allocator(name)(p, 8_000_000, n_min=2, n_max=4096, **options)
    check_contract(alloc, p, 8_000_000, 2, 4096)


# --------------------------------------------------------------------------- bad input

OK = dict(n_min=2, n_max=8)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: allocate([0.1, np.nan], 8, unseen="error", **OK), "NaN"),
        (lambda: waterline([0.1, np.nan], 8, 2, 8), "NaN"),
        (lambda: allocate([0.1, -0.2], 8, **OK), r"p must lie in \[0, 1\].*-0.2"),
        (lambda: allocate([0.1, 1.5], 8, **OK), r"\[0, 1\]"),
        (lambda: allocate([0.1, np.inf], 8, **OK), r"\[0, 1\]"),
        (lambda: allocate([0.1, 0.2], 8.0, **OK), "budget must be an integer"),
        (lambda: allocate([0.1, 0.2], True, **OK), "budget must be an integer"),
        (lambda: allocate([0.1, 0.2], 3, **OK), r"budget must be in \[P\*n_min.*\[4, 16\]"),
        (lambda: allocate([0.1, 0.2], 17, **OK), r"\[4, 16\]"),
        (lambda: allocate([0.1, 0.2], 8, n_min=5, n_max=4), "n_min must be <= n_max"),
        (lambda: allocate([0.1, 0.2], 8, n_min=1, n_max=8), "n_min must be >= 2 with shift=1"),
        (lambda: allocate([0.1, 0.2], 8, n_min=0, n_max=8, shift=0), ">= 1 with shift=0"),
        (lambda: allocate([], 0, **OK), "empty"),
        (lambda: allocate([[0.1, 0.2]], 8, **OK), "1-D"),
        (lambda: allocate([0.1, 0.2], 8, mode="greedy", **OK), "mode must be one of"),
        (lambda: allocate([0.1, 0.2], 8, rounding="nearest", **OK), "rounding must be"),
        (lambda: allocate([0.1, 0.2], 8, unseen="skip", **OK), "unseen must be one of"),
        (lambda: allocate([0.1, 0.2], 8, threshold=1.5, **OK), r"threshold must be in \[0, 1\]"),
        (lambda: allocate([0.1, 0.2], 8, shift=2, **OK), "shift must be 0"),
        (lambda: allocate([0.1, 0.2], 2**40, n_min=2, n_max=2**30), "budget must be in"),
        (lambda: hit_utility([0.1, 0.2], 8, alpha=[1.0, 1.0], **OK), "together"),
        (lambda: hit_utility([0.1, 0.2], 8, alpha=[1.0, 0.0], beta=[1, 1], **OK), "> 0"),
        (lambda: inverse_p([0.1, 0.2], 4, n_min=1, n_max=8, shift=0), "inverse_p needs"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
