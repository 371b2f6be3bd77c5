r"""Maze navigation: SFT from scratch, then RL of each method x seed and the null control,
then the paired comparison with CIs and the noise floor (`sera_jax.studies.maze`).

    python -m experiments.maze --config=configs/maze/cpu.py --workdir=/tmp/maze_cpu
    python -m experiments.maze --config=configs/maze/cpu.py --workdir=... --stage=rl \
        --methods=sera --seeds=0 --config.rl.num_steps=100
    python -m experiments.maze --config=configs/maze/regime_map.py --workdir=... --stage=regime

Stages: `sft`, `rl`, `eval` (aggregate), `all` (default) = sft + rl + eval, `compare` =
rl + eval, `regime` = the regime map, `frontier`, `matched` (the lr-matched arm),
`preregister` (write results/maze/<name>/preregistration.json; commit it before any RL run),
`export` (raw results under results/maze/<name>/; `python results/maze/recompute.py
results/maze/<name>` recomputes the tables); each resumes or skips finished work.
"""

from absl import flags

from sera_jax.studies import common
from sera_jax.studies.maze import study

_STAGE = flags.DEFINE_enum("stage", "all", study.STAGES, "Which stage(s) to run.")
_METHODS = flags.DEFINE_list("methods", None, "Methods, names of sera_jax.methods.METHODS "
                             "(default: config.compare.methods).")
_SEEDS = flags.DEFINE_list("seeds", None, "RL seeds (default: config.compare.seeds).")

if __name__ == "__main__":
    common.binary(lambda config, workdir: study.run(config, workdir, _STAGE.value,
                                                    _METHODS.value, _SEEDS.value),
                  "configs/maze/cpu.py")
