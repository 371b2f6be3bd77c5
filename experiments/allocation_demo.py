r"""Allocation demo: uniform MaxRL vs SERA on one realistic batch of success probabilities
(`sera_jax.studies.allocation_demo`).

  python -m experiments.allocation_demo --workdir=/tmp/allocation_demo \
      [--config.rl.prompts_per_step=24] [--config.compare.methods="('uniform','knapsack')"]

Writes allocation_demo.md (per-prompt N / κ / w and a summary per method, also printed) and
allocation_demo.png to --workdir.
"""

from sera_jax.studies import allocation_demo, common

if __name__ == "__main__":
    common.binary(allocation_demo.run, "configs/allocation_demo/default.py")
