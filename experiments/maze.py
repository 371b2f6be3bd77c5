r"""Maze navigation, the paired protocol's maze kind (`sera_jax.studies.paired`): SFT from
scratch, RL of each method x seed with the null and A/A controls, the paired comparison.

    python -m experiments.maze --config=configs/maze/tiny.py --workdir=/tmp/maze_tiny
    python -m experiments.maze --config=configs/maze/tiny.py --workdir=/tmp/maze_tiny \
        --stage=rl --methods=sera --seeds=0 --config.rl.num_steps=1
    python -m experiments.maze --config=configs/maze/regime_map.py --workdir=... --stage=regime

`tiny.py` is a seconds-long smoke config run as an exploration (`compare.exploratory=True`:
no pre-registration; every output says so). The default config, `cpu_read.py` (read the
maze), is pre-registered: its RL stages need the committed file. Stages: `sft`, `rl`, `eval`,
`all` (default), `compare` = rl + eval, `regime`, `frontier`, `matched`, `norm_matched`,
`preregister`, `amend`, `export` (results/maze/<name>/; `python results/maze/recompute.py
results/maze/<name>` recomputes the tables); each resumes or skips finished work.
"""

from absl import flags

from sera_jax.studies import common
from sera_jax.studies.paired import study

_STAGE = flags.DEFINE_enum("stage", "all", study.STAGES, "Which stage(s) to run.")
_METHODS = flags.DEFINE_list("methods", None, "Methods, names of sera_jax.methods.METHODS "
                             "(default: config.compare.methods).")
_SEEDS = flags.DEFINE_list("seeds", None, "RL seeds (default: config.compare.seeds).")

if __name__ == "__main__":
    common.binary(lambda config, workdir: study.run(config, workdir, _STAGE.value,
                                                    _METHODS.value, _SEEDS.value),
                  "configs/maze/cpu_read.py")
