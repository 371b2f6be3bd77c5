"""The maze θ sweep: SERA − uniform at the CPU default's batch shape (P 32, N0 8, n_max 64)
for active-set thresholds θ ∈ {0.05, 0.2, 0.5}, 3 seeds, from the default's SFT model.

Why: at the default θ = 0.05 two never-solved training mazes stay active and take ≈ 39 % of
SERA's budget (`docs/results_maze.md`); a larger θ drops prompts whose κ(p̂, n_max) < θ.
θ applies to SERA only; the uniform runs (θ-free) are the default comparison's, shared by
every θ, and the θ = 0.05 row is the default's SERA runs. Evaluation at the end only, as in
`regime_map.py` (a sweep of the same kind; both extend `cpu_16step.py` directly). Run with

    python -m experiments.maze --config=configs/maze/theta_sweep.py \\
        --workdir=workdir/maze_cpu --stage=regime

writes `results/theta_sweep.{json,md,png}`.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu_16step.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_theta_sweep"
    c.compare.exploratory = True  # a sweep, not a pre-registered comparison
    c.regime = ml_collections.ConfigDict()
    c.regime.prompts_per_step = (32,)  # the default's shape: its runs are reused
    c.regime.rollouts_per_prompt = (8,)
    c.regime.n_max_factor = 8  # n_max = min(8 · N0, n_max_cap) = 64, the default's
    c.regime.n_max_cap = 128
    c.regime.methods = ("uniform", "sera")
    c.regime.seeds = (0, 1, 2)
    c.regime.thresholds = (0.05, 0.2, 0.5)
    c.regime.output = "theta_sweep"  # results/<output>.{json,md,png}
    c.eval.every = 0  # final evaluation only (resumable: the default's runs are reused)
    return c
