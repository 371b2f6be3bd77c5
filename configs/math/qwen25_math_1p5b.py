"""The published Qwen2.5-Math run (SERA_SPEC §7): Qwen2.5-Math-1.5B on MATH levels 3-5
(8,192 problems).

Spec settings: N0 16, n_min 2, n_max 64, AdamW lr 1e-6, 600 steps, gradient clip 0.3, the
Qwen prompt ("\\nPlease reason step by step, and put your final answer within \\boxed{}.").
Not fixed by the spec (our choice): 128 prompts per step, responses <= 3072 tokens (the
model's 4096-token context minus a 1024-token prompt cap), the evaluation set and its 256
samples at T 0.6, top-p 0.95, the mesh.

    python -m experiments.math_reasoning --config=configs/math/qwen25_math_1p5b.py \
        --workdir=... --config.model.path=/data/Qwen2.5-Math-1.5B \
        --config.task.train_path=/data/math/train --config.task.eval_path=/data/math500

Data: MATH-style files (`problem` and `answer` or `solution` with \\boxed{}, `level` like
"Level 3"), JSONL or Parquet; training keeps levels 3-5 (`task.train_levels`).
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

    c.eval.num_samples = 256
    c.eval.num_prompts = 100_000
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.batch_size = 1024
    return c
