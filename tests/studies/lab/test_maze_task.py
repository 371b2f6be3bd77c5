"""The maze task family: exact p by DP agrees with Monte Carlo rollouts of the same policy,
∇ log p by autodiff through the DP agrees with finite differences, and it trains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import methods
from sera_jax.studies.lab import maze_task, train

CFG = dict(maze_size=4, maze_openings=0.2, horizon=8, min_path=2, init_blocked=-1.0,
           num_train=8, num_test=8)


@pytest.fixture(scope="module")
def split():
    return maze_task.make_split(np.random.default_rng(3), CFG, 6)


def test_mazes_are_connected_and_paths_fit_the_horizon(split):
    rng = np.random.default_rng(0)
    for _ in range(5):
        open_ = maze_task.random_maze(rng, 5, 0.0)
        assert (maze_task._distances(open_, 5, 0) >= 0).all()  # spanning tree: all reachable
        assert open_.sum() == 2 * (25 - 1)  # a tree: C − 1 passages, each seen from both sides
    assert ((split.length >= 2) & (split.length <= 8)).all()
    assert (split.nxt[np.arange(6), split.goal] == split.goal[:, None]).all()  # absorbing


def test_dp_p_matches_monte_carlo(split):
    """p by DP vs the success rate of 40,000 sampled rollouts per prompt (same sampler as
    training), within 4 standard errors; and a policy that learned (w toward the goal) has a
    much larger p than the initial one, so the check is not only about p ≈ 0."""
    w = np.zeros(len(maze_task.FEATURES), np.float32)
    w[[0, 1, 2, 3, 4, 5]] = [-2.0, 1.0, 1.0, -0.5, -1.0, 2.0]
    params = {"linear": jnp.asarray(w)}
    p = np.asarray(maze_task.success_probs(params, split))
    p0 = np.asarray(maze_task.success_probs(maze_task.init_params(None, CFG), split))
    assert (p > p0).all() and p.mean() > 0.2 and p0.min() > 0
    n = 40_000
    lp = maze_task.log_policy(params, split)
    x = jnp.repeat(jnp.arange(6), n)
    u = jax.random.uniform(jax.random.key(0), (6 * n, CFG["horizon"]))
    (_, _, live), r = jax.jit(maze_task.sample)(lp, split, x, u)
    rate = np.asarray(r).reshape(6, n).mean(1)
    se = np.sqrt(p * (1 - p) / n)
    np.testing.assert_array_less(np.abs(rate - p), 4 * se + 1e-9)
    # A success is absorbed: it stays live for exactly as many moves as it took.
    assert (np.asarray(live).sum(1)[np.asarray(r) == 1] >= 2).all()


def test_log_p_gradient_matches_finite_differences(split):
    w = np.linspace(-1.0, 1.0, len(maze_task.FEATURES))
    with jax.enable_x64():
        task = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a,
                            split)
        f = lambda v: jnp.mean(maze_task.log_success_probs({"linear": v}, task))
        g = np.asarray(jax.grad(f)(jnp.asarray(w)))
        eps = 1e-6
        fd = np.array([(f(jnp.asarray(w + eps * e)) - f(jnp.asarray(w - eps * e))) / (2 * eps)
                       for e in np.eye(w.size)])
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)
    assert np.abs(g).max() > 1e-2


def test_rollout_logprob_is_the_trajectory_likelihood(split):
    """Σ_t live·log π(m_t | c_t) of a sampled rollout = log of the product of the move
    probabilities along its path (recomputed by walking the maze on the host)."""
    params = maze_task.init_params(None, CFG)
    lp = maze_task.log_policy(params, split)
    x = jnp.arange(6)
    u = jax.random.uniform(jax.random.key(1), (6, CFG["horizon"]))
    acts, _ = maze_task.sample(lp, split, x, u)
    tok, mask = maze_task.rollout_logprobs(params, split, x, acts)
    cells, moves, _ = (np.asarray(a) for a in acts)
    pi, nxt = np.exp(np.asarray(lp)), np.asarray(split.nxt)
    for r in range(6):
        c, total = int(split.start[r]), 0.0
        for t in range(CFG["horizon"]):
            if c == int(split.goal[r]):
                break
            assert cells[r, t] == c
            total += np.log(pi[r, c, moves[r, t]])
            c = nxt[r, c, moves[r, t]]
        assert float(np.asarray(tok)[r].sum()) == pytest.approx(total, rel=1e-5)


def test_the_maze_family_trains_in_the_lab():
    """uniform on the maze family: budget exact, p rises on train and held-out prompts."""
    setup = train.Setup(family="maze", maze_size=4, horizon=8, num_train=8, num_test=8,
                        prompts_per_step=4, n0=4, n_min=2, n_max=8, num_steps=8, eval_every=4,
                        optimizer=(("learning_rate", 0.2),), ks=(1, 8),
                        aggregation="seq_mean_token_sum_norm")
    seeds = (0, 1)
    run = train.Runner(methods.get_method("sera"), setup)(
        train.seed_keys(0, seeds), train.make_tasks(setup, 0, seeds))
    assert (run["counts"].sum(-1) == setup.budget).all()
    mp = run["mean_p"]
    assert (mp[:, -1] > mp[:, 0]).all()
    assert np.isfinite(run["pass_at_k"]).all()  # p ≤ 1 despite rounding in the DP
