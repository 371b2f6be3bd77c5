r"""Math reasoning: RL of a pretrained LM (MaxRL / SERA / peers) with verified answers, pass@k.

    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=/tmp/math_cpu
    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=... \
        --stage=rl --config.compare.methods=uniform,sera --config.rl.num_steps=20

Stages: `eval` (before / after RL + report), `rl`, `all` (default). The recipe is
`sera_jax.studies.math_reasoning`; the embedded model is set up with `make smollm2`.
"""

import os

from absl import flags
from ml_collections import config_flags

from sera_jax.studies import common

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "math", "cpu.py")
common.check_overrides(_DEFAULT)  # before the flags: a misspelt key names the nearest one
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_STAGE = flags.DEFINE_enum("stage", "all", ("all", "rl", "eval"), "Which stage to run.")


def main(argv):
    del argv
    from sera_jax.studies import math_reasoning  # after flag parsing: importing jax is slow

    def run():
        common.enable_compilation_cache(_WORKDIR.value)
        math_reasoning.run(_CONFIG.value, _WORKDIR.value, _STAGE.value)

    common.main(run)  # a missing model or file exits with one line naming the fix


if __name__ == "__main__":
    common.run_app(main, _DEFAULT)
