r"""Gradient alignment of allocated-rollout MaxRL gradients (image classification as one-step RL).

  python experiments/gradient_alignment.py \
      --config=configs/gradient_alignment/digits.py --workdir=/tmp/alignment_digits \
      [--config.mode=train] [--config.measure.budgets='(2,8,32)']

Modes (`config.mode`): `measure` (cosine to the exact gradient per training stage, budget and
allocator; writes alignment.csv, alignment.png, summary.md, TensorBoard scalars) and `train`
(RL training with one allocator, logging the cosine, CE, top-1 and analytic pass@k; writes
train_log.csv, summary.md, TensorBoard scalars). The markdown summary is printed at the end.
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
    from sera_jax.vision import study  # after flag parsing: importing jax is slow

    logging.info("config:\n%s", _CONFIG.value)
    result = study.run(_CONFIG.value, _WORKDIR.value)
    print(result["summary"])


if __name__ == "__main__":
    app.run(main)
