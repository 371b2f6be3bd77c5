"""Allocation lab: a controlled RL testbed with exact success probabilities (issues 13, 25).

`task` (prompts × candidate answers, softmax policy over a shared scorer, exact p and
∇ log p), `maze_task` (a next-move policy shared across grid mazes: success needs L correct
moves, p exact by DP over the absorbing chain), `train` (one compiled program per method:
vmap over seeds, scan over steps, the library's history / allocators / estimators / loss,
the `sera_jax.optim` optimiser; the null control and the A/A rollout stream), `stats`
(paired differences and 95 % CIs over seeds), `cells` (one cell: methods × seeds with the
controls and the lr gate, its tables, the window endpoint), `sweep` (the lr sweep and θ
table), `regime` (the regime map), `study` (`run`: every cell, figures, summary.md).
"""
