r"""Math RL where the pretrained model learns, on 2 CPU cores (issue 38): SmolLM2-135M-Instruct
on small arithmetic, uniform MaxRL vs SERA with paired seeds, the shuffled-reward null and
the A/A control, curves at common random numbers, a pre-registered primary endpoint -- the
maze study's protocol and code (`sera_jax.studies.paired`, its pretrained-LM start `lm`).

Why these numbers (`docs/results_math.md`, "Pilot"):

* Task `small24_nl` of the pilot (`sera_jax.studies.math_pilot`): one-step small add / sub /
  mul ("What is 17 - 9?"), "Answer with the number only.", at most 24 new tokens, stopping
  at the first newline token; 128 training and 128 held-out problems (disjoint contents).
  The start at T 1 on 64 held-out x 16: pass@1 9.0 %, pass@16 56.2 %, 35 % truncated; the
  word problems give 0-0.8 % (no reward to learn from on a CPU budget).
* RL: P 8 x N0 8 = 64 rollouts a step (one epoch = 16 steps), lr 1e-5 (the spec's SmolLM2
  setting), 60 steps; n_max 32 for SERA. About 11 s a step on one core. Evaluated at
  steps 0, 20, 40, 60 on the 128 held-out problems x 16 samples at T 1 (and 32 training
  problems for the realised κ); the primary window is the last 2 points (40, 60).
* Gate pilot (configs/math/cpu.py with this task and RL block, 40 steps, one seed each,
  4 Dec 2026): uniform held-out pass@1 8.3 % -> 69.1 %, pass@16 53.9 % -> 86.7 %; the
  shuffled-reward null 8.3 % -> 1.8 %, 53.9 % -> 21.1 %. RL learns fast here, so the
  curve is short and sampled early (steps 20-60) while pass@16 still has headroom.
* Wall time: the start scored at 4 points + the noise keys (~10 min on one core), then
  12 runs (uniform and SERA x 4 seeds, null x 2 -- x 4 since the amendment --, A/A x 2)
  of ~11 min RL + 3 points x
  ~2 min, 6 a core: ~1.8 h on 2 idle cores.

Analysis, fixed before the run (`compare.primary`, committed in
results/math/math_smollm2_arith/preregistration.json before any RL run): SERA − uniform on
held-out pass@16, averaged over steps 40 and 60, seed-level 95 % t interval (4 paired
seeds); the gate: uniform − null at held-out pass@1 over the same window, CI above 0 and
above 2 x the evaluation noise floor.

One command on 2 cores (one RL process per core; each run resumes where it stopped):

    W=workdir/math_arith; M="python -m experiments.math_rl --workdir=$W"
    $M --stage=sft && (taskset -c 0 $M --stage=rl --seeds=0,2 & \
        taskset -c 1 $M --stage=rl --seeds=1,3 & wait) && $M --stage=eval && $M --stage=export

(`--stage=sft` scores the pretrained start at every evaluation point; there is no SFT.)
"""

import ml_collections

from sera_jax import config_files
from sera_jax.rl import config as rl_config

cpu = config_files.sibling(__file__, "cpu.py")


