r"""The quick two-step math check (issue 49): one seed of uniform MaxRL, SERA and the
shuffled-reward null on configs/math/smollm2_steps.py's task, in about 20 minutes on 2 CPU
cores. One seed decides nothing: it shows the stages run and what the per-sample outcome
report looks like; the comparison is the default's 8 seeds.

Everything not set here is smollm2_steps.py's (SmolLM2-135M-Instruct, the format-ready
few-shot start, P 8 x N0 8, lr 1e-5). Here: 20 RL steps, evaluated at steps 0 and 20 on 32
sealed-test and 32 held-out problems x 8 samples, no training-problem scoring, no A/A. With
one seed the gate's interval is the bootstrap over problems (evaluation noise only; the
report says so), not a seed-level band.

    W=workdir/math_steps_quick
    M="python -m experiments.math_rl --config=configs/math/smollm2_steps_quick.py --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=rl --methods=uniform & \
        taskset -c 1 $M --stage=rl --methods=sera & wait) && $M --stage=eval
"""

import ml_collections

from sera_jax import config_files

full = config_files.sibling(__file__, "smollm2_steps.py")


def get_config() -> ml_collections.ConfigDict:
    c = full.get_config()
    c.name = "math_smollm2_steps_quick"
    c.rl.num_steps = 20
    c.compare.seeds = (0,)
    c.compare.null_seeds = (0,)
    c.compare.aa = False
    c.compare.aa_seeds = ()
    c.compare.primary.window = 1
    c.frontier.seeds = (0,)
    c.frontier.null_seeds = (0,)
    c.eval.every = 0  # points 0 and 20
    c.eval.num_prompts = 32
    c.eval.test_prompts = 32
    c.eval.train_prompts = 0
    return c
