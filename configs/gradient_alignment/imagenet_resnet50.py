"""Gradient-alignment study in the paper's setting: ResNet-50 on ImageNet-1k (SERA_SPEC §7).

Train mode (the published protocol): ResNet-50 from scratch, trained with the RL loss of one
allocator (SERA dynamic by default; `--config.train.method=uniform` for MaxRL), batch 256,
N0 = 128, n_min = 2, n_max = 512, θ = 0.05, 20 epochs, SGD lr 0.1 momentum 0.9 wd 1e-4,
warmup then cosine, RandomResizedCrop 224 + flip; every 1,000 steps the cosine between the
step's allocated-rollout gradient and the exact CE gradient on the same minibatch is logged,
with CE / top-1 / analytic pass@k on the validation split.

Measure mode (`--config.mode=measure`) snapshots a CE-trained ResNet-50 at
`measure.stage_steps` and measures every allocator at every budget, as the digits config.

ImageNet is not downloadable automatically: prepare `imagenet2012` with tfds once
(`tfds build imagenet2012 --data_dir=DATA_DIR --manual_dir=DIR_WITH_ILSVRC_TARS`) and pass
`--config.data.data_dir=DATA_DIR`. Data-parallel over all local devices (batch sharded over
the mesh's `data` axis); the global batch must divide by the number of devices.
"""

import ml_collections

# Names of sera_jax.methods.METHODS (the same in every study).
METHODS = ("uniform", "sera", "sera_equalized", "sera_no_multiplicity",
           "sera_paper_rounding", "inverse_p", "knapsack", "hit_utility")

_TRAIN_IMAGES = 1_281_167
_BATCH = 256
_STEPS_PER_EPOCH = _TRAIN_IMAGES // _BATCH


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.mode = "train"  # or "measure"
    c.seed = 0
    c.batch_size = _BATCH
    c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # all devices on data

    c.data = ml_collections.ConfigDict()
    c.data.name = "imagenet2012"
    c.data.data_dir = ""  # where tfds keeps the prepared imagenet2012 (empty: tfds default)
    c.data.manual_dir = ""  # ILSVRC2012_img_{train,val}.tar, used only with prepare=True
    c.data.prepare = False
    c.data.train_split = "train"
    c.data.eval_split = "validation"
    c.data.image_size = 224
    c.data.shuffle_buffer = 16_384

    c.model = ml_collections.ConfigDict()
    c.model.name = "resnet50"
    c.model.num_classes = 1000
    c.model.dtype = "float32"  # "bfloat16" halves activation memory; logits stay float32

    c.optim = ml_collections.ConfigDict()
    c.optim.lr = 0.1
    c.optim.momentum = 0.9
    c.optim.weight_decay = 1e-4
    c.optim.warmup_steps = _STEPS_PER_EPOCH  # 1 epoch of linear warmup, then cosine

    c.allocation = ml_collections.ConfigDict()
    c.allocation.shift = 1  # centred MaxRL estimator
    c.allocation.n_min = 2
    c.allocation.n_max = 512
    c.allocation.threshold = 0.05

    c.measure = ml_collections.ConfigDict()
    c.measure.budgets = (2, 4, 8, 16, 32, 64, 128)
    c.measure.methods = METHODS
    c.measure.split = "train"
    c.measure.bn_train = False
    c.measure.stage_steps = (0, 5 * _STEPS_PER_EPOCH, 20 * _STEPS_PER_EPOCH)
    c.measure.stage_names = ("initial", "5 epochs", "20 epochs")
    c.measure.num_draws = 16
    c.measure.batch_size = _BATCH
    c.measure.unroll = 8
    c.measure.cot_chunk = 8  # B x C = 32,768 x 1,000 Gumbel draws per cotangent

    c.train = ml_collections.ConfigDict()
    c.train.method = "sera"
    c.train.n0 = 128
    c.train.num_steps = 20 * _STEPS_PER_EPOCH
    c.train.log_every = 1000
    c.train.eval_batch_size = 500
    c.train.eval_batches = 20  # 10,000 validation images per log point
    c.train.pass_ks = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    return c
