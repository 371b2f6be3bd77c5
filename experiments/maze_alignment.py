r"""Gradient alignment on the maze policy (`sera_jax.studies.paired.alignment`): cosine of
SERA's and uniform's batch gradient (budget P·N0) to a high-N estimate of the exact
likelihood gradient, for the SFT start and the latest checkpoints of the uniform run, with
paired differences over repetitions; writes <workdir>/results/alignment.{json,md}.

    python -m experiments.maze --config=configs/maze/tiny.py --workdir=/tmp/maze_al --stage=sft
    python -m experiments.maze_alignment --config=configs/maze/tiny.py --workdir=/tmp/maze_al \
        --config.alignment.reference_samples=16 --config.alignment.repetitions=2
    python -m experiments.maze_alignment --workdir=workdir/maze_read

The workdir is the paired study's (its `sft/` and `rl/uniform/seed0/`); each repetition is
cached under <workdir>/alignment/, so a re-run continues. Fields: `config.alignment`. At
`cpu_read.py` size one repetition takes 30-45 s on one core (N_ref = 256 rollouts of 32
mazes and their gradients: ~85 %), the default run (start + 2 checkpoints, 16 each) ~30 min.
"""

from sera_jax.studies import common
from sera_jax.studies.paired import alignment

if __name__ == "__main__":
    common.binary(alignment.run, "configs/maze/cpu_read.py")
