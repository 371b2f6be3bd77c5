"""Measure mode's snapshots do not depend on the processor's rounding.

XLA's CPU kernels round differently on different processors. Float32 CE training amplified
that: the well-trained digits model was another model on another host (1 − p of an image
moved by ~20 %), so every allocation and rollout failure changed and the cells moved by up
to 2 se. The digits default trains in float64 (`config.sft.dtype`) and rounds the snapshots
to float32. Here another processor is simulated by nudging the parameters by about one ulp
of the training dtype before every CE step.
"""

import os

import jax
import numpy as np
import pytest

from sera_jax import config_files
from sera_jax.studies.alignment import gradients as alignment
from sera_jax.studies.alignment import study

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _nudged_steps(rng):
    """`study.Steps` whose CE step first multiplies a random half of the parameters by
    (1 + eps) of their dtype: the rounding difference of another processor, at every step."""

    class Nudged(study.Steps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            inner = self.ce_step

            def ce_step(state, images, labels):
                def nudge(x):
                    dt = np.dtype(x.dtype)
                    return x * (1 + np.finfo(dt).eps * rng.integers(0, 2, x.shape)).astype(dt)

                return inner(state.replace(params=jax.tree.map(nudge, state.params)), images,
                             labels)

            self.ce_step = ce_step

    return Nudged


def _snapshot(config, monkeypatch, nudge):
    """(float32 parameters, p of the measure batch) after the config's one CE stage."""
    with monkeypatch.context() as m:
        if nudge:
            m.setattr(study, "Steps", _nudged_steps(np.random.default_rng(7)))
        mesh = study._mesh(config)
        source = study.DataSource(config, config.sft.batch_size)
        ms = config.measure
        batch = source.measure(ms.prompts_per_step, ms.split, config.seed)
        (graphdef, params, stats), = study.ce_snapshots(config, source, mesh)
    logits = study._linearize_fn(graphdef, ms.bn_train)(params, stats, batch["image"])[0]
    return params, alignment.success_probs(np.asarray(logits), batch["label"])


def _digits():
    c = config_files.get_config(os.path.join(ROOT, "configs/gradient_alignment/digits.py"))
    assert c.sft.dtype == "float64"
    return c


def _allocations(config, p, names=("sera", "knapsack"), budgets=(8, 64)):
    al = config.rl.allocation
    return {(name, n0): alignment.allocate_batch(name, p, n0, n_min=al.n_min, n_max=al.n_max,
                                                 threshold=al.threshold).counts
            for name in names for n0 in budgets}


def test_float64_snapshots_are_bit_identical_under_another_processors_rounding(monkeypatch):
    """The digits default's training dtype (a smaller ResNet, 10 steps, to stay fast): the
    nudged run's float32 snapshot is bit-identical, so p and every allocation are too (one
    is computed: the allocators compile per budget)."""
    c = _digits()
    c.model.width, c.model.stage_sizes, c.sft.batch_size = 4, (1,), 32
    c.measure.prompts_per_step = 64
    c.measure.stage_steps, c.measure.stage_names = (10,), ("ten",)
    params, p = _snapshot(c, monkeypatch, nudge=False)
    params_n, p_n = _snapshot(c, monkeypatch, nudge=True)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), params,
                                            params_n)))
    assert np.array_equal(p, p_n)
    a, a_n = (_allocations(c, x, names=("knapsack",), budgets=(8,)) for x in (p, p_n))
    assert all(np.array_equal(a[k], a_n[k]) for k in a)


@pytest.mark.slow  # ~1 min: documents why the digits default trains in float64
def test_float32_training_amplifies_another_processors_rounding(monkeypatch):
    """The old training (float32), the digits model, 100 CE steps: the same nudge moves the
    logits by O(0.1) and 1 − p by > 1 %, and the allocations change."""
    c = _digits()
    c.sft.dtype = "float32"
    c.measure.stage_steps, c.measure.stage_names = (100,), ("hundred",)
    _, p = _snapshot(c, monkeypatch, nudge=False)
    _, p_n = _snapshot(c, monkeypatch, nudge=True)
    assert np.abs((1 - p_n) / (1 - p) - 1).max() > 0.01
    a, a_n = _allocations(c, p), _allocations(c, p_n)
    assert sum(not np.array_equal(a[k], a_n[k]) for k in a) >= 2
