"""Child process of the SIGKILL test: saves checkpoints 1, 2, ... of a ~16 MB state forever.

usage: python -m tests.rl.checkpoint_writer DIRECTORY
Step s holds `w = full((2048, 2048), s)`, so a restored step can be checked for integrity.
"""

from __future__ import annotations

import sys

import jax.numpy as jnp

from sera_jax.checkpoint import Checkpointer


def main(directory: str) -> None:
    ck = Checkpointer(directory, max_to_keep=2)
    step = 1
    while True:
        ck.save(step, {"w": jnp.full((2048, 2048), float(step)), "step": jnp.int32(step)},
                {"step": step})
        step += 1


if __name__ == "__main__":
    main(sys.argv[1])
