"""One process of the two-process CPU test (run by tests/rl/test_multihost.py).

usage: python -m tests.rl.multihost_worker PROCESS_ID PORT OUTDIR [train]

Joins a 2-process JAX job on 127.0.0.1:PORT (2 CPU devices per process, gloo collectives),
checks global reductions, and with `train` runs two trainer steps on a mesh spanning both
processes plus a checkpoint save/restore. Process 0 writes results to OUTDIR.
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from sera_jax import sharding as shd  # noqa: E402


def main(process_id: int, port: int, outdir: str, train: bool) -> None:
    assert shd.initialize_distributed(True, f"127.0.0.1:{port}", 2, process_id)
    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    mesh = shd.make_mesh((2, 2, 1))  # data=2 spans the processes
    # Global reduction: every process holds the same global array; each owns half the rows.
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    arr = shd.shard_batch(x, mesh)
    assert len(arr.addressable_shards) == 2 and not arr.is_fully_addressable
    total = jax.jit(jnp.sum, out_shardings=shd.replicated(mesh))(arr)
    gathered = multihost_utils.process_allgather(np.array([process_id * 10 + 1]))
    host = shd.to_host(arr * 2)
    results = {"sum": float(shd.to_host(total)), "allgather": gathered.ravel(),
               "to_host": host}
    if train:
        from flax import nnx  # noqa: F401

        from sera_jax.checkpoint import Checkpointer
        from sera_jax.rl import trainer as trainer_lib
        from tests.rl.test_trainer import small_config, with_history
        from tests.rl.toy import EmitTask, tiny_model

        config = small_config()
        model = tiny_model(seed=1)
        trainer = trainer_lib.Trainer(config, EmitTask(), model, mesh)
        state = with_history(trainer.init_state(model), np.linspace(0.05, 0.95, 12))
        state = state.replace(history=shd.replicate(jax.tree.map(shd.to_host, state.history),
                                                    mesh))
        for _ in range(2):
            state, _, r = trainer.step(state, return_rollouts=True)
        with Checkpointer(os.path.join(outdir, "ckpt")) as ck:
            ck.save(2, state, {"ok": True})
        with Checkpointer(os.path.join(outdir, "ckpt")) as ck:
            restored, _ = ck.restore(trainer.abstract_state(state))
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
            np.testing.assert_array_equal(shd.to_host(a), shd.to_host(b))
        for i, leaf in enumerate(jax.tree.leaves(state.params)):
            results[f"param_{i}"] = shd.to_host(leaf)
        results["tokens"] = r.completion_tokens
    if process_id == 0:
        np.savez(os.path.join(outdir, "results.npz"), **results)
    multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], len(sys.argv) > 4 and
         sys.argv[4] == "train")
