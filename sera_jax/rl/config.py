"""Config schema, defaults and validation of the on-policy RL trainer.

`get_config()` returns the defaults (the spec's "training details common to all": AdamW
(0.9, 0.999), weight decay 0.01, constant learning rate, gradient clip 1.0, MaxRL with SERA's
dynamic active-set allocation and the multiplicity correction, token-mean aggregation).
Experiment configs start from it and override fields; `validate(config)` checks everything
on the host before anything is compiled and raises ValueError naming the field.
"""

from __future__ import annotations

import ml_collections

from sera_jax.estimators import AGGREGATIONS

UNSEEN_POLICIES = ("fill", "fallback")


def get_config() -> ml_collections.ConfigDict:
    """Default trainer config (CPU-sized; experiments override sizes)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_steps = 100
    c.split = "train"

    # Batch: P prompts per step, budget B = P * N0 rollouts spent exactly each step.
    c.prompts_per_step = 8  # P
    c.rollouts_per_prompt = 8  # N0
    c.n_min = 2
    c.n_max = 32

    # Allocation (sera_jax.allocation.ALLOCATORS).
    c.allocation = ml_collections.ConfigDict()
    # Any key of sera_jax.allocation.ALLOCATORS: 'sera' (mode/rounding/threshold below),
    # 'sera_equalized', 'uniform' (plain MaxRL), 'inverse_p', 'knapsack', 'hit_utility'.
    c.allocation.name = "sera"
    c.allocation.mode = "dynamic"  # SERA: 'dynamic' | 'equalized' | 'uniform'
    c.allocation.rounding = "leximin"  # SERA: 'leximin' | 'paper'
    c.allocation.threshold = 0.05  # SERA dynamic active set: u(p, N) >= threshold
    # Unseen prompts (no history yet): 'fill' = only they get N0 [ours];
    # 'fallback' = the whole batch falls back to uniform N0 [paper].
    c.allocation.unseen = "fill"
    c.allocation.multiplicity = True  # w_q = N0 / N_q (False: the ablation w_q = 1)

    # Estimator (sera_jax.estimators.ADVANTAGE_ESTIMATORS) and loss aggregation.
    c.estimator = "maxrl"
    c.aggregation = "token_mean"
    c.loss_norm_length = 0  # L of 'seq_mean_token_sum_norm'; 0 = max_new_tokens

    # History tracker (discounted Beta posterior).
    c.history = ml_collections.ConfigDict()
    c.history.alpha = 0.5
    c.history.beta = 0.5
    c.history.gamma = 0.75

    # Optimiser: AdamW, constant learning rate, global-norm clip; one update per step.
    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.learning_rate = 1e-4
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.999
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.01
    c.optimizer.grad_clip = 1.0
    # Gradient accumulation: rows per micro-batch (static); 0 = the whole budget at once.
    c.micro_batch_size = 0

    # Sampling (sera_jax.sampling.SamplingConfig); lengths come from the task.
    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 1.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    # Rows per sampler call (static); 0 = the whole budget in one call.
    c.sampling.batch_size = 0

    # Mesh and multi-host.
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = -1
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    c.multihost = ml_collections.ConfigDict()
    c.multihost.enabled = False
    c.multihost.coordinator_address = ""  # '' = auto-detect (TPU / Slurm / MPI)
    c.multihost.num_processes = 0  # 0 = auto
    c.multihost.process_id = -1  # -1 = auto

    # Bookkeeping.
    c.checkpoint_every = 50
    c.max_checkpoints_to_keep = 3
    c.log_every = 10
    return c


def _check(cond: bool, field: str, value, allowed: str) -> None:
    if not cond:
        raise ValueError(f"config.{field}={value!r} is invalid; allowed: {allowed}")


def validate(config: ml_collections.ConfigDict) -> None:
    """Raise ValueError naming the field for any inconsistent setting (host-side, before jit)."""
    from sera_jax.allocation import ALLOCATORS
    from sera_jax.estimators import ADVANTAGE_ESTIMATORS

    c = config
    _check(isinstance(c.num_steps, int) and c.num_steps >= 0, "num_steps", c.num_steps,
           "an integer >= 0")
    _check(c.prompts_per_step >= 1, "prompts_per_step", c.prompts_per_step, ">= 1")
    _check(c.rollouts_per_prompt >= 1, "rollouts_per_prompt", c.rollouts_per_prompt, ">= 1")
    # The centered MaxRL factor 1-(1-p)^(N-1) is 0 at N=1: a group needs two rollouts.
    _check(2 <= c.n_min <= c.n_max, "n_min", c.n_min, f"2 <= n_min <= n_max={c.n_max}")
    _check(c.n_min <= c.rollouts_per_prompt <= c.n_max, "rollouts_per_prompt",
           c.rollouts_per_prompt, f"n_min={c.n_min} <= N0 <= n_max={c.n_max}")
    _check(c.allocation.name in ALLOCATORS, "allocation.name", c.allocation.name,
           f"one of {sorted(ALLOCATORS)}")
    _check(c.allocation.unseen in UNSEEN_POLICIES, "allocation.unseen", c.allocation.unseen,
           f"one of {UNSEEN_POLICIES}")
    _check(c.estimator in ADVANTAGE_ESTIMATORS, "estimator", c.estimator,
           f"one of {sorted(ADVANTAGE_ESTIMATORS)}")
    _check(c.aggregation in AGGREGATIONS, "aggregation", c.aggregation, f"one of {AGGREGATIONS}")
    _check(c.loss_norm_length >= 0, "loss_norm_length", c.loss_norm_length, ">= 0")
    h = c.history
    _check(h.alpha > 0, "history.alpha", h.alpha, "> 0")
    _check(h.beta > 0, "history.beta", h.beta, "> 0")
    _check(0.0 <= h.gamma <= 1.0, "history.gamma", h.gamma, "[0, 1]")
    o = c.optimizer
    _check(o.learning_rate >= 0, "optimizer.learning_rate", o.learning_rate, ">= 0")
    _check(0 <= o.b1 < 1, "optimizer.b1", o.b1, "[0, 1)")
    _check(0 <= o.b2 < 1, "optimizer.b2", o.b2, "[0, 1)")
    _check(o.weight_decay >= 0, "optimizer.weight_decay", o.weight_decay, ">= 0")
    _check(o.grad_clip >= 0, "optimizer.grad_clip", o.grad_clip, ">= 0 (0 = no clipping)")
    budget = c.prompts_per_step * c.rollouts_per_prompt
    for field, size in (("micro_batch_size", c.micro_batch_size),
                        ("sampling.batch_size", c.sampling.batch_size)):
        _check(size >= 0 and (size == 0 or budget % size == 0), field, size,
               f"0 or a divisor of the budget P*N0={budget}")
    s = c.sampling
    _check(s.temperature >= 0, "sampling.temperature", s.temperature, ">= 0 (0 = greedy)")
    _check(0 < s.top_p <= 1, "sampling.top_p", s.top_p, "(0, 1]")
    _check(s.top_k >= 0, "sampling.top_k", s.top_k, ">= 0 (0 = off)")
    for axis in ("data", "fsdp", "tensor"):
        size = c.mesh[axis]
        _check(size == -1 or size >= 1, f"mesh.{axis}", size, ">= 1 or -1 (fill)")
    _check(c.checkpoint_every >= 0, "checkpoint_every", c.checkpoint_every, ">= 0 (0 = off)")
    _check(c.max_checkpoints_to_keep >= 1, "max_checkpoints_to_keep",
           c.max_checkpoints_to_keep, ">= 1")
    _check(c.log_every >= 1, "log_every", c.log_every, ">= 1")


def budget(config: ml_collections.ConfigDict) -> int:
    """Rollouts per step B = P * N0 (spent exactly by every allocator)."""
    return int(config.prompts_per_step * config.rollouts_per_prompt)


def comparison_methods() -> ml_collections.ConfigDict:
    """The methods an experiment can compare: name -> overrides of the trainer config.

    `uniform` is plain MaxRL (N0 each); `sera` is the published recipe (dynamic active set +
    multiplicity correction); then SERA's ablations, the peer allocators, and GRPO.
    """
    m = ml_collections.ConfigDict()
    m.uniform = {"allocation": {"name": "uniform"}}
    m.sera = {"allocation": {"name": "sera", "mode": "dynamic", "multiplicity": True}}
    m.sera_no_multiplicity = {
        "allocation": {"name": "sera", "mode": "dynamic", "multiplicity": False}}
    m.sera_equalized = {"allocation": {"name": "sera", "mode": "equalized", "multiplicity": True}}
    for peer in ("inverse_p", "knapsack", "hit_utility"):
        m[peer] = {"allocation": {"name": peer}}
    m.grpo = {"allocation": {"name": "uniform"}, "estimator": "grpo"}
    return m
