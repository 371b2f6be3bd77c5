"""Maze default candidate where navigation is required (issue 37): 11x11 recursive-
backtracker mazes (long, varied answers; a maze-blind guesser scores little), otherwise the
long-horizon default of configs/maze/cpu.py. PILOT IN PROGRESS: see docs/results_maze.md,
"Pilots for a maze that must be read (issue 37)".
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_cpu_read"
    c.task.size = 11
    c.task.generator = "backtracker"
    c.task.num_sft = 16000
    c.task.max_new_tokens = 56  # >= the longest 11x11 answer (50)
    return c
