"""The earlier, 16-step maze default (superseded; kept so its results can be re-run: they
were reported in docs/results_maze.md's "Earlier, 16-step regime", now in the repository
history, `git show 8c84c4e:docs/results_maze.md`). Maze SFT -> RL (uniform MaxRL vs SERA,
5 seeds each, plus the null control) -> eval, sized for 2 CPU cores; RL barely moves the
policy in 16 steps.

9x9 perfect mazes (94-token prompts, answers <= 32 tokens), a 2-layer width-128 policy of
the spec's architecture family, a short SFT (300 x 32) to a weak-to-moderate policy, then 16
RL steps of 32 prompts x N0 8 = 256 rollouts per method and seed (all 32 training mazes every
step: one step per epoch, so SERA allocates from one-step-old history from step 2 on),
evaluated every 8 steps on the 64 held-out and the 32 training mazes with 128 samples each.
Sized for 2 *shared* CPU cores. Run with

    python -m experiments.maze --config=configs/maze/cpu_16step.py --workdir=workdir/maze_cpu
"""

import ml_collections

from sera_jax import sft
from sera_jax.rl import config as rl_config


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.name = "maze_cpu_16step"
    c.kind = "maze"  # the task kind (sera_jax.studies.paired.kinds)

    c.task = ml_collections.ConfigDict()
    c.task.size = 9
    c.task.num_train = 32  # RL prompts
    c.task.num_eval = 64  # held-out mazes
    c.task.num_sft = 4000  # supervised shortest paths (disjoint from both)
    c.task.seed = 0
    c.task.max_new_tokens = 40  # >= the longest 9x9 answer (32)

    # The spec's maze-policy family (Qwen2-style, tied embeddings), narrowed for CPU.
    c.model = ml_collections.ConfigDict()
    c.model.preset = "maze_policy"
    c.model.overrides = ml_collections.ConfigDict(dict(
        hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2))
    c.model.seed = 0
    # Compute dtype ('float32' | 'bfloat16'); parameters and AdamW state stay float32.
    c.model.dtype = "float32"
    # True: layers stacked and run by one scan (compiles once for any depth; on CPU it was
    # not faster, see docs/results_speed.md).
    c.model.scan_layers = False

    c.sft = sft.get_config()
    c.sft.num_steps = 300
    c.sft.batch_size = 32
    c.sft.learning_rate = 2e-3
    c.sft.warmup_steps = 20
    c.sft.log_every = 50
    c.sft.checkpoint_every = 100

    c.rl = rl_config.get_config()
    c.rl.num_steps = 16
    c.rl.prompts_per_step = 32  # every training maze every step: p̂ is one step old
    c.rl.rollouts_per_prompt = 8
    # Rows per gradient micro-batch (0 = the whole budget at once). On a CPU,
    # `--config.rl.micro_batch_size=16` keeps activations in cache (train step 6.2 vs 10.2
    # CPU-s; the same loss to float rounding) -- not the default, so the measured runs in
    # docs/results_maze.md stay reproducible under their fingerprint.
    c.rl.micro_batch_size = 0
    c.rl.allocation.n_min = 2
    c.rl.allocation.n_max = 64
    c.rl.optimizer.learning_rate = 1e-5  # 5e-5: the null control collapses (see docs)
    c.rl.checkpoint_every = 8
    c.rl.log_every = 4
    c.rl.mesh.data = -1

    # The comparison sets `rl.method` per run from `compare.methods` (names of
    # sera_jax.methods.METHODS); overrides of `rl.allocation.*` apply to every method.
    c.rl.method = None
    c.compare = ml_collections.ConfigDict()
    # Tuples; on the command line the binary's --methods=uniform,sera / --seeds=0,1 override them.
    c.compare.methods = ("uniform", "sera")
    c.compare.seeds = (0, 1, 2, 3, 4)
    c.compare.baseline = "uniform"  # paired differences are method − baseline, seed by seed
    c.compare.null = True  # the null control: uniform with rewards shuffled within a batch
    c.compare.null_seeds = ()  # () = compare.seeds
    c.compare.aa = False  # the A/A control (uniform again, RL seed + aa_seed_offset)
    c.compare.aa_seeds = ()
    c.compare.aa_seed_offset = 1000
    # No primary endpoint: an exploration (set one, as configs/maze/cpu.py does, to
    # pre-register); the gate's margin is read with a primary only.
    c.compare.primary = None
    c.compare.margin = ml_collections.config_dict.placeholder(float)  # equivalence; None: none
    # The blind control the validity gate reads (None = the kind's default guesser; the math
    # kind also offers "strongest" and its other answer-blind guessers: kinds.lm.BLIND_CHOICES).
    c.compare.blind = ml_collections.config_dict.placeholder(str)
    c.compare.gate_floor_multiple = 2.0
    # The validity gate (configs/maze/cpu.py explains it), at its defaults.
    c.compare.allow_blind_task = False
    c.compare.validity_pass1_ratio = 2.0
    c.compare.validity_blind_share = 0.5
    c.compare.validity_k = 0  # 0 = compare.primary.k, else min(64, eval.num_samples)
    c.compare.bootstrap = 2000  # resamples of the paired bootstrap over mazes and seeds
    c.compare.level = 0.95
    c.compare.bootstrap_seed = 0
    # '' = results/<kind>/<name>/preregistration.json; the reason of a --stage=amend.
    c.compare.preregistration = ""
    c.compare.amendment = ""
    # True: the RL stages run without a pre-registration and every output says exploratory.
    c.compare.exploratory = True  # never pre-registered: no primary endpoint

    c.eval = ml_collections.ConfigDict()
    c.eval.num_samples = 128  # final evaluation: pass@k for k = 1, 2, 4, ..., 128
    c.eval.curve_samples = 128  # intermediate evaluations (pass@k vs training rollouts)
    c.eval.every = 8  # RL steps between evaluations
    c.eval.num_prompts = 64  # held-out mazes evaluated (<= task.num_eval)
    c.eval.train_prompts = 32  # training mazes evaluated too: the true p behind realised κ
    c.eval.batch_size = 2048  # sampler rows per call
    c.eval.temperature = 1.0
    c.eval.seed = 1234  # keys of evaluation point s: eval_key(seed, s, split), every policy
    c.eval.noise_seed = 4321  # the second key set of the noise floor (SFT, final point)
    c.eval.kv_cache_dtype = ""  # '' = model.dtype; 'bfloat16' halves the sampler's cache
    # KL(pi_t || pi_start) at every evaluation point (`paired.mechanism`): completions
    # of the first kl_prompts held-out prompts x kl_samples (0 prompts = off).
    c.eval.kl_prompts = 32
    c.eval.kl_samples = 8
    # Gradient alignment (experiments/maze_alignment.py): the block of configs/maze/cpu.py.
    c.alignment = ml_collections.ConfigDict(dict(
        reference_samples=256, repetitions=16, seed=0, methods=("uniform", "sera"),
        p_sources=("history", "oracle"), include_start=True, run="uniform", run_seed=0,
        run_dir="", steps=(), latest=2, history="auto", warmup_epochs=4, sample_rows=0,
        ci="t"))
    return c
