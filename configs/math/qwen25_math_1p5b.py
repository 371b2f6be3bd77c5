r"""The published Qwen2.5-Math run (SERA_SPEC §7): Qwen2.5-Math-1.5B on MATH levels 3-5
(8,192 problems), as a paired comparison (`sera_jax.studies.paired`, the math kind): uniform vs
SERA from the same pretrained start, the shuffled-reward null, curves at common random numbers.

Spec settings: N0 16, n_min 2, n_max 64, AdamW lr 1e-6, 600 steps, gradient clip 0.3, the
Qwen prompt ("\nPlease reason step by step, and put your final answer within \boxed{}.").
Not fixed by the spec (our choice): 128 prompts per step, responses <= 3072 tokens (the
model's 4096-token context minus a 1024-token prompt cap), the evaluation set and its 256
samples at T 0.6, top-p 0.95, the mesh, and the paired protocol's fields: the curve (16
samples per problem every 50 steps on the whole evaluation set and 128 training problems),
one seed per arm, the null control, the proposed primary endpoint (SERA − uniform on held-out
pass@16 averaged over steps 450-600).

Not pre-registered: `compare.exploratory = True`, so the RL stages run and every output says
"exploratory (not pre-registered)". Before a run that counts: set `compare.exploratory =
False`, fix the primary endpoint, seeds and controls, run `--stage=preregister` with the same
model / data paths (they are hashed) and commit the file it writes
(results/math/qwen25_math_1p5b/preregistration.json).

    M="python -m experiments.math_rl --config=configs/math/qwen25_math_1p5b.py \
        --workdir=... --config.model.path=/data/Qwen2.5-Math-1.5B \
        --config.task.train_path=/data/math/train --config.task.eval_path=/data/math500"
    $M --stage=sft && $M --stage=rl && $M --stage=eval

Data: MATH-style files (`problem` and `answer` or `solution` with \boxed{}, `level` like
"Level 3"), JSONL or Parquet; training keeps levels 3-5 (`task.train_levels`).
`task.num_train` / `task.num_eval` are the problem counts (8,192 and MATH-500's 500): the
protocol checks the batch and the evaluation against them and divides the ever-solved share
by `num_train`; give your files' counts if they differ.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "qwen25_math_1p5b"

    c.model.source = "hf"
    c.model.path = ""  # required: the Qwen2.5-Math-1.5B checkpoint directory
    c.model.param_dtype = "float32"
    c.model.dtype = "bfloat16"

    c.task.source = "files"
    c.task.train_path = ""  # required: MATH train (levels 3-5 are kept)
    c.task.eval_path = ""  # required: e.g. MATH-500
    c.task.format = "math"
    c.task.train_levels = (3, 4, 5)
    c.task.train_limit = 8192  # the spec's 8,192 problems
    c.task.num_train = 8192  # the problem counts (docstring)
    c.task.num_eval = 500
    c.task.template = "qwen"
    c.task.chat = True
    c.task.max_new_tokens = 3072
    c.task.max_prompt_len = 1024

    c.rl.num_steps = 600
    c.rl.prompts_per_step = 128
    c.rl.rollouts_per_prompt = 16
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 64
    c.rl.optimizer.learning_rate = 1e-6
    c.rl.optimizer.grad_clip = 0.3
    c.rl.sampling.temperature = 1.0
    c.rl.sampling.batch_size = 512
    c.rl.micro_batch_size = 64
    # All-fail / all-success groups have A = 0: pack the live rows into the first micro-batches
    # so the rest is skipped (same gradient up to float summation order; docs/results_speed.md).
    # It is part of the fingerprint: a run started before it was set resumes only with
    # --config.rl.skip_zero_advantage=False.
    # rl.train_length_bucket stays 0 (not measured at this scale: with thousands of rollouts
    # a step's longest one is likely at max_new_tokens, and every width costs a compile).
    c.rl.skip_zero_advantage = True
    c.rl.checkpoint_every = 25
    c.rl.log_every = 5
    # 1.5B parameters: weights ZeRO-3 over fsdp, rows over data x fsdp (e.g. v5p-16: fsdp 8).
    c.rl.mesh.data = -1
    c.rl.mesh.fsdp = 8
    c.rl.mesh.tensor = 1

    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0,)
    c.compare.null_seeds = (0,)
    # Proposed (fixed only by a pre-registration): SERA − uniform on held-out pass@16, the
    # mean over the last 4 points (steps 450-600).
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="eval", k=16,
                                                       window=4))
    c.compare.allow_blind_task = False  # the validity gate holds (cpu.py overrides it)
    c.compare.exploratory = True  # pre-register (--stage=preregister, committed) to count

    c.eval.num_samples = 256  # start and final policies
    c.eval.curve_samples = 16  # every evaluation point of the curve
    c.eval.every = 50  # points 0, 50, ..., 600
    c.eval.num_prompts = 500  # the whole evaluation set
    c.eval.train_prompts = 128  # training problems 0..127: the true p behind realised κ
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.batch_size = 1024
    return c
