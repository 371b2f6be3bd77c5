"""Allocation lab, the registered forecast for the long-horizon maze default (issue 26).

Forecasts configs/maze/cpu.py: P 32, N0 8, n_max 64, θ 0.05, 256 training prompts (an epoch
is 8 steps), 400 steps = 50 epochs; primary endpoint SERA − uniform held-out pass@64
averaged over steps 200/300/400. The lab runs that shape twice, with uniform, SERA,
`sera_evidence` and the null / A/A controls on 64 paired seeds, evaluated at steps
0/100/200/300/400:

* `maze_cell`: the answer task with the maze-like difficulty law, `task.num_train` 256, lr
  0.005 (`rl.optimizer.learning_rate`, the lr sweep's selection);
* `maze_family`: the maze-policy family, 256 training mazes, lr 0.05 (not swept).

For each, `window = 3` adds the window table to summary.md: each arm's held-out pass@1 and
pass@64 averaged over the last 3 evaluations (steps 200/300/400), the paired differences
(sera − uniform, sera_evidence − uniform, sera_evidence − sera, each method − null) with
95 % t CIs over seeds, and the gate (uniform − null at the final pass@1). The main cell is
kept cheap (uniform with the controls, 16 steps; it shares `task.num_train` 256 and the lr);
the regime map and the lr sweep are off.

  python -m experiments.allocation_lab --config=configs/allocation_lab/maze_forecast.py \
      --workdir=/tmp/allocation_lab_forecast

Its numbers are in docs/results_lab.md, "Registered prediction" (there run by a driver
script over `study.run` with these fields; 23 min at load ~6 on the shared 2-core machine).
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")

METHODS = ("uniform", "sera", "sera_evidence")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "allocation_lab_maze_forecast"
    c.task.num_train = 256
    c.rl.optimizer.learning_rate = 0.005  # the answer task's lr (the lr sweep's selection)
    # The main cell: uniform and the controls only, 16 steps (cheap; not part of the forecast).
    c.compare.methods = ("uniform",)
    c.report.challengers = ()
    c.rl.num_steps, c.eval.every = 16, 16
    c.regime.enabled = False
    c.sweep.enabled = False

    mc = c.maze_cell
    mc.enabled = True
    mc.prompts_per_step, mc.rollouts_per_prompt, mc.n_max = 32, 8, 64
    mc.num_steps, mc.eval_every = 400, 100
    mc.methods, mc.table_ks = METHODS, (1, 64)
    mc.window = 3  # steps 200/300/400

    mf = c.maze_family
    mf.enabled = True
    mf.num_train = 256
    mf.prompts_per_step, mf.rollouts_per_prompt, mf.n_max = 32, 8, 64
    mf.num_steps, mf.eval_every = 400, 100
    mf.methods, mf.learning_rate = METHODS, 0.05
    mf.window = 3
    return c
