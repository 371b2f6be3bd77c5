r"""Allocation lab: every method of `config.compare.methods` trains a softmax policy over
candidate answers on the paired seeds `config.compare.seeds` (`sera_jax.studies.lab`).

  python -m experiments.allocation_lab --config=configs/allocation_lab/cpu.py \
      --workdir=/tmp/allocation_lab [--config.regime.enabled=False]

Writes summary.md (printed at the end), final.csv, regime.csv, results.npz and figures.
"""

from sera_jax.studies import common
from sera_jax.studies.lab import study

if __name__ == "__main__":
    common.binary(study.run, "configs/allocation_lab/cpu.py")
