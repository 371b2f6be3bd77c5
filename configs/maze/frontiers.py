r"""Learning-rate frontiers on the read-the-maze default (issue 48 item 4): uniform's, SERA's
and three more methods' frontiers, read on a sealed test split. It extends configs/maze/cpu.py and
sets what configs/maze/cpu_read.py sets (11x11 backtracker mazes, the 2x128 policy, SFT
2000 x 32, 300 RL steps of P 32 x N0 8, evaluation at 0, 75, 150, 225, 300; configs extend
one sibling, one level deep), so its SFT start is cpu_read's bit for bit (the start
fingerprints are equal -- tested; the sealed split is left out of it: SFT never reads it).

The start (made before this config was registered, one SFT run of cpu_read's recipe on one
CPU core, 7 Dec 2026): held-out pass@1 / pass@64 3.28 % / 41.5 % (blind 0.067 % / 3.9 %),
sealed split 4.24 % / 46.7 % (blind 0.108 % / 5.9 %); it reads the mazes (the validity gate
passes on both sets). cpu_read's own start (pilot A) scored 9.52 % / 63.6 % with the same
recipe (run-to-run non-determinism or a code change since 4 Dec: not measured yet), so
this study's numbers are read against its own start and its own uniform frontier only.

What it asks: is a method's frontier -- its (sealed-split pass@1, pass@64) points over the
lr grid, the SFT start as lr -> 0 -- above uniform's? On cpu_read SERA's pass@64 edge at one lr
(1e-5) was what uniform gets from a smaller lr (results/maze/maze_cpu_read/frontier.json);
here every method has its own frontier.

* Methods: uniform and SERA (6 seeds each), `sera_sequential` (SERA from a fresh in-step
  pilot), `hit_utility` (the best allocator on the allocation lab's maze-family task,
  frontier gap +0.25 [+0.17, +0.50] points) and `vip` (the best 2026 allocator there,
  -0.03 [-0.12, +0.14]) with 4 seeds each (results/lab/frontiers_maze/summary.md).
* lrs 3e-6 (below the default), 1e-5 (the default), 3e-5, 1e-4: cpu_read's frontier grid.
  The null control (uniform, rewards shuffled in the batch) with 2 seeds at every lr: each
  lr's gate.
* The sealed test split: 128 mazes drawn from their own seed (`task.test_seed`, used by no
  pilot, lr choice or earlier study), disjoint in content from every other split; scored
  at every evaluation point (the same keys for every policy at a point) and used only for
  the pre-registered endpoints (its other tables are reported, with no claim). The
  held-out set (the 128 mazes that chose cpu_read's lr, task and sizes) is reported beside.
* The primary: SERA's frontier gap to uniform's on the sealed split -- sealed-split pass@64 at
  matched pass@1 (per seed the mean over the last 3 evaluation points, 150-300), averaged
  over the overlap of the two frontiers' pass@1 range, with a paired seed bootstrap CI.
  Equivalence margin +-1.5 points (about half of cpu_read's +2.8-point single-lr effect):
  the verdict is better / worse / equivalent within +-1.5 / inconclusive. The other
  methods' gaps are secondary.
* Each run logs the mechanism (per step: gradient norm before clipping, update norm, clip
  flag; at each evaluation point: distance from the start and KL(pi_t || pi_start) on 32
  held-out mazes x 8 samples).

Runs: uniform and SERA 4 lrs x 6 seeds (48), three methods x 4 lrs x 4 seeds (48), the null
4 lrs x 2 seeds (8) and, at 1e-5, the A/A control (uniform again, 2 seeds; run by the last
`--stage=compare`): 106 runs of 300 steps, 8 min each on one core of an otherwise busy
machine (measured, 7 Dec 2026): ~7 h on 2 cores, one process a core, resumable across
sessions (each run resumes where it stopped; the stage skips finished runs).

    W=workdir/maze_frontiers
    M="python -m experiments.maze --config=configs/maze/frontiers.py --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=frontier --seeds=0,2,4 & \
        taskset -c 1 $M --stage=frontier --seeds=1,3,5 & wait) && $M --stage=frontier && \
    $M --stage=compare && $M --stage=export
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_frontiers"

    # cpu_read.py's task, SFT and RL shape (its docstring says why these numbers).
    c.task.size = 11
    c.task.generator = "backtracker"
    c.task.num_sft = 16000
    c.task.max_new_tokens = 56
    c.sft.num_steps = 2000
    c.sft.batch_size = 32
    c.sft.learning_rate = 2e-3
    c.sft.warmup_steps = 100
    c.sft.log_every = 50
    c.sft.checkpoint_every = 1000
    c.rl.num_steps = 300
    c.rl.optimizer.learning_rate = 1e-5
    c.eval.every = 75
    c.eval.paired_noise = True

    c.task.num_test = 128  # the sealed split
    c.task.test_seed = 48_2026  # used by no pilot, lr choice or earlier study
    c.eval.test_prompts = 128

    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0, 1, 2, 3, 4, 5)  # the config's lr is a frontier point like the others
    c.compare.null_seeds = (0, 1)
    c.compare.aa_seeds = (0, 1)
    c.compare.primary.split = "test"
    c.compare.margin = 0.015

    c.frontier.learning_rates = (3e-6, 1e-5, 3e-5, 1e-4)
    c.frontier.methods = ("uniform", "sera", "sera_sequential", "hit_utility", "vip")
    c.frontier.seeds = (0, 1, 2, 3, 4, 5)
    c.frontier.method_seeds = ml_collections.ConfigDict(dict(
        sera_sequential=(0, 1, 2, 3), hit_utility=(0, 1, 2, 3), vip=(0, 1, 2, 3)))
    c.frontier.null_seeds = (0, 1)
    c.frontier.margin = 0.015
    return c
