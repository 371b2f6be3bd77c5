r"""Gradient alignment of allocated-rollout MaxRL gradients (image classification as one-step
RL; `sera_jax.studies.alignment`).

  python -m experiments.gradient_alignment \
      --config=configs/gradient_alignment/digits.py --workdir=/tmp/alignment_digits \
      [--config.mode=train] [--config.measure.budgets='(2,8,32)']

`config.mode`: `measure` (cosine to the exact gradient per CE stage, budget and method;
alignment.csv, alignment.png, summary.md, TensorBoard) or `train` (RL training with
`config.rl.method`; train_log.csv, summary.md, TensorBoard). The summary is printed.
"""

from sera_jax.studies import common
from sera_jax.studies.alignment import study

if __name__ == "__main__":
    common.binary(study.run, "configs/gradient_alignment/digits.py")
