"""Two CPU processes on loopback form one JAX job (gloo collectives): global reductions,
and (slow) a trainer step + checkpoint on a mesh spanning both equals the 1-process step."""

from __future__ import annotations

import sys

import jax
import numpy as np
import pytest

from sera_jax import sharding as shd
from sera_jax.rl import trainer as trainer_lib
from tests import util
from tests.rl.test_trainer import small_config, with_history
from tests.rl.toy import EmitTask, tiny_model


def _launch(tmp_path, *extra, timeout=300) -> dict:
    port = util.free_port()
    util.launch([[sys.executable, "-m", "tests.rl.multihost_worker", str(i), str(port),
                  str(tmp_path), *extra] for i in range(2)], util.cpu_job_env(), timeout)
    return dict(np.load(tmp_path / "results.npz"))


def test_two_processes_global_reduction(tmp_path):
    res = _launch(tmp_path)
    assert res["sum"] == float(np.arange(16).sum())  # rows of both processes
    np.testing.assert_array_equal(res["allgather"], [1, 11])
    np.testing.assert_array_equal(res["to_host"], 2 * np.arange(16).reshape(8, 2))


@pytest.mark.slow
def test_two_process_trainer_step_equals_single_process(tmp_path):
    res = _launch(tmp_path, "train", timeout=600)
    mesh = shd.make_mesh((2, 2, 1), devices=jax.devices()[:4])
    model = tiny_model(seed=1)
    trainer = trainer_lib.Trainer(small_config(), EmitTask(), model, mesh)
    state = with_history(trainer.init_state(model), np.linspace(0.05, 0.95, 12))
    for _ in range(2):
        state, _, r = trainer.step(state, return_rollouts=True)
    np.testing.assert_array_equal(res["tokens"], r.completion_tokens)
    for i, leaf in enumerate(jax.tree.leaves(state.params)):
        np.testing.assert_allclose(res[f"param_{i}"], np.asarray(leaf), rtol=0, atol=2e-5)
