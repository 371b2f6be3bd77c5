"""Allocation lab, the learning-rate frontier of every fixed-budget method on the answer task.

For every lr of `sweep.learning_rates` (one below the default 0.002): each method of
`sweep.methods` with the null and A/A arms on 64 paired seeds; the gate per lr; each method's
(held-out pass@1, pass@256) point; and every method's frontier against uniform's
(`compare.frontier_gap`: pass@256 at matched pass@1, at two pass@1 levels inside the
frontiers' overlap and averaged over it, with paired seed-bootstrap CIs). No θ table. The main
cell runs uniform and SERA only; the maze family, maze cell and regime map are off.

  python -m experiments.allocation_lab --config=configs/allocation_lab/frontiers.py \
      --workdir=runs/lab_frontiers

Finished arms are stored in the workdir, so a killed run resumes where it stopped.
`frontiers_maze.py` is the same on the maze-policy family's cell.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")

#: Every fixed-budget method (DAPO generates more than the budget; sera_evidence is an
#: ablation of sera).
FIXED_BUDGET = ("uniform", "sera", "sera_sequential", "vip", "gdro", "pilot_commit",
                "inverse_p", "knapsack", "hit_utility", "grpo")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "allocation_lab_frontiers"
    c.compare.methods = ("uniform", "sera")
    c.report.challengers = ()
    c.sweep.enabled = True
    c.sweep.methods = FIXED_BUDGET
    c.sweep.learning_rates = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
    c.sweep.thetas = ()
    c.maze_family.enabled = False
    c.maze_cell.enabled = False
    c.regime.enabled = False
    return c
