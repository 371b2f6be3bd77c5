"""The maze defaults' speed options (micro-batches, zero-advantage skipping, the shared
prompt prefix, length buckets) give the plain path's gradient (cf. tests/rl/test_trainer.py,
which checks each option alone on a toy task; here all four together on the maze task)."""

import os

import jax
import jax.numpy as jnp
import numpy as np

from sera_jax import config_files
from sera_jax.rl import trainer as trainer_lib
from sera_jax.studies import paired as study
from tests import util

SPEED = {"micro_batch_size": 8, "skip_zero_advantage": True, "share_prompt_prefix": True,
         "train_length_bucket": 4}
PLAIN = {"micro_batch_size": 0, "skip_zero_advantage": False, "share_prompt_prefix": False,
         "train_length_bucket": 0}


def _load(name):
    return config_files.get_config(os.path.join(util.ROOT, "configs", "maze", f"{name}.py"))


def test_default_configs_use_the_speed_options():
    cpu, tiny = _load("cpu"), _load("tiny")
    assert cpu.rl.micro_batch_size > 0 and cpu.rl.skip_zero_advantage
    assert cpu.rl.share_prompt_prefix and cpu.rl.train_length_bucket > 0
    assert {k: tiny.rl[k] for k in SPEED} == SPEED  # the tiny pipeline runs them too
    old = _load("cpu_16step")  # the earlier default keeps its fingerprint (plain path)
    assert old.rl.micro_batch_size == 0 and not old.rl.get("skip_zero_advantage")


def test_speed_options_give_the_plain_gradient():
    cfg = _load("tiny")
    cfg.rl.rollouts_per_prompt = 16  # 32 rows: 4 micro-batches of 8
    cfg.rl.allocation.n_max = 28
    task = study.build_task(cfg)

    class Varied:
        """The tiny maze task with rewards that vary within maze 0's group (the tiny policy
        never solves a maze): 1 for a completion of even length of maze 0; maze 1's group
        all fails (zero advantage: its rows are skipped)."""

        def __getattr__(self, name):
            return getattr(task, name)

        def score(self, split, ids, completions, truncated):
            return [float(len(c) % 2 == 0 and q == 0) for q, c in zip(ids, completions)]

    model = study.build_model(cfg)
    mesh = study.make_mesh(cfg)
    trainers = {}
    for name, opts in (("plain", PLAIN), ("fast", SPEED)):
        rl = study.run_config(cfg, "sera", 0)
        rl.update(opts)
        trainers[name] = trainer_lib.Trainer(rl, Varied(), model, mesh)
    plain, fast = trainers["plain"], trainers["fast"]
    state = plain.init_state(model)
    h = state.history  # uneven SERA counts: prompts straddle micro-batches
    state = state.replace(history=h.replace(p_hat=jnp.asarray([0.1, 0.6], jnp.float32),
                                            seen=jnp.ones(2, bool)))
    r, _, _ = plain.collect(state)
    assert len(set(r.counts.tolist())) > 1 and 0 < r.live.sum() < r.live.size
    loss_a, grads_a = plain.gradients(state.params, plain.device_batch(r))
    loss_b, grads_b = fast.gradients(state.params, fast.device_batch(r))
    assert float(loss_a) != 0
    np.testing.assert_allclose(float(loss_b), float(loss_a), rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    assert fast.trained_micro_batches(r) == -(-int(r.live.sum()) // 8)
    assert fast.train_width(r) <= plain.train_width(r)
