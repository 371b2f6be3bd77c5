"""A data-parallel RL step on 8 forced CPU devices equals the single-device step."""

import jax
import numpy as np

from sera_jax import optim, sharding
from sera_jax.studies.alignment import data, resnet
from sera_jax.studies.alignment import gradients as alignment
from sera_jax.studies.alignment.train import Steps, init_state


def test_sharded_rl_step_matches_single_device():
    assert jax.device_count() == 8  # tests/conftest.py forces 8 CPU devices
    tx = optim.make_optimizer(optim.get_config(
        name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=1, momentum=0.9,
        weight_decay=1e-4, weight_decay_mask="kernels", grad_clip=0.0), num_steps=10)
    graphdef, state0 = init_state(resnet.make_resnet(
        resnet.digits_resnet_config(width=4, stage_sizes=(1,))), tx)
    steps = Steps(graphdef, tx)
    b = next(data.array_batches(data.load_digits_split("train"), 16, seed=0))
    key = jax.random.key(0)
    results = []
    for devices in (jax.devices()[:1], jax.devices()):
        mesh = sharding.make_mesh((-1, 1, 1), devices=devices)
        state = sharding.replicate(state0, mesh)
        batch = sharding.shard_batch(b, mesh)
        p = alignment.success_probs(np.asarray(steps.logits(state, batch["image"], train=True)),
                                    b["label"])
        ab = alignment.allocate_batch("sera", p, 4, n_min=2, n_max=16)
        new, m = steps.rl_step(state, batch["image"], batch["label"], ab.counts, ab.weights,
                               key, n0=4, align=True)
        assert len(batch["image"].sharding.device_set) == len(devices)
        results.append((jax.device_get(new), jax.device_get(m), ab.counts))
    (s1, m1, c1), (s8, m8, c8) = results
    np.testing.assert_array_equal(c1, c8)
    for k in ("ce", "top1", "cosine", "norm_ratio"):
        np.testing.assert_allclose(m1[k], m8[k], rtol=1e-4, atol=1e-6)
    assert -1 <= float(m1["cosine"]) <= 1
    for a, b_ in zip(jax.tree.leaves((s1.params, s1.batch_stats)),
                     jax.tree.leaves((s8.params, s8.batch_stats))):
        np.testing.assert_allclose(a, b_, rtol=1e-4, atol=1e-6)
