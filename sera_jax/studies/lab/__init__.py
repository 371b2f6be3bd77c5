"""Allocation lab: a controlled RL testbed with exact success probabilities.

`task` (prompts × candidate answers, softmax policy over a shared scorer, exact p and
∇ log p), `maze_task` (a next-move policy shared across grid mazes: success needs L correct
moves, p exact by DP over the absorbing chain), `shared` (the run's static `Setup` and the
pieces of a step every method shares: data order, rollout uniforms, rollout plan), `train`
(one compiled program per method: vmap over seeds, scan over steps, the library's history /
allocators / estimators / loss, the `sera_jax.optim` optimiser; the null control and the A/A
rollout stream), `dynamic` (DAPO dynamic sampling as a static-shape step), `cells` (one
cell: methods × seeds with the controls and the lr gate, its tables, the window endpoint),
`sweep` (the lr sweep and θ table), `regime` (the regime map), `study` (`run`: every cell,
figures, summary.md), `export` (a finished run to the committed files of `results/lab/`).
Paired differences and their 95 % CIs over seeds are `sera_jax.studies.compare`'s
(`seed_difference`, `winner`, `format_interval`).
"""
