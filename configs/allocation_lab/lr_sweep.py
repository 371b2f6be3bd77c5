"""Allocation lab, lr selection (issue 25): each method's frontier over an lr grid and a θ table.

For every lr of `sweep.learning_rates`: uniform and SERA with the null and A/A arms on the
main cell's task and 64 paired seeds; the gate per lr (uniform − null pass@1 CI above 0);
each method's point (held-out pass@1, pass@256) with CIs; the selected lr = the admissible
one where uniform's pass@256 is best (the baseline tuned on the compared metric); whether
SERA's points lie above uniform's frontier; then SERA − uniform for each θ of
`sweep.thetas` at the selected lr. The main cell runs as in the CPU default; the maze family,
maze cell and regime map are off.

  python -m experiments.allocation_lab --config=configs/allocation_lab/lr_sweep.py \
      --workdir=/tmp/allocation_lab_lr

The grid (cpu.py's `sweep.learning_rates`) is 0.001 ... 0.05: the first sweep selected 0.005,
then its lower edge. ≈ 6 compiled lr settings × 3 runners plus 5 θ runners; the 4-lr grid
was estimated at 5–10 min on 2 idle cores, so expect about 1.5 times that.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "allocation_lab_lr_sweep"
    c.compare.methods = ("uniform", "sera")
    c.report.challengers = ()
    c.sweep.enabled = True
    c.maze_family.enabled = False
    c.maze_cell.enabled = False
    c.regime.enabled = False
    return c
