r"""The published Qwen3 run (SERA_SPEC §7): Qwen3-4B-Base on POLARIS-53K, 1000 steps, as a
paired comparison (`sera_jax.studies.paired`, the math kind): uniform vs SERA from the same
pretrained start, the shuffled-reward null, curves at common random numbers.

Spec settings: 1000 steps, the Qwen prompt; the common MaxRL/SERA defaults (N0 16,
n_min 2, n_max 64). Not fixed by the spec (our choice): lr 1e-6 and gradient clip 0.3 as
for Qwen2.5-Math (configs/math/qwen25_math_1p5b.py), 128 prompts per step, responses <= 4096
tokens, the evaluation set, the mesh (tensor parallel over 4 devices, ZeRO-3 over fsdp), and
the paired protocol's fields: the curve (16 samples per problem every 100 steps on the whole
evaluation set and 128 training problems), one seed per arm, the null control, the proposed
primary endpoint (SERA − uniform on held-out pass@16 averaged over steps 800-1000).

Not pre-registered: `compare.exploratory = True`, so the RL stages run and every output says
"exploratory (not pre-registered)". Before a run that counts: set `compare.exploratory =
False`, fix the primary endpoint, seeds and controls, run `--stage=preregister` with the same
model / data paths (they are hashed) and commit the file it writes
(results/math/qwen3_4b_polaris/preregistration.json).

    M="python -m experiments.math_rl --config=configs/math/qwen3_4b_polaris.py \
        --workdir=... --config.model.path=/data/Qwen3-4B-Base \
        --config.task.train_path=/data/polaris-53k --config.task.eval_path=/data/aime24"
    $M --stage=sft && $M --stage=rl && $M --stage=eval

POLARIS rows have `problem` and `answer` (MATH-style loader). `task.num_train` /
`task.num_eval` are the problem counts (about 53,000; AIME 2024's 30): the protocol checks the
batch and the evaluation against them and divides the ever-solved share by `num_train`; give
your files' counts.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "qwen3_4b_polaris"

    c.model.source = "hf"
    c.model.path = ""  # required: the Qwen3-4B-Base checkpoint directory
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"

    c.task.source = "files"
    c.task.train_path = ""  # required: POLARIS-53K
    c.task.eval_path = ""  # required
    c.task.format = "math"
    c.task.train_limit = 0  # all 53K problems
    c.task.num_train = 53_000  # the problem counts (docstring)
    c.task.num_eval = 30
    c.task.template = "qwen"
    c.task.chat = True
    c.task.max_new_tokens = 4096
    c.task.max_prompt_len = 1024

    c.rl.num_steps = 1000
    c.rl.prompts_per_step = 128
    c.rl.rollouts_per_prompt = 16
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 64
    c.rl.optimizer.learning_rate = 1e-6
    c.rl.optimizer.grad_clip = 0.3
    c.rl.sampling.temperature = 1.0
    c.rl.sampling.batch_size = 256
    c.rl.micro_batch_size = 32
    # All-fail / all-success groups have A = 0: pack the live rows into the first micro-batches
    # so the rest is skipped (same gradient up to float summation order; docs/results_speed.md).
    # It is part of the fingerprint: a run started before it was set resumes only with
    # --config.rl.skip_zero_advantage=False.
    # rl.train_length_bucket stays 0 (not measured at this scale: with thousands of rollouts
    # a step's longest one is likely at max_new_tokens, and every width costs a compile).
    c.rl.skip_zero_advantage = True
    c.rl.checkpoint_every = 25
    c.rl.log_every = 5
    c.rl.mesh.data = -1
    c.rl.mesh.fsdp = 4
    c.rl.mesh.tensor = 4

    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0,)
    c.compare.null_seeds = (0,)
    # Proposed (fixed only by a pre-registration): SERA − uniform on held-out pass@16, the
    # mean over the last 3 points (steps 800-1000).
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="eval", k=16,
                                                       window=3))
    c.compare.allow_blind_task = False  # the validity gate holds (cpu.py overrides it)
    c.compare.exploratory = True  # pre-register (--stage=preregister, committed) to count

    c.eval.num_samples = 256  # start and final policies
    c.eval.curve_samples = 16  # every evaluation point of the curve
    c.eval.every = 100  # points 0, 100, ..., 1000
    c.eval.num_prompts = 30  # the whole evaluation set
    c.eval.train_prompts = 128  # training problems 0..127: the true p behind realised κ
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.batch_size = 1024
    return c
