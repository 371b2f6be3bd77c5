r"""The trainer's AdamW update: optax's clip + adamw chain vs `trainer.fused_adamw_step`.

Side by side in one process, on the same donated float32 parameters (a 135M-element leaf
and a half-size one, zero gradients as in a step without a live row): seconds per jitted
update and minor page faults per call (`getrusage`: pages of freshly allocated buffers
touched, i.e. buffers XLA did not update in place). Results: docs/results_speed.md.

    taskset -c 0 .venv/bin/python benchmarks/adamw_update_bench.py [--elements=33750000]
"""

from __future__ import annotations

import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from bench_common import cpu_name

from sera_jax import optim
from sera_jax.rl import config as rl_config
from sera_jax.rl import trainer

_ELEMENTS = flags.DEFINE_integer("elements", 135_000_000 // 4, "Elements of the large leaf.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls after the first.")


def measure(step, params, opt_state, grads) -> tuple[float, int]:
    """(median seconds, median minor page faults) of `repeats` calls after the first."""
    params, opt_state = step(params, opt_state, grads)
    times, faults = [], []
    for _ in range(_REPEATS.value):
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        params, opt_state = step(params, opt_state, grads)
        jax.block_until_ready((params, opt_state))
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    return float(np.median(times)), int(np.median(faults))


def main(argv: list[str]) -> None:
    del argv
    config = rl_config.get_config()
    tx = optim.make_optimizer(config.optimizer)
    n = _ELEMENTS.value

    def optax_step(params, opt_state, grads):
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def fused_step(params, opt_state, grads):
        return trainer.fused_adamw_step(config, params, opt_state, grads,
                                        jnp.isfinite(optax.global_norm(grads)))

    rows = []
    for name, fn in (("optax clip + adamw (baseline)", optax_step),
                     ("trainer.fused_adamw_step", fused_step)):
        params = {"large": jnp.ones(n), "small": jnp.ones(n // 2)}
        grads = jax.tree.map(jnp.zeros_like, params)
        rows.append((name, *measure(jax.jit(fn, donate_argnums=(0, 1)), params,
                                    tx.init(params), grads)))
    base = rows[0][1]
    print(f"{cpu_name()}; jax {jax.__version__}; {n + n // 2:,} float32 parameters "
          f"(+ 2 moments); median of {_REPEATS.value} calls after the first\n")
    print("| update | s per call | minor page faults per call | speed-up |\n|---|---|---|---|")
    for name, seconds, faults in rows:
        print(f"| {name} | {seconds:.3g} | {faults:,} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    app.run(main)
