"""The maze regime map: SERA − uniform over prompts per step P x rollouts per prompt N0, with
n_max tied to N0 (n_max = 8·N0), 3 seeds per cell, from the 16-step default's SFT model.

Every cell is the earlier 16-step default (`cpu_16step.py`: 16 RL steps, lr 1e-5, θ 0.05,
128 samples per maze on the 64 held-out and 32 training mazes) with another batch shape;
the cell of its shape (P 32, N0 8, n_max 64) reuses its comparison's runs in the same
workdir. Evaluation is at the end only (the curves are the comparison's job). Not for CI:
on 2 CPU cores it takes about an hour. Run with

    python -m experiments.maze --config=configs/maze/regime_map.py \
        --workdir=workdir/maze_cpu --stage=regime
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu_16step.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_regime_map"
    c.compare.exploratory = True  # a sweep, not a pre-registered comparison
    c.regime = ml_collections.ConfigDict()
    c.regime.prompts_per_step = (8, 16, 32)  # P (<= task.num_train = 32)
    c.regime.rollouts_per_prompt = (4, 8, 16)  # N0
    c.regime.n_max_factor = 8  # n_max = min(8 · N0, n_max_cap): SERA may give a hard maze 8x
    c.regime.n_max_cap = 128
    c.regime.methods = ("uniform", "sera")
    c.regime.seeds = (0, 1, 2)
    c.regime.thresholds = ()  # no θ axis: every method keeps its preset θ (theta_sweep.py)
    c.regime.output = "regime_map"  # results/<output>.{json,md,png}
    c.eval.every = 0  # final evaluation only (resumable: the default's runs are reused)
    return c
