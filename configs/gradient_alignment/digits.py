"""Gradient-alignment study on scikit-learn's bundled 8x8 digits: the CPU default.

Real data, no download, a small NNX ResNet (~78k parameters). Measure mode trains the
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
    c.mode = "measure"  # or "train"
    c.seed = 0
    c.batch_size = 128  # CE pre-training / RL training batch (images)
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # all devices on data

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

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 0.1
    c.optim.momentum = 0.9
    c.optim.weight_decay = 1e-4
    c.optim.warmup_steps = 20

    c.allocation = ml_collections.ConfigDict()
    c.allocation.n_min = 2
    c.allocation.n_max = 512
    c.allocation.threshold = 0.05
    c.allocation.shift = 1  # centred MaxRL estimator

    c.measure = ml_collections.ConfigDict()
    # CE steps at which the model is measured: p from near-uniform to heavily skewed.
    c.measure.stage_steps = (0, 30, 300)
    c.measure.stage_names = ("initial", "partly trained", "well trained")
    c.measure.budgets = (2, 4, 8, 16, 32, 64, 128)
    c.measure.methods = METHODS
    c.measure.num_draws = 32
    c.measure.batch_size = 128  # the fixed minibatch whose exact gradient is the target
    c.measure.split = "train"  # minibatches of the training split, as during training
    c.measure.bn_train = False  # policy = the network in inference mode (running stats)
    c.measure.unroll = 4  # backward passes compiled into one program
    c.measure.cot_chunk = 320  # rollout cotangents sampled per vectorised call (10 x 32)

    c.train = ml_collections.ConfigDict()
    c.train.method = "sera"
    c.train.n0 = 16
    c.train.num_steps = 300
    c.train.log_every = 25
    c.train.eval_batch_size = 512
    c.train.eval_batches = -1  # all of the validation split
    c.train.pass_ks = (1, 2, 4, 8, 16, 32, 64, 128)
    return c
