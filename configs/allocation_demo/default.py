"""Allocation demo: the methods of `sera_jax.methods` on one synthetic batch of p̂.

  python -m experiments.allocation_demo --workdir=/tmp/allocation_demo \
      [--config.rl.prompts_per_step=24] [--config.compare.methods="('uniform','knapsack')"]
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "allocation_demo"
    c.seed = 0  # PRNG seed of the synthetic batch
    c.rows = 16  # prompts shown in the per-prompt table

    c.rl = ml_collections.ConfigDict()
    c.rl.prompts_per_step = 256  # P
    c.rl.rollouts_per_prompt = 128  # N0: the budget is P·N0
    c.rl.allocation = ml_collections.ConfigDict()
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 512

    c.compare = ml_collections.ConfigDict()
    # uniform = plain MaxRL, sera = dynamic active set (the paper's default), sera_equalized =
    # every prompt active; any names of sera_jax.methods.METHODS (one-shot methods).
    c.compare.methods = ("uniform", "sera", "sera_equalized")
    return c
