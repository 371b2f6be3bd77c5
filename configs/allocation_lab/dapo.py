"""Allocation lab, DAPO dynamic sampling (issue 23): uniform, SERA, DAPO and SERA + DAPO at
matched generation cost.

`dapo` / `sera_dapo` (`sera_jax.methods`) allocate each round like `uniform` / `sera`, then
drop the groups whose rollouts all fail or all succeed and refill from further prompts, up to
`rl.max_rounds` rounds of P prompts per step (`sera_jax.studies.lab.dynamic`). Each step of
theirs generates more rollouts than B = P·N0, so the summary adds the "at matched generation"
table: every arm read where its cumulative generated rollouts reach uniform's total. Main
cell (answer task, 64 paired seeds, null and A/A controls, the lr gate) and the maze-policy
family; the regime map, lr sweep and maze cell are off. Learning rates are cpu.py's.

  python -m experiments.allocation_lab --config=configs/allocation_lab/dapo.py \
      --workdir=/tmp/allocation_lab_dapo [--config.rl.max_rounds=4]
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")

METHODS = ("uniform", "sera", "dapo", "sera_dapo")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "allocation_lab_dapo"
    c.compare.methods = METHODS
    c.compare.controls = True
    c.report.challengers = ()
    c.maze_family.enabled = True
    c.maze_family.methods = METHODS
    c.sweep.enabled = False
    c.maze_cell.enabled = False
    c.regime.enabled = False
    return c
