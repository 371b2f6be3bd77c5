r"""Accelerator smoke test of the maze paper setting: a few RL steps of a config from a freshly
initialised policy on its mesh; prints the compile step, the step time and tokens/s.

    python -m experiments.maze_smoke --config=configs/maze/maze17_paper.py --steps=3
    python -m experiments.maze_smoke --config=configs/maze/tiny.py --steps=2      # CPU check

No SFT, no checkpoints, nothing written (--workdir only holds the compilation cache).
Multi-device through `--config.rl.mesh.*` (default: every device on the data axis). The
recipe is `sera_jax.studies.paired.smoke`.
"""

import json

from absl import flags

from sera_jax.studies import common
from sera_jax.studies.paired import accelerator

_STEPS = flags.DEFINE_integer("steps", 3, "RL steps to run (the first one compiles).")
_METHOD = flags.DEFINE_string("method", "sera", "Method (a name of sera_jax.methods.METHODS).")

if __name__ == "__main__":
    common.binary(lambda config, workdir: print(json.dumps(
        accelerator.smoke(config, _STEPS.value, _METHOD.value), indent=1)),
        "configs/maze/maze17_paper.py")
