r"""Allocation lab: a controlled RL testbed with exact success probabilities.

  python -m experiments.allocation_lab --config=configs/allocation_lab/cpu.py \
      --workdir=/tmp/allocation_lab [--config.num_seeds=128] [--config.regime.enabled=False]

Every method of `config.methods` (names of `sera_jax.methods.METHODS`) trains a softmax policy
over candidate answers on paired seeds (`sera_jax.lab`); writes summary.md (printed at the end),
final.csv, regime.csv, results.npz and figures to --workdir.
"""

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    from sera_jax.lab import study  # after flag parsing: importing jax is slow

    logging.info("config:\n%s", _CONFIG.value)
    result = study.run(_CONFIG.value, _WORKDIR.value)
    print(result["summary"])


if __name__ == "__main__":
    app.run(main)
