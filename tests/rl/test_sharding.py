"""Meshes, partition rules and the sharded trainer step on 8 forced CPU devices."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec

from sera_jax import sharding as shd
from sera_jax.rl import trainer as trainer_lib
from tests.rl.test_trainer import one_device_mesh, small_config, with_history
from tests.rl.toy import EmitTask, tiny_model


def test_mesh_shape_fill_and_errors():
    assert shd.mesh_shape_from_config({"data": -1, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
    assert shd.mesh_shape_from_config((1, -1, 1), 8) == (1, 8, 1)
    mesh = shd.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    for bad, match in [({"data": 3, "fsdp": 1, "tensor": 1}, "3 devices but 8"),
                       ({"data": -1, "fsdp": -1}, "at most one -1"),
                       ({"data": -1, "fsdp": 3}, "do not divide"),
                       ({"batch": 2}, "unknown axes")]:
        with pytest.raises(ValueError, match=match):
            shd.mesh_shape_from_config(bad, 8)


def test_logical_rules_replicate_what_does_not_divide():
    mesh = shd.make_mesh((1, 2, 4))
    spec = lambda names, shape: shd.logical_to_spec(names, shape, mesh)  # noqa: E731
    assert spec(("embed", "mlp"), (16, 32)) == PartitionSpec("fsdp", "tensor")
    # 2 KV heads cannot split 4 ways: that dimension is replicated.
    assert spec(("embed", "kv_heads", "head_dim"), (16, 2, 4)) == PartitionSpec("fsdp", None,
                                                                                None)
    assert spec(("batch", None), (8, 3)) == PartitionSpec("fsdp", None)  # data has size 1
    # A mesh axis is never used twice in one spec.
    assert spec(("mlp", "vocab"), (8, 8)) == PartitionSpec("tensor", None)
    with pytest.raises(ValueError, match="no partition rule for logical axis 'experts'"):
        spec(("experts",), (4,))


def test_decoder_state_shardings():
    mesh = shd.make_mesh((2, 2, 2))
    model = tiny_model()
    shardings = shd.state_shardings(nnx.state(model), mesh)
    assert shardings["embed"].get_value().spec == PartitionSpec("tensor", "fsdp")
    attn = shardings["layers"][0]["attn"]
    assert attn["q_kernel"].get_value().spec == PartitionSpec("fsdp", "tensor", None)
    assert shardings["final_norm"]["scale"].get_value().spec == PartitionSpec(None)
    shd.shard_model(model, mesh)
    mlp_up = nnx.state(model)["layers"][0]["mlp"]["up"].get_value()
    assert mlp_up.sharding.spec == PartitionSpec("fsdp", "tensor")
    assert len(mlp_up.addressable_shards) == 8


def test_shard_batch_rows_and_to_host():
    mesh = shd.make_mesh((2, 2, 2))
    x = np.arange(24).reshape(8, 3)
    arr = shd.shard_batch(x, mesh)
    assert arr.sharding.spec == PartitionSpec(("data", "fsdp"), None)
    np.testing.assert_array_equal(shd.to_host(arr), x)
    with pytest.raises(ValueError, match="not a multiple of the 4 batch shards"):
        shd.shard_batch(np.zeros((6, 2)), mesh)


@pytest.mark.parametrize("options", [{}, {"skip_zero_advantage": True,
                                          "train_length_bucket": 2},
                                     {"share_prompt_prefix": True, "train_length_bucket": 2}])
def test_sharded_step_equals_single_device_step(options):
    """Two trainer steps on a data=2, fsdp=2, tensor=2 mesh equal the 1-device steps: same
    allocation and samples, parameters to float32 reduction-order tolerance, and the
    caller's model is left intact (params are copied before the donating train step);
    also with the live rows packed and the completions cut to a length bucket, and with
    each micro-batch's prompts run once (`share_prompt_prefix`: prompt slots replicated,
    rows split over the batch shards)."""
    config = small_config(**options)
    task = EmitTask()
    p_hat = np.linspace(0.05, 0.95, 12)
    results = []
    for mesh, sample_rows in ((one_device_mesh(), 8), (shd.make_mesh((2, 2, 2)), 0)):
        # The 1-device run samples in two chunks of 8 rows: rows keep their keys, so the
        # samples must not change.
        config.sampling.batch_size = sample_rows
        model = tiny_model(seed=1)
        trainer = trainer_lib.Trainer(config, task, model, mesh)
        state = with_history(trainer.init_state(model), p_hat)
        rollouts = []
        for _ in range(2):
            state, metrics, r = trainer.step(state, return_rollouts=True)
            rollouts.append(r)
            # The device's count of computed micro-batches matches the host's prediction.
            assert metrics["trained_micro_batches"] == trainer.trained_micro_batches(r)
            assert metrics["train_width"] == (
                min(task.max_new_tokens, -(-int(r.lengths.max()) // 2) * 2) if options
                else task.max_new_tokens)
        assert not any(x.is_deleted() for x in jax.tree.leaves(nnx.state(model)))
        leaf = jax.tree.leaves(state.params)[0]
        results.append((jax.tree.map(np.asarray, state.params), rollouts, leaf.sharding))
    (single, r1, _), (sharded, r8, sharding8) = results
    assert len(sharding8.device_set) == 8 and not sharding8.is_fully_replicated
    for a, b in zip(r1, r8):
        np.testing.assert_array_equal(a.counts, b.counts)
        np.testing.assert_array_equal(a.completion_tokens, b.completion_tokens)
        np.testing.assert_array_equal(a.rewards, b.rewards)
    assert len(set(r1[0].counts.tolist())) > 1  # heterogeneous groups
    for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)
