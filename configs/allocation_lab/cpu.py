"""Allocation lab, CPU default: every registered method × 64 paired seeds, plus the regime map.

  python -m experiments.allocation_lab --config=configs/allocation_lab/cpu.py \
      --workdir=/tmp/allocation_lab [--config.num_seeds=128] [--config.regime.enabled=False]

Measured wall time on the shared 2-core machine: see docs/results_lab.md (target ≤ 5 min).
"""

import ml_collections

METHODS = ("uniform", "sera", "sera_equalized", "sera_no_multiplicity", "sera_paper_rounding",
           "inverse_p", "knapsack", "hit_utility", "grpo")
NEW_RULES = ("sera_posterior", "sera_sequential")  # beyond the paper (sera_jax.allocation.beyond)


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_seeds = 64
    c.methods = METHODS + NEW_RULES
    c.difficulty = "maze"  # a name of sera_jax.studies.lab.task.DIFFICULTIES or (weight, a, b) rows

    c.task = ml_collections.ConfigDict()
    c.task.num_train = 32
    c.task.num_test = 64
    c.task.num_answers = 16
    c.task.feature_dim = 16
    c.task.num_skills = 4
    c.task.max_correct = 2
    c.task.p_floor = 1e-6
    c.task.base_logit_scale = 1.0
    c.task.scorer = "linear"  # or "mlp"
    c.task.mlp_width = 16

    c.train = ml_collections.ConfigDict()
    c.train.prompts_per_step = 8  # P
    c.train.n0 = 8  # N0: budget B = P·N0 per step
    c.train.n_min = 2
    c.train.n_max = 64
    c.train.num_steps = 192
    c.train.eval_every = 16
    c.train.learning_rate = 0.05
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.eps = 1e-8
    c.train.weight_decay = 0.01
    c.train.grad_clip = 1.0
    c.train.aggregation = "sequence_mean"  # one-token answers: all three modes coincide
    c.train.unseen = "fill"
    # Allocators that take a Beta posterior (hit_utility, ...) get the history's (α+S, β+F).
    c.train.posterior_from_history = True

    c.history = ml_collections.ConfigDict()
    c.history.alpha = 0.5
    c.history.beta = 0.5
    c.history.gamma = 0.75

    c.report = ml_collections.ConfigDict()
    c.report.ks = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
    c.report.table_ks = (1, 4, 16, 64, 256, 1024)
    c.report.fig_ks = (1, 16, 256)
    c.report.reference = "uniform"
    c.report.ci = "t"  # or "bootstrap"
    c.report.challengers = NEW_RULES
    c.report.challenge_reference = "sera"

    # The maze CPU default's shape (configs/maze/cpu.py): the lab's prediction for it.
    c.maze_cell = ml_collections.ConfigDict()
    c.maze_cell.enabled = True
    c.maze_cell.prompts_per_step = 8
    c.maze_cell.n0 = 8
    c.maze_cell.n_max = 32
    c.maze_cell.num_steps = 64
    c.maze_cell.eval_every = 16
    c.maze_cell.difficulty = "maze"
    c.maze_cell.methods = ("uniform", "sera", "sera_no_multiplicity")  # as in docs/results_maze.md
    c.maze_cell.table_ks = (1, 4, 16, 32)

    c.regime = ml_collections.ConfigDict()
    c.regime.enabled = True
    # (P, N0, n_max); (8, 8, 64) is the main cell and (8, 8, 32) the maze cell (no recompile)
    c.regime.shapes = ((8, 4, 32), (8, 8, 32), (8, 8, 64), (8, 32, 256), (16, 8, 64))
    c.regime.difficulties = ("maze", "imagenet", "uniform", "hard")
    c.regime.methods = ("uniform", "sera") + NEW_RULES
    c.regime.subject = "sera"  # coloured in the map
    c.regime.num_seeds = 64  # = num_seeds: the compiled runners are reused
    c.regime.num_steps = 96
    c.regime.eval_every = 16
    c.regime.ks = (1, 64)
    return c
