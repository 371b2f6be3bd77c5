r"""The maze study on one GPU in ≈ 6 minutes (issue 40): the paper's 17x17 mazes and policy
shape, SFT, then uniform MaxRL, SERA and the shuffled-reward null (one seed each), held-out
pass@k along the curve with the maze-blind control beside it. The same code path as
`cpu.py` (`python -m experiments.maze`); `benchmarks/device_run.sh` runs it stage by stage
under wall-clock budgets.

Sizing (the maze policy: 4 layers x 256, 3.9 M block parameters, ≈ 9.5 MFLOP a token
forward at 400 tokens of context, 28 MFLOP trained; one H200: ≈ 989 dense bf16 TFLOP/s,
4.8 TB/s):
* SFT 2000 x 64 (paper: 1500 x 32): 64 x 438 tokens x 28 MFLOP = 0.8 TFLOP a step, ≈ 3 ms
  at 25 % MFU; steps are launch-bound (~10 ms), so ≈ 20-40 s.
* RL P 64 x N0 32 = 2,048 rollouts a step (paper: 256 x 128). Decoding is bound by latency,
  not FLOPs or bandwidth: a step's KV cache is 2,048 rows x 0.5 MB = 1 GB (0.2 ms of HBM
  bandwidth), its matmuls 19 GFLOP; ≈ 1 ms per decode step for ≤ 180 steps, prefill 6 TFLOP
  (≈ 25 ms), the train step 25 TFLOP (≈ 0.1 s): ≈ 0.5 s a step with the host's verifier and
  allocation, so 60 steps ≈ 30-40 s an arm; three arms.
* Evaluation: 256 held-out mazes x 128 samples (+ 64 training mazes) = 40,960 rollouts in
  5 sampler calls of 8,192 rows, ≈ 3 s a point; points every 20 steps.
One seed per arm: the run measures speed and whether RL moves a policy that reads 17x17
mazes; it is not powered for SERA − uniform (no CI with one seed).
"""

import ml_collections

from sera_jax import sft
from sera_jax.rl import config as rl_config


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "maze17_gpu"
    c.kind = "maze"  # the task kind (sera_jax.studies.paired.kinds)

    # The paper's task (SERA_SPEC §7): 17x17 Prim's mazes, 310-token prompts.
    c.task = ml_collections.ConfigDict(dict(size=17, num_train=1024, num_eval=256,
                                            num_sft=16384, seed=0, max_new_tokens=180))

    # The paper's maze policy: 4 layers, hidden 256, FFN 1024, 4 heads / 2 KV heads.
    c.model = ml_collections.ConfigDict()
    c.model.preset = "maze_policy"
    # The proven attention path for the study; the accelerator check times "dot_product"
    # (cuDNN flash attention) against it on the same machine.
    c.model.overrides = ml_collections.ConfigDict(dict(attention_impl="plain"))
    c.model.seed = 0
    c.model.dtype = "bfloat16"  # parameters and AdamW state stay float32
    c.model.scan_layers = False

    c.sft = sft.get_config()
    c.sft.num_steps = 2000
    c.sft.batch_size = 64
    c.sft.learning_rate = 1e-3
    c.sft.warmup_steps = 100
    c.sft.log_every = 200
    c.sft.checkpoint_every = 0  # the final step only

    c.rl = rl_config.get_config()
    c.rl.num_steps = 60
    c.rl.prompts_per_step = 64
    c.rl.rollouts_per_prompt = 32
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 256
    # 3e-5: at the paper's 1e-4 the 2026-12-04 H200 run (results/device/2026-12-04_h200)
    # drove the shuffled-reward null to pass@64 = 0 within 20 steps and uniform's held-out
    # pass@64 from 48 % to 38 % in 60 (pass@1 2.0 -> 3.3 %): too large a step to read.
    c.rl.optimizer.learning_rate = 3e-5
    c.rl.sampling.temperature = 1.0
    c.rl.sampling.batch_size = 2048  # the whole budget in one sampler call
    c.rl.micro_batch_size = 1024
    c.rl.skip_zero_advantage = True  # the same gradient, live rows first (tested)
    c.rl.checkpoint_every = 50
    c.rl.log_every = 10
    c.rl.method = None  # set per run from compare.methods

    c.compare = ml_collections.ConfigDict()
    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0,)
    c.compare.baseline = "uniform"
    c.compare.null = True
    c.compare.null_seeds = (0,)
    c.compare.aa = False
    # Unset (None: not hashed into the pre-registration): there is no A/A arm here.
    c.compare.aa_seeds = ml_collections.FieldReference(None, field_type=tuple)
    c.compare.aa_seed_offset = ml_collections.FieldReference(None, field_type=int)
    c.compare.gate_floor_multiple = 2.0
    # The validity gate (configs/maze/cpu.py explains it), at its defaults.
    c.compare.allow_blind_task = False
    c.compare.validity_pass1_ratio = 2.0
    c.compare.validity_blind_share = 0.5
    c.compare.validity_k = 0  # 0 = compare.primary.k
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="eval", k=64,
                                                       window=2))
    c.compare.margin = ml_collections.config_dict.placeholder(float)  # equivalence; None: none
    # The blind control the validity gate reads (None = the kind's default guesser; the math
    # kind also offers "strongest" and its other answer-blind guessers: kinds.lm.BLIND_CHOICES).
    c.compare.blind = ml_collections.config_dict.placeholder(str)
    c.compare.bootstrap = 2000
    c.compare.level = 0.95
    c.compare.bootstrap_seed = 0
    # '' = results/<kind>/<name>/preregistration.json; the reason of a --stage=amend.
    c.compare.preregistration = ""
    c.compare.amendment = ""
    # True: the RL stages run without a pre-registration and every output says exploratory.
    c.compare.exploratory = False
    # lr frontier around the paper's lr (`--stage=frontier`; not part of the device command).
    c.frontier = ml_collections.ConfigDict(dict(
        learning_rates=(3e-5, 1e-4, 3e-4), methods=("uniform", "sera"), seeds=(0, 1, 2),
        null=True, null_seeds=(0, 1)))

    c.eval = ml_collections.ConfigDict()
    c.eval.num_samples = 128
    c.eval.curve_samples = 128
    c.eval.every = 20
    c.eval.num_prompts = 256
    c.eval.train_prompts = 64
    c.eval.batch_size = 8192
    c.eval.temperature = 1.0
    c.eval.seed = 1234
    c.eval.noise_seed = 4321
    c.eval.kv_cache_dtype = ""
    # KL(pi_t || pi_start) at every evaluation point (`paired.mechanism`): completions
    # of the first kl_prompts held-out prompts x kl_samples (0 prompts = off).
    c.eval.kl_prompts = 32
    c.eval.kl_samples = 8
    return c
