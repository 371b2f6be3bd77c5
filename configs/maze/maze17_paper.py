"""The published maze protocol (SERA_SPEC §7): 17x17 mazes, the 4-layer maze policy, SFT
1500 x 32, then 3000 RL steps of 256 prompts x N0 128 (n_min 2, n_max 512, AdamW lr 1e-4,
T = 1.0, responses <= 180 tokens) on 7,424 training mazes; evaluation with 2048 samples
per held-out maze. Sized for an accelerator pod: set `rl.mesh` to the slice, e.g.
`--config.rl.mesh.data=-1 --config.rl.mesh.fsdp=4`. One command runs it end to end:

    python -m experiments.maze --config=configs/maze/maze17_paper.py --workdir=...

and `python -m experiments.maze_smoke --config=configs/maze/maze17_paper.py --steps=3`
times a few RL steps of it (step time, tokens/s) on whatever accelerator is attached.
"""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu_16step.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze17_paper"
    c.task.size = 17  # 310-token prompts, answers <= 128 tokens
    c.task.num_train = 7424
    c.task.num_eval = 256
    c.task.num_sft = 16384
    c.task.max_new_tokens = 180

    c.model.preset = "maze_policy"  # 4 layers, hidden 256, FFN 1024, 4 heads / 2 KV heads
    c.model.overrides = ml_collections.ConfigDict()

    c.sft.num_steps = 1500
    c.sft.batch_size = 32
    c.sft.learning_rate = 5e-4
    c.sft.warmup_steps = 0
    c.sft.log_every = 50
    c.sft.checkpoint_every = 500

    c.rl.num_steps = 3000
    c.rl.prompts_per_step = 256
    c.rl.rollouts_per_prompt = 128
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 512
    c.rl.optimizer.learning_rate = 1e-4
    c.rl.sampling.temperature = 1.0
    c.rl.sampling.batch_size = 8192  # rows per sampler call (budget 32,768)
    c.rl.micro_batch_size = 2048  # rows per gradient micro-batch
    # All-fail / all-success groups have A = 0: pack the live rows into the first micro-batches
    # so the rest is skipped (same gradient up to float summation order; docs/results_speed.md).
    # It is part of the fingerprint: a run started before it was set resumes only with
    # --config.rl.skip_zero_advantage=False.
    # rl.train_length_bucket stays 0 (not measured at this scale: with thousands of rollouts
    # a step's longest one is likely at max_new_tokens, and every width costs a compile).
    c.rl.skip_zero_advantage = True
    c.rl.checkpoint_every = 100
    c.rl.log_every = 10

    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0, 1, 2)
    # lr frontier around the published lr (`--stage=frontier`; it also needs a
    # compare.primary, as configs/maze/cpu.py sets, for its metric and window).
    c.frontier = ml_collections.ConfigDict(dict(
        learning_rates=(3e-5, 1e-4, 3e-4), methods=("uniform", "sera"), seeds=(0, 1, 2),
        null=True, null_seeds=(0, 1)))

    c.eval.num_samples = 2048
    c.eval.curve_samples = 256
    c.eval.every = 250
    c.eval.num_prompts = 256
    c.eval.train_prompts = 256  # training mazes scored for realised κ (ids < 256)
    c.eval.batch_size = 8192
    return c
