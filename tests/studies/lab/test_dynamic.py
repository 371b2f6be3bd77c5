"""DAPO dynamic sampling in the lab (`lab.dynamic`): the traced packing is the host reference
(`sera_jax.dynamic_sampling.fill` + `select`) field by field, rounds after the batch is filled
could add nothing (so not drawing them is exact), one round on an all-informative batch is
the allocator alone, and the study reports the methods at matched generation."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax import dynamic_sampling as ds
from sera_jax import history as history_lib
from sera_jax import methods, optim
from sera_jax.config_files import get_config
from sera_jax.studies import compare
from sera_jax.studies.lab import cells, dynamic, study, train
from tests.studies.lab.test_study import _tiny

R, P, N0 = 3, 4, 4  # rounds, groups per round, rows per group on average
B = P * N0


def _rounds(layout: str, rng: np.random.Generator, n: int):
    """n draws of R rounds (segment ids [n, R, B], rewards [n, R, B]) and their min_group."""
    if layout == "uniform":  # N0 rows per group, contiguous (the uniform allocator)
        seg = np.broadcast_to(np.repeat(np.arange(P), N0), (n, R, B))
        mg = N0
    elif layout == "ragged":  # counts in {0} ∪ [2, 8] summing to B, contiguous (SERA's)
        seg = np.empty((n, R, B), np.int64)
        for idx in np.ndindex(n, R):
            while True:
                c = rng.choice([0, 2, 3, 4, 5, 6, 8], P)
                if c.sum() == B:
                    break
            seg[idx] = np.repeat(np.arange(P), c)
        mg = 2
    else:  # any group of any row: `select` does not need contiguous groups
        seg = rng.integers(0, P, (n, R, B))
        mg = 1
    p = rng.choice([0.0, 0.05, 0.3, 0.9, 1.0], (n, R, P))
    p = np.where(rng.random((n, 1, 1)) < 0.5, 0.5, p)  # half the draws: mostly mixed groups
    rew = (rng.random((n, R, B)) < np.take_along_axis(p, seg, axis=2)).astype(np.float32)
    return np.ascontiguousarray(seg), rew, mg


@pytest.mark.parametrize("layout", ["uniform", "ragged", "scattered"])
def test_pack_is_fill_and_select(layout):
    rng = np.random.default_rng(["uniform", "ragged", "scattered"].index(layout))
    seg, rew, mg = _rounds(layout, rng, 200)
    pk = jax.jit(jax.vmap(lambda s, r: dynamic.pack(s, r, P, B, mg)))(seg, rew)
    pk = jax.tree.map(np.asarray, pk)
    rounds_seen = set()
    for d in range(seg.shape[0]):
        rounds = [ds.Round(seg[d, i], rew[d, i], np.ones(B, int), P) for i in range(R)]
        drawn, sel = ds.fill(rounds.__getitem__, B, R, mg)
        np.testing.assert_array_equal(pk.rows[d], sel.rows)
        np.testing.assert_array_equal(pk.keep[d], sel.keep)
        np.testing.assert_array_equal(pk.group[d], sel.group)
        got = (pk.num_kept[d], pk.num_dropped[d], pk.rounds[d], pk.generated[d])
        assert got == (sel.num_kept, sel.num_dropped, sel.rounds, sel.generated_rollouts)
        assert sel.generated_rollouts == len(drawn) * B  # the generation count is fill's
        np.testing.assert_array_equal(pk.drawn[d], np.arange(R) < len(drawn))
        inf = [ds.informative_groups(seg[d, i], rew[d, i], P) for i in range(R)]
        np.testing.assert_array_equal(pk.informative[d], inf)
        assert pk.taken[d].sum() == sel.num_kept and not (pk.taken[d] & ~pk.informative[d]).any()
        if layout != "scattered":  # every group >= min_group: undrawn rounds add nothing
            full = ds.select(rounds, B)
            assert (full.num_kept, full.padding_rows) == (sel.num_kept, sel.padding_rows)
            np.testing.assert_array_equal(full.rows, sel.rows)
        rounds_seen.add(len(drawn))
    assert rounds_seen == {1, 2, 3}  # the draws exercise early stops and max_rounds


SETUP = train.Setup(num_train=8, num_test=8, num_answers=6, feature_dim=4, num_skills=2,
                    prompts_per_step=P, n0=N0, n_min=2, n_max=8, num_steps=2, eval_every=2,
                    optimizer=(("learning_rate", 0.1),), ks=(1, 4), max_rounds=1)


def _carry(setup, tx, params):
    h = history_lib.SuccessHistory.create(setup.num_train, setup.history_alpha,
                                          setup.history_beta, setup.history_gamma)
    return params, tx.init(params), h


def test_one_round_on_an_informative_batch_is_the_allocator_alone():
    """dapo with max_rounds = 1 where every group of the step's batch is mixed: the same
    update, optimiser state and history as uniform (bit for bit) and the same diagnostics; a
    step with an all-equal group pads."""
    tr, _, params = jax.tree.map(lambda x: x[0], train.make_tasks(SETUP, 0, (0,), "uniform"))
    params = {"linear": jnp.linspace(-0.3, 0.3, params["linear"].shape[0])}
    tx = optim.make_optimizer(dict(SETUP.optimizer))
    key = train.seed_keys(0, (0,))[0]
    k_data, k_roll = jax.random.split(jax.random.wrap_key_data(key))
    steps = {n: jax.jit(train._make_step(methods.get_method(n), SETUP, tx))
             for n in ("uniform", "dapo")}
    carry = _carry(SETUP, tx, params)
    mixed = train.STEP_METRICS.index("mixed_frac")
    checked = padded = 0
    for t in range(12):
        (c_u, (row_u, n_u)), (c_d, (row_d, n_d)) = (
            steps[n](carry, jnp.int32(t), tr, k_data, k_roll) for n in ("uniform", "dapo"))
        if row_u[mixed] == 1.0:
            for a, b in zip(jax.tree.leaves(c_u), jax.tree.leaves(c_d)):
                np.testing.assert_array_equal(a, b)
            # The loss value may differ in its last bit (another fusion); its gradient not.
            np.testing.assert_allclose(row_u, row_d, rtol=1e-6)  # generated = B for both
            np.testing.assert_array_equal(n_u, n_d)
            checked += 1
        else:  # DAPO without refill: the all-equal groups become padding rows
            assert row_d[train.STEP_METRICS.index("active_frac")] < 1.0
            assert row_d[train.STEP_METRICS.index("generated")] == B
            padded += 1
    assert checked >= 2 and padded >= 1


def test_maze_family_step_counts_every_generated_rollout():
    """dapo on the maze-policy family, up to 3 rounds: generated = rounds × B, the history
    gets every generated rollout (kept or not) and no other, the kept rows are informative
    groups (mixed_frac > 0 whenever a row is kept). (sera_dapo on the maze family compiles
    for ~90 CPU-s: checked by hand, not here.)"""
    setup = SETUP.with_(family="maze", maze_size=3, horizon=4, max_rounds=3,
                        aggregation="seq_mean_token_sum_norm")
    tr, _, params = jax.tree.map(lambda x: x[0], train.make_tasks(setup, 0, (0,), "maze"))
    tx = optim.make_optimizer(dict(setup.optimizer))
    k_data, k_roll = jax.random.split(jax.random.wrap_key_data(train.seed_keys(0, (0,))[0]))
    step = jax.jit(train._make_step(methods.get_method("dapo"), setup, tx))
    carry = _carry(setup, tx, params)
    col = {n: train.STEP_METRICS.index(n) for n in ("generated", "active_frac", "mixed_frac",
                                                    "loss")}
    seen, total = set(), 0.0
    for t in range(6):
        carry, (row, counts) = step(carry, jnp.int32(t), tr, k_data, k_roll)
        gen = float(row[col["generated"]])
        # Pending outcomes are folded in (and cleared) at each epoch start.
        total = gen if t % setup.steps_per_epoch == 0 else total + gen
        assert float(jnp.sum(carry[2].pending_successes + carry[2].pending_failures)) == total
        seen.add(int(gen) // B)
        assert gen in (B, 2 * B, 3 * B) and int(counts.sum()) == B
        assert np.isfinite(row[col["loss"]])
        assert (row[col["active_frac"]] > 0) <= (row[col["mixed_frac"]] > 0)
    assert max(seen) > 1  # some step refilled


# Slow: three more lab programs; the DAPO step and `cells.report_matched`'s inputs are tested
# above in the fast suite.
@pytest.mark.slow
def test_study_reports_dapo_at_matched_generation(tmp_path):
    """dapo and sera_dapo end to end (answer task; the maze family's step: above): the
    matched-generation table (numbers: `cells.report_matched`), generated = rounds × B."""
    c = _tiny()
    c.compare.methods = ("uniform", "dapo", "sera_dapo")
    c.report.challengers, c.compare.controls = (), False
    c.maze_family.enabled = c.maze_cell.enabled = c.regime.enabled = False
    out = study.run(c, str(tmp_path))
    s = out["summary"]
    assert "## At matched generation: held-out pass@k (%) where each arm's cumulative" in s
    assert "| sera_dapo | " in s and "| method − uniform | Δ pass@1 | Δ pass@16 |" in s
    setup = train.setup_from_config(c)
    gen = {n: r["steps"][..., train.STEP_METRICS.index("generated")]
           for n, r in out["main"].items()}
    assert (gen["uniform"] == setup.budget).all()
    for n in ("dapo", "sera_dapo"):
        rounds = gen[n] / setup.budget
        assert set(np.unique(rounds)) <= {1.0, 2.0, 3.0} and rounds.max() > 1
    _, num = cells.report_matched(out["main"], list(c.eval.ks), [1, 16], "uniform",
                                  list(c.compare.methods), "t")
    i = list(c.eval.ks).index(16)
    np.testing.assert_allclose(num["pass"]["uniform"][16],
                               100 * out["main"]["uniform"]["pass_at_k"][:, -1, 1, i])
    assert num["step"]["uniform"] == setup.num_steps and num["step"]["dapo"] < setup.num_steps
    assert num["per_step"]["dapo"] > setup.budget == num["per_step"]["uniform"]
    # At the matched point dapo is read between evaluations (cumulative rollouts, linear).
    x = cells.generation_curve(out["main"]["dapo"])[0]
    y = 100 * out["main"]["dapo"]["pass_at_k"][0, :, 1, i]
    assert num["pass"]["dapo"][16][0] == pytest.approx(np.interp(num["target"][0], x, y))
    d = num["paired"]["sera_dapo"][16]
    assert d == compare.seed_difference(num["pass"]["sera_dapo"][16],
                                        num["pass"]["uniform"][16])


def test_dapo_config_is_valid():
    """configs/allocation_lab/dapo.py: the four methods on the main cell and the maze family,
    controls on, the other cells off; cpu.py's lr."""
    from tests.studies.lab.test_study import CPU, ROOT

    c = get_config(os.path.join(ROOT, "configs", "allocation_lab", "dapo.py"))
    study.validate(c)
    four = ("uniform", "sera", "dapo", "sera_dapo")
    assert c.compare.methods == c.maze_family.methods == four and c.compare.controls
    assert c.maze_family.enabled and not (c.regime.enabled or c.sweep.enabled
                                          or c.maze_cell.enabled)
    assert c.rl.max_rounds >= 2 and c.rl.optimizer == get_config(CPU).rl.optimizer
