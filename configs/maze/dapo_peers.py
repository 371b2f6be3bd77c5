r"""The maze peer table for DAPO dynamic sampling (issue 23): uniform MaxRL, SERA, DAPO and
SERA + DAPO on the long-horizon default (configs/maze/cpu.py: same SFT start, 400 steps,
lr 3e-6, P 32, N0 8), 3 paired seeds, evaluated along the curve.

DAPO (`dapo`, `sera_dapo`; `sera_jax.rl.dynamic`) over-samples: each step draws rounds of P
prompts (at most `rl.max_rounds` = 4) until B = 256 rows of informative groups (0 < K < N)
are filled, so it generates more rollouts per step than the others. The train records'
`rollouts` count *generated* rollouts (every round), and the comparison table lists them,
so a result is read at matched generation cost as well as at matched steps.

Analysis, fixed before the run (recorded in preregistered.json at the first RL run): DAPO −
uniform on held-out pass@64 over the last 3 evaluation points (steps 200/300/400), seed-level
95 % t interval; everything else is secondary. Exploratory: 3 seeds, no null or A/A arm
here (the default comparison's null gate at this lr and seeds is in docs/results_maze.md).

    W=workdir/maze_dapo
    M="python -m experiments.maze --config=configs/maze/dapo_peers.py --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=rl --seeds=0,2 & \
        taskset -c 1 $M --stage=rl --seeds=1 & wait) && $M --stage=eval
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_dapo_peers"
    c.compare.methods = ("uniform", "sera", "dapo", "sera_dapo")
    c.compare.seeds = (0, 1, 2)
    c.compare.null = False
    c.compare.aa = False
    c.compare.primary.method = "dapo"
    return c
