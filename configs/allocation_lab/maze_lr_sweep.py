"""Allocation lab, lr selection on the maze-policy family (issue 25): as lr_sweep.py, on the
maze family's cell (5×5 mazes, H 12, P 8, N0 8, n_max 64, 96 steps) instead of the answer task.

For every lr of `sweep.learning_rates`: uniform and SERA with the null and A/A arms on 64
paired seeds; the gate per lr; each method's (held-out pass@1, pass@256) point with CIs; the
selected lr = the admissible one where uniform's pass@256 is best; SERA's points against
uniform's frontier; the θ table at the selected lr. The main cell (answer task, uniform and
SERA) runs too, as in every lab config; the maze family's own block, the maze cell and the
regime map are off.

  python -m experiments.allocation_lab --config=configs/allocation_lab/maze_lr_sweep.py \
      --workdir=/tmp/allocation_lab_maze_lr
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "allocation_lab_maze_lr_sweep"
    c.compare.methods = ("uniform", "sera")
    c.report.challengers = ()
    c.sweep.enabled = True
    c.sweep.family = "maze"
    c.sweep.learning_rates = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
    c.maze_family.enabled = False
    c.maze_cell.enabled = False
    c.regime.enabled = False
    return c
