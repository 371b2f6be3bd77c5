"""The lab's task: exact p and the exact likelihood gradient against sampling and finite
differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from sera_jax import metrics
from sera_jax.studies.lab import task
from sera_jax.studies.lab import train as train_lib

CFG = dict(num_train=6, num_test=4, num_answers=5, feature_dim=3, num_skills=2, max_correct=2,
           p_floor=1e-6, base_logit_scale=1.0, scorer="mlp", mlp_width=4)


def _trained_params(cfg, seed=0):
    """Non-zero parameters (a policy away from the initial one)."""
    rng = np.random.default_rng(seed)
    params = task.init_params(rng, cfg)
    return jax.tree.map(lambda x: x + 0.7 * jnp.asarray(rng.standard_normal(x.shape),
                                                        jnp.float32), params)


def test_initial_policy_has_the_drawn_difficulty():
    rng = np.random.default_rng(1)
    law = task.difficulty_array("maze")
    train, test = task.make_task(rng, law, CFG)
    params = task.init_params(rng, CFG)
    np.testing.assert_allclose(task.success_probs(params, train), train.p0, rtol=1e-4)
    np.testing.assert_allclose(task.success_probs(params, test), test.p0, rtol=1e-4)
    assert train.correct.sum(1).min() >= 1 and train.correct.sum(1).max() <= 2


def test_exact_p_matches_sampling():
    rng = np.random.default_rng(2)
    train, _ = task.make_task(rng, task.difficulty_array("uniform"), CFG)
    params = _trained_params(CFG)
    p = np.asarray(task.success_probs(params, train))
    n = 40_000
    log_pi = task.log_policy(params, train)
    u = jax.random.uniform(jax.random.key(0), (train.num_prompts, n))
    answers = jax.vmap(task.sample_answers)(jnp.broadcast_to(log_pi[:, None], (6, n, 5)), u)
    hits = np.take_along_axis(np.asarray(train.correct), np.asarray(answers), 1).mean(1)
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(hits - p) < 4.5 * se + 1e-4), (hits, p)


def test_exact_gradient_matches_finite_differences():
    rng = np.random.default_rng(3)
    train, _ = task.make_task(rng, task.difficulty_array("imagenet"), CFG)
    with jax.enable_x64(True):
        params = jax.tree.map(lambda x: x.astype(jnp.float64), _trained_params(CFG))
        tr = jax.tree.map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x,
                          train)
        ids = jnp.array([0, 2, 5])
        g = train_lib.exact_gradient("answers", params, tr, ids)
        flat, unravel = ravel_pytree(params)
        f = lambda v: float(jnp.mean(task.log_success_probs(unravel(v), tr)[ids]))
        h = 1e-6
        fd = np.array([(f(flat + h * e) - f(flat - h * e)) / (2 * h)
                       for e in np.eye(flat.size)])
        np.testing.assert_allclose(ravel_pytree(g)[0], fd, rtol=1e-5,
                                   atol=1e-7)


def test_exact_gradient_is_the_mean_score_of_successes():
    """∇ log p = E[∇ log π(a) | a correct] (SERA_SPEC §1), by Monte Carlo."""
    rng = np.random.default_rng(4)
    train, _ = task.make_task(rng, task.difficulty_array("uniform"), CFG)
    params = _trained_params(CFG, 1)
    x = 3
    n = 20_000
    log_pi = task.log_policy(params, train)
    answers = task.sample_answers(jnp.broadcast_to(log_pi[x], (n, 5)),
                                  jax.random.uniform(jax.random.key(1), (n,)))
    score = jax.vmap(lambda a: jax.grad(lambda q: task.log_policy(q, train)[x, a])(params))(
        answers)
    ok = np.asarray(train.correct[x, answers])
    mc = jax.tree.map(lambda s: np.asarray(s)[ok].mean(0), score)
    sd = jax.tree.map(lambda s: np.asarray(s)[ok].std(0) / np.sqrt(ok.sum()), score)
    exact = train_lib.exact_gradient("answers", params, train, jnp.array([x]))
    for m, e, s in zip(jax.tree.leaves(mc), jax.tree.leaves(exact), jax.tree.leaves(sd)):
        assert np.all(np.abs(m - np.asarray(e)) < 4.5 * s + 1e-5)


def test_analytic_pass_at_k_is_the_metrics_one():
    p = jnp.array([1e-5, 0.03, 0.5, 0.99])
    ks = (1, 8, 1024)
    np.testing.assert_allclose(task.analytic_pass_at_k(p, ks),
                               [metrics.analytic_pass_at_k(np.asarray(p, np.float64), k).mean()
                                for k in ks], rtol=1e-5)


def test_difficulty_validation():
    with pytest.raises(ValueError, match="valid names"):
        task.difficulty_array("mazes")
    with pytest.raises(ValueError, match="> 0"):
        task.difficulty_array(((1.0, -1.0, 2.0),))
    law = task.difficulty_array(((2.0, 1.0, 1.0), (2.0, 3.0, 1.0)))
    np.testing.assert_allclose(law[:2, 0], [0.5, 0.5])
    assert law[2:, 0].sum() == 0
