"""`sera_jax.objective`: the one allocate -> advantages -> weighted loss path equals the
trainer's, the lab's and the alignment study's former inline chains bit for bit, and traces
under jit + vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import estimators, methods, objective


def _p_hat(num=8, seed=0):
    p = np.random.default_rng(seed).uniform(0.02, 0.98, num).astype(np.float32)
    p[1] = np.nan  # one unseen prompt
    return p


def _rewards(plan, seed=1):
    return np.random.default_rng(seed).binomial(1, 0.4, plan.segment_ids.shape[0]).astype(
        np.float32)


@pytest.mark.parametrize("name", ["sera", "uniform", "sera_no_multiplicity", "grpo",
                                  "knapsack"])
def test_equals_the_trainers_former_host_chain(name):
    method, budget = methods.get_method(name), 8 * 4
    p_hat = _p_hat()
    # The trainer's collect before objective existed (host arrays throughout).
    alloc = method.allocate(jnp.asarray(p_hat), budget, n_min=2, n_max=16, unseen="fill")
    counts = np.asarray(alloc.counts).astype(np.int32)
    prompt_weights = method.prompt_weights(counts, np.asarray(alloc.weights))
    segment_ids = np.asarray(estimators.segment_ids_from_counts(jnp.asarray(counts), budget))

    plan = jax.tree.map(np.asarray, objective.plan_rollouts(
        method, jnp.asarray(p_hat), budget, n_min=2, n_max=16, unseen="fill"))
    np.testing.assert_array_equal(plan.counts, counts)
    np.testing.assert_array_equal(plan.prompt_weights, prompt_weights)
    np.testing.assert_array_equal(plan.segment_ids, segment_ids)
    assert plan.counts.sum() == budget

    rewards = _rewards(plan)
    old_adv = np.asarray(estimators.get_advantage_estimator(method.estimator)(
        rewards, segment_ids, 8))
    old_w = np.asarray(estimators.rollout_weights(prompt_weights, segment_ids))
    adv, w = objective.rollout_coefficients(rewards, plan, method.estimator)
    np.testing.assert_array_equal(np.asarray(adv), old_adv)
    np.testing.assert_array_equal(np.asarray(w), old_w)


def test_ranks_count_each_prompts_rows():
    plan = objective.plan_from_counts(np.array([3, 0, 2], np.int32), np.ones(3), 5)
    np.testing.assert_array_equal(plan.segment_ids, [0, 0, 0, 2, 2])
    np.testing.assert_array_equal(plan.ranks, [0, 1, 2, 0, 1])


def test_surrogate_loss_equals_the_labs_former_loss_and_gradient():
    method, budget, num_p, n0 = methods.get_method("sera"), 32, 8, 4
    plan = objective.plan_rollouts(method, jnp.asarray(_p_hat()), budget, n_min=2, n_max=16)
    rewards = jnp.asarray(_rewards(plan))
    logits = jax.random.normal(jax.random.key(0), (budget,))

    def old(z):  # studies/lab/train._make_step's loss_fn
        adv = estimators.maxrl(rewards, plan.segment_ids, num_p)
        w = estimators.rollout_weights(plan.prompt_weights, plan.segment_ids)
        return estimators.policy_gradient_loss(
            jax.nn.log_sigmoid(z)[:, None], jnp.ones((budget, 1), bool), adv, w,
            aggregation="sequence_mean", num_prompts=num_p, n0=n0, max_len=1)

    def new(z):
        return objective.surrogate_loss(jax.nn.log_sigmoid(z), rewards, plan, estimator="maxrl",
                                        aggregation="sequence_mean", n0=n0)

    for f in (jax.value_and_grad, lambda f: jax.jit(jax.value_and_grad(f))):
        (lo, go), (ln, gn) = f(old)(logits), f(new)(logits)
        assert float(lo) == float(ln) and float(ln) != 0.0
        np.testing.assert_array_equal(np.asarray(go), np.asarray(gn))


def test_traces_under_jit_and_vmap():
    method, budget = methods.get_method("sera"), 32

    def one(p, r):
        plan = objective.plan_rollouts(method, p, budget, n_min=2, n_max=16)
        adv, w = objective.rollout_coefficients(r, plan, "maxrl")
        return plan.counts, jnp.sum(adv * w)

    ps = jnp.stack([jnp.asarray(_p_hat(seed=s)) for s in range(3)])
    rs = jnp.asarray(np.random.default_rng(0).binomial(1, 0.5, (3, budget)), jnp.float32)
    counts, _ = jax.jit(jax.vmap(one))(ps, rs)
    assert counts.shape == (3, 8)
    np.testing.assert_array_equal(np.asarray(counts).sum(axis=1), budget)
    for s in range(3):  # each seed's plan is the eager one
        eager = objective.plan_rollouts(method, ps[s], budget, n_min=2, n_max=16)
        np.testing.assert_array_equal(np.asarray(counts[s]), np.asarray(eager.counts))
