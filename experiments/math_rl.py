r"""Math RL on a pretrained LM, the paired protocol's math kind (`sera_jax.studies.paired`):
uniform vs SERA with paired seeds, the shuffled-reward null and A/A controls, curves at common
random numbers, a pre-registered primary endpoint.

    python -m experiments.math_rl --workdir=workdir/math_arith --stage=sft
    python -m experiments.math_rl --workdir=workdir/math_arith --stage=rl --seeds=0,2

Stages as experiments/maze.py (`sft` scores the pretrained start at every evaluation point:
there is no SFT); default config configs/math/smollm2_arith.py (its docstring has the
2-core command). Every stage resumes or skips finished work.
"""

from absl import flags

from sera_jax.studies import common
from sera_jax.studies.paired import study

_STAGE = flags.DEFINE_enum("stage", "all", study.STAGES, "Which stage(s) to run.")
_METHODS = flags.DEFINE_list("methods", None, "Methods (default: config.compare.methods).")
_SEEDS = flags.DEFINE_list("seeds", None, "RL seeds (default: config.compare.seeds).")

if __name__ == "__main__":
    common.binary(lambda config, workdir: study.run(config, workdir, _STAGE.value,
                                                    _METHODS.value, _SEEDS.value),
                  "configs/math/smollm2_arith.py")
