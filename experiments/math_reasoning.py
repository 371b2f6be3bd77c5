r"""Math reasoning: RL of a pretrained LM (MaxRL / SERA / peers) with verified answers, pass@k
before and after (`sera_jax.studies.math_reasoning`; the embedded model: `make smollm2`).

    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=/tmp/math_cpu
    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=... \
        --stage=rl --config.compare.methods="('uniform', 'sera')" --config.rl.num_steps=20

Stages: `eval` (before / after RL + report), `rl`, `all` (default); each resumes or skips
finished work. Prints the pass@k table at the end of `eval` / `all`.
"""

from absl import flags

from sera_jax.studies import common
from sera_jax.studies import math_reasoning as study

_STAGE = flags.DEFINE_enum("stage", "all", study.STAGES, "Which stage to run.")

if __name__ == "__main__":
    common.binary(lambda config, workdir: study.run(config, workdir, _STAGE.value),
                  "configs/math/cpu.py")
