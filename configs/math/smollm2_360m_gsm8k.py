r"""The published SmolLM2 math run (SERA_SPEC §7): SmolLM2-360M-Instruct on GSM8K train,
evaluated on GSM8K-Platinum, as a paired comparison (`sera_jax.studies.paired`, the math
kind): uniform vs SERA from the same pretrained start, the shuffled-reward null, curves at
common random numbers.

Spec settings: N0 16, n_min 2, n_max 64, AdamW lr 1e-5, 2000 steps, the SmolLM prompt
(" Let's think step by step and output the final answer within \boxed{}."), responses
<= 2048 tokens (truncated = wrong), evaluation with 256 samples at T 0.6, top-p 0.95.
Not fixed by the spec (our choice): 128 prompts per step, micro-batches, the mesh, and the
paired protocol's fields: the curve (16 samples per problem every 100 steps on the whole
evaluation set and 128 training problems), one seed per arm, the null control, the proposed
primary endpoint (SERA − uniform on held-out pass@16 averaged over steps 1600-2000).

Not pre-registered: `compare.exploratory = True`, so the RL stages run and every output says
"exploratory (not pre-registered)". Before a run that counts: set `compare.exploratory =
False`, fix the primary endpoint, seeds and controls, run `--stage=preregister` with the same
model / data paths (they are hashed) and commit the file it writes
(results/math/smollm2_360m_gsm8k/preregistration.json).

Weights and data come from user paths (nothing downloads):

    M="python -m experiments.math_rl --config=configs/math/smollm2_360m_gsm8k.py \
        --workdir=gs://.../smollm2_gsm8k \
        --config.model.path=/data/SmolLM2-360M-Instruct \
        --config.task.train_path=/data/gsm8k/train.jsonl \
        --config.task.eval_path=/data/gsm8k_platinum/test.parquet"
    $M --stage=sft && $M --stage=rl && $M --stage=eval

`model.path` is a Hugging Face directory (config.json, *.safetensors, tokenizer.json,
tokenizer_config.json); the data files are GSM8K-style (`question`, `answer` with
'#### <answer>'), JSONL or Parquet. `task.num_train` / `task.num_eval` are the files' problem
counts (GSM8K train 7,473, GSM8K-Platinum 1,209): the protocol checks the batch and the
evaluation against them and divides the ever-solved share by `num_train`; give your files'
counts if they differ. Multi-host: `--config.rl.multihost.enabled=True`.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "smollm2_360m_gsm8k"

    c.model.source = "hf"
    c.model.path = ""  # required: the SmolLM2-360M-Instruct checkpoint directory
    c.model.param_dtype = "float32"  # master weights; compute in bfloat16
    c.model.dtype = "bfloat16"

    c.task.source = "files"
    c.task.train_path = ""  # required: GSM8K train (file or directory)
    c.task.eval_path = ""  # required: GSM8K-Platinum test (file or directory)
    c.task.format = "gsm8k"
    c.task.num_train = 7473  # the files' problem counts (docstring)
    c.task.num_eval = 1209
    c.task.template = "smollm"
    c.task.chat = True
    c.task.max_new_tokens = 2048
    c.task.max_prompt_len = 512

    c.rl.num_steps = 2000
    c.rl.prompts_per_step = 128
    c.rl.rollouts_per_prompt = 16  # N0
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 64
    c.rl.optimizer.learning_rate = 1e-5
    c.rl.optimizer.grad_clip = 1.0
    c.rl.sampling.temperature = 1.0
    c.rl.sampling.batch_size = 512  # rows per sampler call (divides the 2048-rollout budget)
    c.rl.micro_batch_size = 128  # gradient accumulation: 16 micro-batches
    # All-fail / all-success groups have A = 0: pack the live rows into the first micro-batches
    # so the rest is skipped (same gradient up to float summation order; docs/results_speed.md).
    # It is part of the fingerprint: a run started before it was set resumes only with
    # --config.rl.skip_zero_advantage=False.
    # rl.train_length_bucket stays 0 (not measured at this scale: with thousands of rollouts
    # a step's longest one is likely at max_new_tokens, and every width costs a compile).
    c.rl.skip_zero_advantage = True
    c.rl.aggregation = "token_mean"
    c.rl.checkpoint_every = 50
    c.rl.max_checkpoints_to_keep = 3
    c.rl.log_every = 10
    # Rows over data x fsdp, weights ZeRO-3 over fsdp (e.g. a v5e-16 / 2x8 GPUs).
    c.rl.mesh.data = -1
    c.rl.mesh.fsdp = 1
    c.rl.mesh.tensor = 1

    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0,)
    c.compare.null_seeds = (0,)
    # Proposed (fixed only by a pre-registration): SERA − uniform on held-out pass@16, the
    # mean over the last 5 points (steps 1600-2000).
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="eval", k=16,
                                                       window=5))
    c.compare.allow_blind_task = False  # the validity gate holds (cpu.py overrides it)
    c.compare.exploratory = True  # pre-register (--stage=preregister, committed) to count

    c.eval.num_samples = 256  # the spec's evaluation (start and final policies)
    c.eval.curve_samples = 16  # every evaluation point of the curve
    c.eval.every = 100  # points 0, 100, ..., 2000
    c.eval.num_prompts = 1209  # the whole evaluation set
    c.eval.train_prompts = 128  # training problems 0..127: the true p behind realised κ
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.batch_size = 1024
    return c