def get_config() -> ml_collections.ConfigDict:
    base = cpu.get_config()
    c = ml_collections.ConfigDict()
    c.name = "math_smollm2_arith"
    c.kind = "math"  # the task kind (sera_jax.studies.paired.kinds)

    c.model = base.model  # the embedded SmolLM2-135M-Instruct (`make smollm2`), float32
    c.task = base.task
    c.task.templates = "small_add,small_sub,small_mul"
    c.task.steps = (1,)
    c.task.template = "number"  # "Answer with the number only."
    c.task.max_new_tokens = 24
    c.task.stop_at_newline = True
    c.task.num_train = 128
    c.task.num_eval = 128

    c.rl = rl_config.get_config()
    c.rl.method = None  # set per run from compare.methods
    c.rl.num_steps = 60
    c.rl.prompts_per_step = 8
    c.rl.rollouts_per_prompt = 8
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 32
    c.rl.optimizer.learning_rate = 1e-5
    c.rl.sampling.temperature = 1.0  # on-policy (spec: T = 1 during RL)
    # Gradient-preserving speed options (the same gradient as the plain path, tested).
    c.rl.micro_batch_size = 8
    c.rl.skip_zero_advantage = True
    c.rl.share_prompt_prefix = True
    c.rl.train_length_bucket = 8
    c.rl.checkpoint_every = 10
    # One checkpoint a run: 1.4 GB (float32 parameters + AdamW moments); 12 runs keeping two
    # filled this machine's disk. Not hashed: cadence, not what a run computes.
    c.rl.max_checkpoints_to_keep = 1
    c.rl.log_every = 5
    c.rl.mesh.data = -1

    c.compare = ml_collections.ConfigDict()
    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0, 1, 2, 3)
    c.compare.baseline = "uniform"
    c.compare.null = True  # uniform with rewards shuffled within each batch
    # Amended 4 Dec 2026 (pre-registration "amendments", before these runs): 2 -> 4 null
    # seeds. With 2, the gate's seed-level t band (1 degree of freedom) was [-20.5, +139.9]
    # pp around a +59.7 pp difference; the primary endpoint and every other field unchanged.
    c.compare.null_seeds = (0, 1, 2, 3)
    c.compare.amendment = ("two null seeds gave the gate a seed-level t interval with one "
                           "degree of freedom ([-20.5, +139.9] pp around +59.7): null seeds "
                           "2 and 3 added; primary endpoint and all other fields unchanged")
    c.compare.aa = True  # the A/A control: uniform again, RL seed + aa_seed_offset
    c.compare.aa_seeds = (0, 1)
    c.compare.aa_seed_offset = 1000
    c.compare.primary = ml_collections.ConfigDict(dict(method="sera", split="eval", k=16,
                                                       window=2))
    c.compare.margin = ml_collections.config_dict.placeholder(float)  # None: none registered
    # The blind control the validity gate reads (None = the kind's default guesser; the math
    # kind also offers "strongest" and its other answer-blind guessers: kinds.lm.BLIND_CHOICES).
    c.compare.blind = ml_collections.config_dict.placeholder(str)
    c.compare.gate_floor_multiple = 2.0  # gate: baseline − null > 2 x the noise floor
    # The validity gate: the start must beat an answer-blind guesser (answers drawn from
    # the training answers at their frequency, `lm.blind_validity`).
    c.compare.allow_blind_task = False
    c.compare.validity_pass1_ratio = 2.0
    c.compare.validity_blind_share = 0.5
    c.compare.validity_k = 0  # 0 = compare.primary.k
    c.compare.bootstrap = 2000
    c.compare.level = 0.95
    c.compare.bootstrap_seed = 0
    # True: the RL stages run without a pre-registration and every output says exploratory.
    c.compare.exploratory = False
    c.compare.preregistration = ""  # '' = results/math/<name>/preregistration.json

    # The lr frontier (`--stage=frontier`, after the comparison): uniform at each lr, the
    # start as lr -> 0; the config's lr reuses the comparison's runs.
    c.frontier = ml_collections.ConfigDict()
    c.frontier.learning_rates = (3e-6, 1e-5, 3e-5)
    c.frontier.methods = ("uniform",)
    c.frontier.seeds = (0, 1)
    c.frontier.null = True
    c.frontier.null_seeds = (0,)
    c.frontier.method_seeds = ml_collections.ConfigDict()  # method -> seeds (optional)
    c.frontier.margin = ml_collections.config_dict.placeholder(float)  # the gap's; None: none

    c.eval = ml_collections.ConfigDict()
    c.eval.num_samples = 16  # pass@k for k = 1, 2, 4, 8, 16
    c.eval.curve_samples = 16
    c.eval.every = 20  # points 0, 20, 40, 60
    c.eval.num_prompts = 128
    c.eval.train_prompts = 32  # training problems 0..31: the true p behind realised κ
    c.eval.batch_size = 64
    c.eval.temperature = 1.0
    c.eval.top_p = 1.0
    c.eval.top_k = 0
    c.eval.max_new_tokens = 0  # 0 = task.max_new_tokens
    c.eval.seed = 1234
    c.eval.noise_seed = 4321
    c.eval.kv_cache_dtype = ""
    # KL(pi_t || pi_start) at every evaluation point (`paired.mechanism`): completions
    # of the first kl_prompts held-out prompts x kl_samples (0 prompts = off).
    c.eval.kl_prompts = 32
    c.eval.kl_samples = 8
    c.eval.paired_noise = False
    return c
