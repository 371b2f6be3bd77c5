r"""Accelerator smoke test of the maze paper setting: a few RL steps of a config from a freshly
initialised policy on its mesh; prints the compile step, the step time and tokens/s.

    python -m experiments.maze_smoke --config=configs/maze/maze17_paper.py --steps=3
    python -m experiments.maze_smoke --config=configs/maze/tiny.py --steps=2      # CPU check

No SFT, no checkpoints, nothing written. Multi-device through `--config.rl.mesh.*` (default:
every device on the data axis). The recipe is `sera_jax.studies.maze.smoke`.
"""

import json
import os

from absl import flags
from ml_collections import config_flags

from sera_jax.studies import common

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "configs", "maze", "maze17_paper.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "Experiment config file.")
_STEPS = flags.DEFINE_integer("steps", 3, "RL steps to run (the first one compiles).")
_METHOD = flags.DEFINE_string("method", "sera", "Method (sera_jax.methods).")


def main(argv):
    del argv
    from sera_jax.studies import maze  # after flag parsing: importing jax is slow

    def run():
        if _STEPS.value < 1:
            raise common.StudyError(f"--steps={_STEPS.value}; must be >= 1")
        method = common.parse_methods(_METHOD.value, "--method")[0]
        print(json.dumps(maze.smoke(_CONFIG.value, _STEPS.value, method), indent=1))

    common.main(run)


if __name__ == "__main__":
    common.run_app(main, _DEFAULT)
