"""Blocking cost of `sera_jax.checkpoint.Checkpointer.save`: synchronous vs asynchronous.

The state is the size of SmolLM2-135M's training state in float32: its parameter shapes
(134.5M parameters, from `models.configs.SMOLLM2_135M`) three times over (parameters and
AdamW's two moments), 1.50 GiB of random values (incompressible, like trained weights).
For each mode the same state is saved `--repeats` times; reported are the seconds until
`save` returns (what a training step waits for) and until the step is committed on disk
(`wait_until_finished`), medians, with the tree checksum that `save` computes on the host
(part of the blocking time in both modes) timed on its own. The baseline is the
synchronous save in the same run. The machine's load average is printed with the numbers:
the background write competes with whatever else runs for the same cores.

    .venv/bin/python benchmarks/checkpoint_bench.py --repeats=2
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

_REPEATS = flags.DEFINE_integer("repeats", 2, "Saves per mode (median reported).")
_SCALE = flags.DEFINE_float("scale", 1.0, "Fraction of the 1.5 GiB state (tests use 0.01).")
_DIR = flags.DEFINE_string("dir", "", "Where to write ('' = a temporary directory, removed).")


def smollm2_state(scale: float = 1.0, seed: int = 0) -> dict:
    """{'params', 'mu', 'nu'}: random float32 arrays of SmolLM2-135M's parameter shapes
    (every dimension but the last scaled by `scale`), plus AdamW's int32 step count."""
    import jax.numpy as jnp
    import numpy as np

    from sera_jax.models.configs import SMOLLM2_135M as c

    d, f, dh = c.hidden_size, c.intermediate_size, c.resolved_head_dim
    shapes = {"embed": (c.vocab_size, d), "final_norm": (d,)}
    for i in range(c.num_layers):
        shapes.update({f"l{i}.q": (d, c.num_heads * dh), f"l{i}.k": (d, c.num_kv_heads * dh),
                       f"l{i}.v": (d, c.num_kv_heads * dh), f"l{i}.o": (c.num_heads * dh, d),
                       f"l{i}.gate": (d, f), f"l{i}.up": (d, f), f"l{i}.down": (f, d),
                       f"l{i}.norm1": (d,), f"l{i}.norm2": (d,)})
    shapes = {k: tuple(max(1, round(n * scale)) for n in s[:-1]) + s[-1:]
              for k, s in shapes.items()}
    rng = np.random.default_rng(seed)
    tree = {part: {k: jnp.asarray(rng.random(s, dtype=np.float32)) for k, s in shapes.items()}
            for part in ("params", "mu", "nu")}
    tree["count"] = jnp.int32(7)
    return tree


def main(argv):
    del argv
    import jax

    from sera_jax.checkpoint import Checkpointer, tree_checksums

    root = _DIR.value or tempfile.mkdtemp(prefix="checkpoint_bench_")
    load_before = os.getloadavg()
    state = smollm2_state(_SCALE.value)
    jax.block_until_ready(state)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
    t0 = time.perf_counter()
    tree_checksums(state)
    checksum_s = time.perf_counter() - t0
    rows = {}
    try:
        for mode in ("sync", "async"):
            directory = os.path.join(root, mode)
            returned, committed = [], []
            with Checkpointer(directory, max_to_keep=2, async_save=mode == "async") as ck:
                for step in range(1, _REPEATS.value + 1):
                    t0 = time.perf_counter()
                    ck.save(step, state, {"step": step})
                    returned.append(time.perf_counter() - t0)
                    ck.wait_until_finished()
                    committed.append(time.perf_counter() - t0)
            rows[mode] = (statistics.median(returned), statistics.median(committed))
            shutil.rmtree(directory, ignore_errors=True)
            print(f"{mode}: save returned after {[f'{t:.2f}' for t in returned]} s, committed "
                  f"after {[f'{t:.2f}' for t in committed]} s", flush=True)
    finally:
        if not _DIR.value:
            shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    base = rows["sync"][0]
    print(f"\nState {nbytes / 2**30:.2f} GiB float32 ({len(jax.tree.leaves(state))} arrays, "
          f"{jax.devices()[0].platform}), median of {_REPEATS.value} saves, "
          f"{len(os.sched_getaffinity(0))} CPU core(s), load average "
          f"{load_before[0]:.2f} before / {load_after[0]:.2f} after (1 min). Host checksum "
          f"alone: {checksum_s:.2f} s (inside both modes' blocking time).\n")
    print("| mode | `save` returns (s) | vs sync | committed on disk (s) |")
    print("|---|---|---|---|")
    for mode, (ret, done) in rows.items():
        print(f"| {mode} | {ret:.2f} | {ret / base:.2f}x | {done:.2f} |")


if __name__ == "__main__":
    app.run(main)
