"""`gpu17.py` at a size that runs in seconds on a CPU: the device command's rehearsal
(`benchmarks/device_run.sh --smoke`) and its test. The same stages, arms and evaluation
layout; 7x7 mazes, a 1-layer width-32 policy, a few steps of everything."""

import ml_collections

from sera_jax import config_files

gpu = config_files.sibling(__file__, "gpu17.py")


def get_config() -> ml_collections.ConfigDict:
    c = gpu.get_config()
    c.name = "maze17_gpu_tiny"
    c.task.size = 7
    c.task.num_train = 8
    c.task.num_eval = 4
    c.task.num_sft = 32
    c.task.max_new_tokens = 20
    c.model.overrides = ml_collections.ConfigDict(dict(
        attention_impl="dot_product", hidden_size=32, intermediate_size=64, num_layers=1,
        num_heads=2, num_kv_heads=1))
    c.sft.num_steps = 4
    c.sft.batch_size = 8
    c.sft.warmup_steps = 1
    c.sft.log_every = 2
    c.rl.num_steps = 2
    c.rl.prompts_per_step = 4
    c.rl.rollouts_per_prompt = 4
    c.rl.allocation.n_max = 12
    c.rl.sampling.batch_size = 16
    c.rl.micro_batch_size = 8
    c.rl.checkpoint_every = 1
    c.rl.log_every = 1
    c.compare.primary.k = 8
    c.compare.primary.window = 1
    c.compare.bootstrap = 100
    # A 1-layer policy after 4 SFT steps reads nothing: the rehearsal checks the code path,
    # not a result (the override is recorded in the outputs).
    c.compare.allow_blind_task = True
    c.eval.num_samples = 8
    c.eval.curve_samples = 8
    c.eval.every = 1
    c.eval.num_prompts = 4
    c.eval.train_prompts = 2
    c.eval.batch_size = 16
    return c
