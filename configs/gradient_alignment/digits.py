"""Gradient-alignment study on scikit-learn's bundled 8x8 digits: the CPU default.

Real data, no download, a small NNX ResNet (~19.8k parameters). Measure mode trains the
ResNet with cross-entropy and measures at three snapshots (initial / partly trained / well
trained), budgets N0 = 2..128 and ten methods, with paired draws for error bars.
Whole run: a few minutes on 2 CPU cores (see docs/results_alignment.md for the measured time).

  python experiments/gradient_alignment.py --config=configs/gradient_alignment/digits.py \
      --workdir=/tmp/alignment_digits [--config.mode=train] [--config.measure.num_draws=64]
"""

import ml_collections

# Names of sera_jax.methods.METHODS (the same in every study); the last two are the rules
# beyond the paper (sera_sequential is two-stage: a pilot of n_min labels per image first).
METHODS = ("uniform", "sera", "sera_equalized", "sera_no_multiplicity",
           "sera_paper_rounding", "inverse_p", "knapsack", "hit_utility", "sera_posterior",
           "sera_sequential")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "gradient_alignment_digits"
    c.mode = "measure"  # or "train"
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.name = "digits"
    c.data.val_fraction = 0.2
    c.data.split_seed = 0

    c.model = ml_collections.ConfigDict()
    c.model.name = "digits_resnet"
    c.model.num_classes = 10
    c.model.width = 8
    c.model.stage_sizes = (1, 1, 1)
    c.model.dtype = "float32"

    # The optimiser block (sera_jax.optim's fields), as SERA_SPEC §7: SGD with momentum,
    # linear warmup then cosine to 0 at the run's last step (warmup capped below it), weight
    # decay on kernels only. Measure mode uses sft.*, train mode rl.*.
    sgd = dict(name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=20,
               momentum=0.9, weight_decay=1e-4, weight_decay_mask="kernels", grad_clip=0.0,
               b1=0.9, b2=0.999, eps=1e-8)

    # Measure mode: cross-entropy training up to each snapshot (measure.stage_steps).
    c.sft = ml_collections.ConfigDict()
    c.sft.batch_size = 128  # images per CE step
    # Train in float64 (the snapshots are rounded to float32 for the measurement): float32 CE
    # training amplifies rounding differences, so another processor's XLA kernels gave
    # another well-trained model (docs/results_alignment.md, "Reproducibility"). ~+15 s.
    c.sft.dtype = "float64"
    c.sft.optimizer = ml_collections.ConfigDict(sgd)

    # Train mode: RL with the allocated MaxRL loss of one method (one-step rollouts).
    c.rl = ml_collections.ConfigDict()
    c.rl.method = "sera"  # a name of sera_jax.methods.METHODS (one-shot)
    c.rl.num_steps = 300
    c.rl.prompts_per_step = 128  # P: images per RL step
    c.rl.rollouts_per_prompt = 16  # N0
    c.rl.log_every = 25  # steps between alignment + validation logs
    c.rl.optimizer = ml_collections.ConfigDict(sgd)
    # Both modes: bounds and θ of every method's allocation, the batch mesh.
    c.rl.allocation = ml_collections.ConfigDict()
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 512
    c.rl.allocation.threshold = 0.05  # θ of SERA's dynamic active set
    c.rl.allocation.shift = 1  # centred MaxRL estimator
    c.rl.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # all devices on data

    c.measure = ml_collections.ConfigDict()
    # CE steps at which the model is measured: p from near-uniform to heavily skewed.
    c.measure.stage_steps = (0, 30, 300)
    c.measure.stage_names = ("initial", "partly trained", "well trained")
    c.measure.budgets = (2, 4, 8, 16, 32, 64, 128)
    c.measure.num_draws = 32
    c.measure.prompts_per_step = 128  # P of the fixed minibatch whose exact gradient is the target
    c.measure.split = "train"  # minibatches of the training split, as during training
    c.measure.bn_train = False  # policy = the network in inference mode (running stats)
    c.measure.unroll = 4  # backward passes compiled into one program
    c.measure.cot_chunk = 320  # rollout cotangents sampled per vectorised call (10 x 32)

    c.compare = ml_collections.ConfigDict()  # measure mode: every method, paired draws
    c.compare.methods = METHODS

    c.eval = ml_collections.ConfigDict()  # train mode: the validation split at every log
    c.eval.batch_size = 512
    c.eval.num_batches = -1  # all of the validation split
    c.eval.ks = (1, 2, 4, 8, 16, 32, 64, 128)  # analytic pass@k
    return c
