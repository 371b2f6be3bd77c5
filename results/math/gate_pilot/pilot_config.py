"""The RL gate pilot of issue 38 (results/math/gate_pilot/stamp.json): configs/math/cpu.py
with the small24_nl task, 128 / 128 problems, P 8 x N0 8, lr 1e-5, 40 steps, 128 x 16
held-out samples at T 1. Run by experiments/math_reasoning.py (before / after only) at commit
3402747; that binary has been removed since, and configs/math/cpu.py (which this extends) is
now a paired-study config: re-run it from a checkout of that commit."""
import os

from sera_jax import config_files

cpu = config_files.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "..", "..", "..", "configs", "math", "cpu.py"))

def get_config():
    c = cpu.get_config()
    c.name = "math_gate_pilot"
    t = c.task
    t.steps = (1,)
    t.templates = "small_add,small_sub,small_mul"
    t.template = "number"
    t.max_new_tokens = 24
    t.stop_at_newline = True
    t.num_train = 128
    t.num_eval = 128
    r = c.rl
    r.num_steps = 40
    r.prompts_per_step = 8
    r.rollouts_per_prompt = 8
    r.allocation.n_min = 2
    r.allocation.n_max = 32
    r.optimizer.learning_rate = 1e-5
    r.share_prompt_prefix = True
    r.skip_zero_advantage = True
    r.micro_batch_size = 8
    r.train_length_bucket = 8
    r.checkpoint_every = 10
    r.log_every = 1
    r.shuffle_rewards = False
    c.compare.methods = ("uniform",)
    e = c.eval
    e.num_samples = 16
    e.num_prompts = 128
    e.temperature = 1.0
    e.top_p = 1.0
    e.batch_size = 64
    return c
