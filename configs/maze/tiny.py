"""A seconds-long end-to-end maze run for tests: 5x5 mazes, a 1-layer width-32 policy,
3 SFT steps and 3 RL steps of 2 prompts x N0 8 per method (16 rollouts: two micro-batches
of one row per forced CPU device). The whole default pipeline of `cpu.py` at that size:
uniform, SERA, SERA + evidence cap, the null and the A/A controls (2 seeds each), the SFT
start scored at every evaluation point with that point's keys, the noise floor, the curve
statistics (Δ(t) bands, the primary endpoint, the gate, the A/A false-positive rate) and
the speed options."""

import ml_collections

from sera_jax import config_files

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    c = cpu.get_config()
    c.name = "maze_tiny"
    # A smoke config: every stage runs out of the box, as an exploration (no committed
    # pre-registration; every output says so). --config.compare.exploratory=False is refused.
    c.compare.exploratory = True
    c.task.size = 5
    c.task.num_train = 2  # there are only 4 distinct 5x5 perfect mazes
    c.task.num_eval = 1
    c.task.num_sft = 1
    c.task.max_new_tokens = 10
    c.model.overrides = ml_collections.ConfigDict(dict(
        hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1))
    c.sft.num_steps = 3
    c.sft.batch_size = 8
    c.sft.warmup_steps = 1
    c.sft.log_every = 1
    c.sft.checkpoint_every = 0
    c.rl.num_steps = 3
    c.rl.optimizer.learning_rate = 3e-5  # the tests' runs must move in 3 steps
    c.rl.prompts_per_step = 2
    c.rl.rollouts_per_prompt = 8
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 14
    c.rl.micro_batch_size = 8  # a multiple of the 8 forced CPU devices of the tests
    c.rl.train_length_bucket = 4
    c.rl.checkpoint_every = 1
    c.rl.log_every = 1
    c.eval.num_samples = 8
    c.eval.curve_samples = 8
    c.eval.every = 2
    c.eval.num_prompts = 1
    c.eval.train_prompts = 2
    c.eval.batch_size = 8
    c.eval.paired_noise = True  # the paired noise floor (final policies, noise keys too)
    c.compare.seeds = (0, 1)
    c.compare.null_seeds = ()  # = compare.seeds
    c.compare.aa_seeds = ()
    c.compare.primary.k = 8  # <= eval.curve_samples
    c.compare.primary.window = 2  # the points after step 0: 2 and 3
    c.compare.bootstrap = 200
    # 5x5 mazes (4 distinct): nothing to read, a blind guesser solves them; the tests run the
    # pipeline anyway (a documented exploration; test_validity checks the refusal).
    c.compare.allow_blind_task = True
    return c
