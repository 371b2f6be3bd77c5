"""The lr pilot of the long-horizon maze default (issue 26): uniform and the null control,
2 seeds each, at every lr of `frontier.learning_rates`; the selected lr is uniform's best
held-out pass@64 (the primary endpoint's metric and window) among the lrs whose gate passes
(uniform − null at held-out pass@1: CI above 0, mean above 2 x the noise floor). Runs share
the workdir's SFT stage; the runs at the config's own lr are the default comparison's.

    W=workdir/maze_long; M="python -m experiments.maze --config=configs/maze/lr_pilot.py"
    $M --workdir=$W --stage=sft && (taskset -c 0 $M --workdir=$W --stage=frontier --seeds=0 &
        taskset -c 1 $M --workdir=$W --stage=frontier --seeds=1 & wait) &&
    $M --workdir=$W --stage=frontier   # aggregate: results/frontier.{md,json,png}
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_lr_pilot"
    c.frontier.methods = ("uniform",)
    c.frontier.seeds = (0, 1)
    return c
