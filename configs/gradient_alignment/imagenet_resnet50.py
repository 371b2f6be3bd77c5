"""Gradient-alignment study in the paper's setting: ResNet-50 on ImageNet-1k (SERA_SPEC §7).

Train mode (the published protocol): ResNet-50 from scratch, trained with the RL loss of one
allocator (SERA dynamic by default; `--config.rl.method=uniform` for MaxRL), batch 256,
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
    c.name = "gradient_alignment_imagenet_resnet50"
    c.mode = "train"  # or "measure"
    c.seed = 0

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

    # The optimiser block (sera_jax.optim's fields), as SERA_SPEC §7: SGD with momentum,
    # linear warmup then cosine to 0 at the run's last step (warmup capped below it), weight
    # decay on kernels only. Measure mode uses sft.*, train mode rl.*.
    sgd = dict(name="sgd", learning_rate=0.1, schedule="cosine", warmup_steps=_STEPS_PER_EPOCH,
               momentum=0.9, weight_decay=1e-4, weight_decay_mask="kernels", grad_clip=0.0,
               b1=0.9, b2=0.999, eps=1e-8)

    # Measure mode: cross-entropy training up to each snapshot (measure.stage_steps).
    c.sft = ml_collections.ConfigDict()
    c.sft.batch_size = _BATCH  # images per CE step
    # "float64" makes the snapshots reproducible across processors (as the digits default),
    # at float64's cost on an accelerator; the snapshots are measured in model.dtype.
    c.sft.dtype = "float32"
    c.sft.optimizer = ml_collections.ConfigDict(sgd)

    # Train mode: RL with the allocated MaxRL loss of one method (one-step rollouts).
    c.rl = ml_collections.ConfigDict()
    c.rl.method = "sera"  # a name of sera_jax.methods.METHODS (one-shot)
    c.rl.num_steps = 20 * _STEPS_PER_EPOCH
    c.rl.prompts_per_step = _BATCH  # P: images per RL step
    c.rl.rollouts_per_prompt = 128  # N0
    c.rl.log_every = 1000  # steps between alignment + validation logs
    c.rl.optimizer = ml_collections.ConfigDict(sgd)
    # Both modes: bounds and θ of every method's allocation, the batch mesh.
    c.rl.allocation = ml_collections.ConfigDict()
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 512
    c.rl.allocation.threshold = 0.05  # θ of SERA's dynamic active set
    c.rl.allocation.shift = 1  # centred MaxRL estimator
    c.rl.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))  # all devices on data

    c.measure = ml_collections.ConfigDict()
    c.measure.budgets = (2, 4, 8, 16, 32, 64, 128)
    c.measure.split = "train"
    c.measure.bn_train = False
    c.measure.stage_steps = (0, 5 * _STEPS_PER_EPOCH, 20 * _STEPS_PER_EPOCH)
    c.measure.stage_names = ("initial", "5 epochs", "20 epochs")
    c.measure.num_draws = 16
    c.measure.prompts_per_step = _BATCH
    c.measure.unroll = 8
    c.measure.cot_chunk = 8  # B x C = 32,768 x 1,000 Gumbel draws per cotangent

    c.compare = ml_collections.ConfigDict()  # measure mode: every method, paired draws
    c.compare.methods = METHODS

    c.eval = ml_collections.ConfigDict()  # train mode: the validation split at every log
    c.eval.batch_size = 500
    c.eval.num_batches = 20  # 10,000 validation images per log point
    c.eval.ks = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # analytic pass@k
    return c
