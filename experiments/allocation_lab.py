r"""Allocation lab: a controlled RL testbed with exact success probabilities.

  python -m experiments.allocation_lab --config=configs/allocation_lab/cpu.py \
      --workdir=/tmp/allocation_lab [--config.num_seeds=128] [--config.regime.enabled=False]

Every method of `config.methods` (names of `sera_jax.methods.METHODS`) trains a softmax policy
over candidate answers on paired seeds (`sera_jax.lab`); writes summary.md (printed at the end),
final.csv, regime.csv, results.npz and figures to --workdir.
"""

import os

from absl import flags
from ml_collections import config_flags

from sera_jax.studies import common

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "allocation_lab", "cpu.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "Path to a get_config() file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")


def main(argv):
    del argv
    from sera_jax.lab import study  # after flag parsing: importing jax is slow

    common.main(lambda: print(study.run(_CONFIG.value, _WORKDIR.value)["summary"]))


if __name__ == "__main__":
    common.run_app(main, _DEFAULT)
