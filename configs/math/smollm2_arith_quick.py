r"""The quick math check (issue 38): one seed of uniform MaxRL beats the shuffled-reward null
on configs/math/smollm2_arith.py's task, in under 20 minutes on 2 idle CPU cores.

Everything not set here is smollm2_arith.py's: SmolLM2-135M-Instruct on small arithmetic,
P 8 x N0 8, lr 1e-5. Here: 30 RL steps of uniform and of the null (seed 0; SERA too, so the
primary endpoint is defined, but one seed decides nothing), evaluated at steps 0 and 30 on
64 held-out problems x 16 samples, no training-problem scoring, no A/A. With one seed the
gate's interval is the bootstrap over held-out problems (evaluation noise only; the report
says so), not a seed-level band.

    W=workdir/math_quick
    M="python -m experiments.math_rl --config=configs/math/smollm2_arith_quick.py --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=rl --methods=uniform & \
        taskset -c 1 $M --stage=rl --methods=sera & wait) && $M --stage=eval

(`--methods=uniform` runs uniform and its null; `--methods=sera` runs SERA alone.)
"""

import ml_collections

from sera_jax import config_files

full = config_files.sibling(__file__, "smollm2_arith.py")


def get_config() -> ml_collections.ConfigDict:
    c = full.get_config()
    c.name = "math_smollm2_arith_quick"
    c.rl.num_steps = 30
    c.compare.seeds = (0,)
    c.compare.null_seeds = (0,)
    c.compare.amendment = ""  # the default's amendment is not this config's
    c.compare.aa = False
    c.compare.primary.window = 1
    c.eval.every = 0  # points 0 and 30
    c.eval.num_prompts = 64
    c.eval.train_prompts = 0
    return c
