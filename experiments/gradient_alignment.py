r"""Gradient alignment of allocated-rollout MaxRL gradients (image classification as one-step RL).

  python -m experiments.gradient_alignment \
      --config=configs/gradient_alignment/digits.py --workdir=/tmp/alignment_digits \
      [--config.mode=train] [--config.measure.budgets='(2,8,32)']

Modes (`config.mode`): `measure` (cosine to the exact gradient per training stage, budget and
method; writes alignment.csv, alignment.png, summary.md, TensorBoard scalars) and `train`
(RL training with one method, logging the cosine, CE, top-1 and analytic pass@k; writes
train_log.csv, summary.md, TensorBoard scalars). The markdown summary is printed at the end.
The recipe is `sera_jax.studies.alignment.study`.
"""

import os

from sera_jax.studies import common

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    common.summary_binary("sera_jax.studies.alignment.study",
                          os.path.join(_ROOT, "configs", "gradient_alignment", "digits.py"))
