r"""Maze navigation: SFT from scratch, then RL of each method x seed and the null control,
then the paired comparison with CIs and the noise floor.

    python -m experiments.maze --config=configs/maze/cpu.py --workdir=/tmp/maze_cpu
    python -m experiments.maze --config=configs/maze/cpu.py --workdir=... --stage=rl \
        --methods=sera --seeds=0 --config.rl.num_steps=100
    python -m experiments.maze --config=configs/maze/regime_map.py --workdir=... --stage=regime

Stages: `sft`, `rl`, `eval` (aggregate), `all` (default) = sft + rl + eval, `compare` =
rl + eval, `regime` = the regime map; each resumes or skips finished work. The recipe is
`sera_jax.studies.maze`.
"""

import os

from absl import flags
from ml_collections import config_flags

from sera_jax.studies import common

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "maze", "cpu.py")
common.check_overrides(_DEFAULT)  # before the flags: a misspelt key names the nearest one
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (resumable).")
_STAGE = flags.DEFINE_enum("stage", "all", ("sft", "rl", "eval", "all", "compare", "regime"),
                           "Which stage(s) to run.")
_METHODS = flags.DEFINE_string("methods", None, "Comma list of methods (sera_jax.methods; "
                               "default: config.compare.methods).")
_SEEDS = flags.DEFINE_string("seeds", None, "Comma list of RL seeds (default: "
                             "config.compare.seeds).")


def main(argv):
    del argv
    from sera_jax.studies import maze  # after flag parsing: importing jax is slow

    def run():
        methods = common.parse_methods(_METHODS.value, "--methods") if _METHODS.value else None
        seeds = common.parse_list(_SEEDS.value, int, "--seeds") if _SEEDS.value else None
        common.enable_compilation_cache(_WORKDIR.value)
        maze.run(_CONFIG.value, _WORKDIR.value, _STAGE.value, methods, seeds)

    common.main(run)


if __name__ == "__main__":
    common.run_app(main, _DEFAULT)
