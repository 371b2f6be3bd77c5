r"""Gradient alignment of allocated-rollout MaxRL gradients (image classification as one-step RL).

  python -m experiments.gradient_alignment \
      --config=configs/gradient_alignment/digits.py --workdir=/tmp/alignment_digits \
      [--config.mode=train] [--config.measure.budgets='(2,8,32)']

Modes (`config.mode`): `measure` (cosine to the exact gradient per training stage, budget and
method; writes alignment.csv, alignment.png, summary.md, TensorBoard scalars) and `train`
(RL training with one method, logging the cosine, CE, top-1 and analytic pass@k; writes
train_log.csv, summary.md, TensorBoard scalars). The markdown summary is printed at the end.
The recipe is `sera_jax.vision.study`.
"""

import os

from absl import flags
from ml_collections import config_flags

from sera_jax.studies import common

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "gradient_alignment", "digits.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "Path to a get_config() file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")


def main(argv):
    del argv
    from sera_jax.vision import study  # after flag parsing: importing jax is slow

    common.main(lambda: print(study.run(_CONFIG.value, _WORKDIR.value)["summary"]))


if __name__ == "__main__":
    common.run_app(main, _DEFAULT)
