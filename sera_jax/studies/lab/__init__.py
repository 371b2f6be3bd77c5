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
(`seed_difference`, `winner`, `format_interval`); the control arms are `null` and `aa`, named
as in the paired studies.

How it differs from the LM trainer: losses come from `sera_jax.objective`, as in
`sera_jax.rl`, but a cell's wall time is XLA compilation, so arms that differ only in a traced
switch share one compiled program (uniform, its null and its A/A arm; a method and its
multiplicity ablation: `cells.run_cell`). The lab draws the pilot rollouts a two-stage method
(`sera_sequential`, `pilot_commit`) needs and carries a stateful method's allocator state
(`gdro`'s controller) in its scan carry; the LM trainer refuses both. `dapo` / `sera_dapo` run in
`dynamic` (`rl.max_rounds` rounds of P prompts per step, packed as
`sera_jax.dynamic_sampling.select` packs them, by test); each step logs its generated
rollouts, and a cell with such an arm also reports every arm at the baseline's generated
total (`cells.report_matched`; configs/allocation_lab/dapo.py).

Resume: each finished arm of each cell is stored as `<workdir>/arms/<arm>_<hash>.npz` under
`cells.arm_fingerprint` (arm, resolved method, the whole setup, seeds, law, stream, null); a
re-run trains only the arms whose fingerprint changed. A code change that alters what a
stored arm holds bumps `cells.CACHE_VERSION`.
"""
