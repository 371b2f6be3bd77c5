r"""Allocation lab: a controlled RL testbed with exact success probabilities.

  python -m experiments.allocation_lab --config=configs/allocation_lab/cpu.py \
      --workdir=/tmp/allocation_lab [--config.num_seeds=128] [--config.regime.enabled=False]

Every method of `config.methods` (names of `sera_jax.methods.METHODS`) trains a softmax policy
over candidate answers on paired seeds (`sera_jax.studies.lab`);
writes summary.md (printed at the end),
final.csv, regime.csv, results.npz and figures to --workdir.
"""

import os

from sera_jax.studies import common

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    common.summary_binary("sera_jax.studies.lab.study",
                          os.path.join(_ROOT, "configs", "allocation_lab", "cpu.py"))
