"""Stateful and two-stage methods in the LM trainer (`sera_jax.rl.collect`): gdro's controller
state carried in `TrainState`, checkpointed and resumed exactly; the in-step pilot of
`pilot_commit` / `sera_sequential` pooled into the batch; both allocate as the allocation
lab's `rollout_plan` does on the same inputs; the budget is spent exactly every step."""

from __future__ import annotations

import typing

import flax.struct
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.checkpoint import Checkpointer, tree_signature
from sera_jax.rl.state import TrainState
from sera_jax.studies.lab.shared import Setup, rollout_plan
from tests.rl.test_dynamic import trainer_for
from tests.rl.test_trainer import small_config
from tests.rl.toy import EmitTask, tiny_model
from tests.test_loop import _leaves_equal, rl_run

#: 4 prompts, P = 4: one step per epoch, so p̂ is seen from step 2 on.
TASK_SIZES = {"train": 4, "eval": 2}
#: The lab's setup of `small_config` (P = 4, N0 = 4, n_min = 2, n_max = 8); the trainer gives
#: allocators no history posterior (alpha/beta), as the lab without posterior_from_history.
LAB = Setup(num_train=4, prompts_per_step=4, n0=4, n_min=2, n_max=8, unseen="fill",
            posterior_from_history=False)
BUDGET = 16


def _counting(trainer):
    """Wrap `trainer.sample` to record the rows of every call."""
    calls, sample = [], trainer.sample

    def counted(state, prompts, mask, segment_ids, key, **kw):
        calls.append(len(segment_ids))
        return sample(state, prompts, mask, segment_ids, key, **kw)

    trainer.sample = counted
    return calls


def test_gdro_carries_its_controller_in_the_train_state_as_the_lab_does():
    trainer, state = trainer_for("gdro", EmitTask(TASK_SIZES))
    method = trainer.method
    _leaves_equal(state.alloc_state, method.init_state())  # fresh: nothing observed yet
    lab_state, prices = method.init_state(), []
    calls = _counting(trainer)
    for _ in range(4):
        state, metrics, r = trainer.step(state, return_rollouts=True)
        assert r.counts.sum() == len(r.rewards) == metrics["generated_rollouts"] == BUDGET
        assert sum(calls) == BUDGET and r.pilot_successes is None
        calls.clear()
        plan = rollout_plan(method, LAB, jnp.asarray(r.p_hat), (None, None), None, lab_state)
        np.testing.assert_array_equal(np.asarray(plan.counts), r.counts)
        lab_state = plan.state
        _leaves_equal(state.alloc_state, lab_state)  # the lab's scan carry, step by step
        prices.append(float(state.alloc_state.log_price))
    assert np.isnan(prices[0]) and np.all(np.isfinite(prices[1:]))  # step 1: all unseen
    assert len(set(prices[1:])) == 3, prices  # the dual step moves the price every step
    assert not np.isnan(np.asarray(state.alloc_state.variance)).all()


def test_gdro_resume_restores_the_controller_exactly(tmp_path):
    """4 steps == 2 steps, 'crash' after 3, resume to 4: params, history and the controller
    restored from the checkpoint give the uninterrupted run's state bit for bit."""
    task = EmitTask(TASK_SIZES)
    config = small_config(method="gdro", num_steps=4, checkpoint_every=2)
    full = rl_run(config, task, tiny_model(seed=3), tmp_path / "full")
    rl_run(config, task, tiny_model(seed=3), tmp_path / "resumed", stop_after=3)
    resumed = rl_run(config, task, tiny_model(seed=99), tmp_path / "resumed")
    assert resumed.resumed_from == 2
    _leaves_equal(full.state, resumed.state)
    assert np.isfinite(float(full.state.alloc_state.log_price))
    ckpt = Checkpointer(tmp_path / "resumed" / "checkpoints")
    at_2, _ = ckpt.restore(full.state, step=2)  # the checkpoint holds the controller
    ckpt.close()
    assert np.isfinite(float(at_2.alloc_state.log_price))


@flax.struct.dataclass
class _TrainStateBefore:
    """`TrainState` as it was before `alloc_state` (checkpoints written then)."""

    params: typing.Any
    opt_state: typing.Any
    history: typing.Any
    key: typing.Any
    step: typing.Any
    epoch: typing.Any
    cursor: typing.Any


def test_a_stateless_method_keeps_the_checkpoint_layout_so_old_checkpoints_restore(tmp_path):
    trainer, state = trainer_for("sera", EmitTask(TASK_SIZES))
    assert state.alloc_state is None
    old = _TrainStateBefore(**{k: getattr(state, k) for k in (
        "params", "opt_state", "history", "key", "step", "epoch", "cursor")})
    assert tree_signature(old) == tree_signature(state)
    ckpt = Checkpointer(tmp_path / "c")
    ckpt.save(0, old, {})
    restored, _ = ckpt.restore(trainer.abstract_state(state))
    ckpt.close()
    assert isinstance(restored, TrainState) and restored.alloc_state is None
    _leaves_equal(restored, state)


@pytest.mark.parametrize("name", ["pilot_commit", "sera_sequential"])
def test_two_stage_pools_its_pilot_spends_the_budget_and_allocates_as_the_lab(name):
    trainer, state = trainer_for(name, EmitTask(TASK_SIZES))
    m = trainer.method.pilot_size(2)
    calls = _counting(trainer)
    for _ in range(3):
        state, metrics, r = trainer.step(state, return_rollouts=True)
        # Generated = trained = B: the pilot (P·m rows) then the commit (the rest).
        assert calls[0] == 4 * m and sum(calls) == BUDGET, calls
        assert r.counts.sum() == len(r.rewards) == metrics["generated_rollouts"] == BUDGET
        assert (r.counts >= m).all() and state.alloc_state is None
        calls.clear()
        # The pilot is rollouts 0..m-1 of each prompt's group: K¹ = their successes.
        start = np.concatenate([[0], np.cumsum(r.counts)[:-1]])
        rank = np.arange(BUDGET) - start[r.segment_ids]
        pilot = rank < m
        k1 = np.bincount(r.segment_ids[pilot], weights=r.rewards[pilot], minlength=4)
        np.testing.assert_array_equal(k1, r.pilot_successes)
        plan = rollout_plan(trainer.method, LAB, jnp.asarray(r.p_hat), (None, None),
                            jnp.asarray(r.pilot_successes))
        np.testing.assert_array_equal(np.asarray(plan.counts), r.counts)
        np.testing.assert_array_equal(np.asarray(plan.segment_ids), r.segment_ids)
        np.testing.assert_allclose(np.asarray(plan.prompt_weights), r.prompt_weights)
    assert not np.isnan(r.p_hat).any()  # the last step allocated from a seen history too
