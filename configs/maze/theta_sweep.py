"""The maze θ sweep: SERA − uniform at the CPU default's batch shape (P 32, N0 8, n_max 64)
for active-set thresholds θ ∈ {0.05, 0.2, 0.5}, 3 seeds, from the default's SFT model.

Why: at the default θ = 0.05 two never-solved training mazes stay active and take ≈ 39 % of
SERA's budget (`docs/results_maze.md`); a larger θ drops prompts whose κ(p̂, n_max) < θ.
θ applies to SERA only; the uniform runs (θ-free) are the default comparison's, shared by
every θ, and the θ = 0.05 row is the default's SERA runs. Run with

    python -m experiments.maze --config=configs/maze/theta_sweep.py \\
        --workdir=workdir/maze_cpu --stage=regime

writes `results/theta_sweep.{json,md,png}`.
"""

import ml_collections

from sera_jax import config_files

regime_map = config_files.sibling(__file__, "regime_map.py")


def get_config() -> ml_collections.ConfigDict:
    c = regime_map.get_config()
    c.name = "maze_theta_sweep"
    c.regime.prompts_per_step = "32"
    c.regime.rollouts_per_prompt = "8"
    c.regime.thresholds = "0.05,0.2,0.5"
    c.regime.output = "theta_sweep"
    return c
