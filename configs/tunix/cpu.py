"""SERA in tunix on CPU: a tiny random-weight Llama-3 (2 layers, width 32, digit tokenizer) on
8 embedded arithmetic problems, 4 prompts x N0 4 = 16 rollouts per step for 6 steps (one
epoch = 2 steps, so SERA allocates from the success history from step 3 on), through
tunix's vanilla JAX rollout. Uniform (= tunix GRPO with the `maxrl` estimator) and SERA run
from the same seed. A few minutes on 2 CPU cores:

    python -m experiments.tunix_sera --workdir=/tmp/tunix_sera
"""

import ml_collections

from sera_jax import optim


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "tunix_sera_cpu"
    c.seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.layers = 2
    c.model.dim = 32

    c.task = ml_collections.ConfigDict()
    c.task.num_prompts = 8  # M: the dataset; prompt ids 0..M-1 key the history
    c.task.templates = "add,mul"  # one-step problems of sera_jax.tasks.mathqa.problems

    c.rl = ml_collections.ConfigDict()
    c.rl.num_steps = 6
    c.rl.prompts_per_step = 4  # P
    c.rl.rollouts_per_prompt = 4  # N0 (tunix's num_generations); budget B = P*N0
    c.rl.method = "sera"  # a name of sera_jax.methods.METHODS (when compare.methods is empty)
    c.rl.max_new_tokens = 4
    c.rl.temperature = 1.0
    c.rl.max_rounds = 4  # generation rounds per batch for a dynamic-sampling method
    c.rl.allocation = ml_collections.ConfigDict()
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 8
    c.rl.allocation.threshold = ml_collections.FieldReference(None, field_type=float)
    c.rl.allocation.unseen = "fill"
    c.rl.optimizer = optim.get_config(name="sgd", learning_rate=0.05, grad_clip=0.0,
                                      weight_decay=0.0, momentum=0.0)
    c.rl.history = ml_collections.ConfigDict()
    c.rl.history.alpha = 0.5
    c.rl.history.beta = 0.5
    c.rl.history.gamma = 0.75

    c.compare = ml_collections.ConfigDict()
    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0,)
    c.compare.baseline = "uniform"
    return c
