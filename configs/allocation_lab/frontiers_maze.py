"""Allocation lab, the learning-rate frontier of every fixed-budget method on the maze-policy
family's cell: frontiers.py with `sweep.family = "maze"` and the maze cell's lr grid (one below
its default 0.02).

  python -m experiments.allocation_lab --config=configs/allocation_lab/frontiers_maze.py \
      --workdir=runs/lab_frontiers_maze
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
answers = config_files.sibling(__file__, "frontiers.py")


def get_config() -> ml_collections.ConfigDict:
    c = answers.get_config()
    c.name = "allocation_lab_frontiers_maze"
    c.sweep.family = "maze"
    c.sweep.learning_rates = (0.01, 0.02, 0.05, 0.1, 0.2)
    return c
