"""Config schema, defaults and validation of the on-policy RL trainer.

`get_config()` returns the defaults (the spec's "training details common to all": AdamW
(0.9, 0.999), weight decay 0.01, constant learning rate, gradient clip 1.0, MaxRL with SERA's
dynamic active-set allocation and the multiplicity correction, token-mean aggregation).
Experiment configs start from it and override fields; `validate(config)` checks everything
on the host before anything is compiled and raises ValueError naming the field.
"""

from __future__ import annotations

import ml_collections
from ml_collections.config_dict import placeholder

from sera_jax import methods as methods_lib
from sera_jax import optim
from sera_jax.estimators import AGGREGATIONS
from sera_jax.loop import trim_fields
from sera_jax.models.configs import CACHE_DTYPE_HELP, CACHE_DTYPE_NAMES
from sera_jax.validation import check, is_bool, is_int, is_number

UNSEEN_POLICIES = ("fill", "fallback")
#: `max_rounds` of dynamic sampling by default (tunix's `SeraOptions.max_rounds` too).
DEFAULT_MAX_ROUNDS = 4


def get_config() -> ml_collections.ConfigDict:
    """Default trainer config (CPU-sized; experiments override sizes)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.num_steps = 100
    c.split = "train"

    # The compared method: a key of sera_jax.methods.METHODS (allocator + options +
    # multiplicity + estimator). A comparison study sets it per run from its method list.
    c.method = "sera"

    # Batch: P prompts per step, budget B = P * N0 rollouts spent exactly each step.
    c.prompts_per_step = 8  # P
    c.rollouts_per_prompt = 8  # N0

    # Allocation: bounds and the unseen policy apply to every method. The other fields
    # override the method preset when set (None = the preset's value); an override the
    # method's allocator does not use is an error, never dropped.
    c.allocation = ml_collections.ConfigDict()
    c.allocation.n_min = 2
    c.allocation.n_max = 32
    # Unseen prompts (no history yet): 'fill' = only they get N0 [ours];
    # 'fallback' = the whole batch falls back to uniform N0 [paper].
    c.allocation.unseen = "fill"
    c.allocation.name = placeholder(str)  # allocator (sera_jax.allocation.ALLOCATORS)
    c.allocation.mode = placeholder(str)  # sera: 'dynamic' | 'equalized'
    c.allocation.rounding = placeholder(str)  # sera: 'leximin' | 'paper'
    c.allocation.threshold = placeholder(float)  # sera dynamic active set: u(p, N) >= θ
    c.allocation.multiplicity = placeholder(bool)  # w_q = N0 / N_q (False: w_q = 1)

    # Estimator (sera_jax.estimators.ADVANTAGE_ESTIMATORS) and loss aggregation.
    c.estimator = placeholder(str)  # None = the method's (MaxRL for all but grpo)
    c.aggregation = "token_mean"
    c.loss_norm_length = 0  # L of 'seq_mean_token_sum_norm'; 0 = max_new_tokens
    # Optional `shuffle_rewards` (bool, absent = False): the null control. The step's B
    # rewards are permuted (a pure function of the step's sampling key) before advantages
    # and history, so the gradient carries no signal about which rollout succeeded; the
    # batch reward mean is unchanged. Not a default field, so the fingerprints of runs that
    # do not set it are unchanged (a study sets it on the run configs of its null arm).

    # History tracker (discounted Beta posterior).
    c.history = ml_collections.ConfigDict()
    c.history.alpha = 0.5
    c.history.beta = 0.5
    c.history.gamma = 0.75

    # Optimiser (`sera_jax.optim`): AdamW, constant learning rate, global-norm clip 1.0; one
    # update per step. A constant schedule, so a resumed run may extend num_steps.
    c.optimizer = optim.get_config()
    # Gradient accumulation: rows per micro-batch (static); 0 = the whole budget at once.
    c.micro_batch_size = 0
    # Micro-batches whose rows all have w_r A_r = 0 are always skipped (they add exactly 0).
    # True: order the batch so the rows with w_r A_r != 0 fill the first micro-batches, and
    # the rest (all-fail / all-success groups) is skipped; the gradient is the same up to
    # float summation order. Needs micro_batch_size < P*N0 to skip anything but whole steps.
    c.skip_zero_advantage = False
    # Completion width of the train step: 0 = the task's max_new_tokens (one static shape);
    # N > 0 = the step's longest completion rounded up to a multiple of N (capped at
    # max_new_tokens): fewer positions when completions stop early, one compiled train step
    # per distinct width (at most ceil(max_new_tokens / N)). The cut positions are padding
    # after every row's last token, so the loss is unchanged up to float rounding.
    c.train_length_bucket = 0
    # True: the train step runs each prompt's forward once per micro-batch and its N_q
    # completions against that prompt's KV cache (`logprobs.shared_prefix_logprobs`), instead
    # of one prompt + completion forward per row; micro-batches are then contiguous row
    # blocks (so they hold few prompts). Same loss and gradient up to float summation order.
    c.share_prompt_prefix = False
    # DAPO dynamic sampling (methods with `dynamic_sampling`, `sera_jax.rl.dynamic`): at most
    # this many generation rounds of P prompts per step until the B rows hold informative
    # groups (1 = filter only: all-equal groups become weight-0 padding rows); tunix's
    # `SeraOptions.max_rounds`. In the fingerprint of dynamic-sampling methods only.
    c.max_rounds = DEFAULT_MAX_ROUNDS

    # Sampling (sera_jax.sampling.SamplingConfig); lengths come from the task.
    c.sampling = ml_collections.ConfigDict()
    c.sampling.temperature = 1.0
    c.sampling.top_p = 1.0
    c.sampling.top_k = 0
    # Rows per sampler call (static); 0 = the whole budget in one call.
    c.sampling.batch_size = 0
    # KV-cache dtype of the rollout sampler: '' = the model's compute dtype (model.dtype),
    # or one of sera_jax.models.configs.DTYPE_NAMES ('bfloat16' halves the cache memory).
    c.sampling.kv_cache_dtype = ""

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
    # Asynchronous checkpoint writes: the step continues while Orbax writes (results are
    # unchanged, so a resumed run may change it; it is never part of a fingerprint).
    c.async_checkpoint = False
    c.log_every = 10
    return c


#: Fields of this config left out of fingerprints (`fingerprint`): they never change results.
FINGERPRINT_OMIT = ("async_checkpoint",)
#: Fields left out of fingerprints while at these defaults: they were added after runs were
#: started, and at the default they change nothing, so those runs keep their fingerprints.
FINGERPRINT_DEFAULTS = {"sampling.kv_cache_dtype": "", "skip_zero_advantage": False,
                        "train_length_bucket": 0, "share_prompt_prefix": False,
                        "max_rounds": DEFAULT_MAX_ROUNDS,
                        **{f"optimizer.{k}": optim.DEFAULTS[k] for k in (
                            "name", "schedule", "warmup_steps", "momentum",
                            "weight_decay_mask")}}


#: Fields that only a dynamic-sampling method reads: in its fingerprint always (at any value),
#: never in another method's.
DYNAMIC_SAMPLING_FIELDS = ("max_rounds",)


#: Method options the fingerprint keeps in the `allocation` block (where runs recorded them
#: before the method was passed as a `Method`); any other option goes to
#: `allocation.options`, present only when not empty.
_LEGACY_OPTIONS = ("mode", "rounding", "threshold")


def fingerprint(config: ml_collections.ConfigDict, method: methods_lib.Method) -> dict:
    """The JSON dict that identifies a run of `method` with `config` (what `loop.run`
    compares on resume and cached evaluations are keyed by): `config.to_dict()` with the
    resolved method recorded in it (`method` = its name, `allocation.name` = its allocator,
    `allocation.{mode,rounding,threshold}` = its options, `allocation.multiplicity`,
    `estimator`; its other options under `allocation.options`), without `FINGERPRINT_OMIT`
    and the `FINGERPRINT_DEFAULTS` fields at their default; `DYNAMIC_SAMPLING_FIELDS` only
    for a dynamic-sampling method (and `dynamic_sampling: True`). The same dict as runs
    recorded when the resolved method was written into their config, so their fingerprints
    hold. `config` itself is not changed."""
    d = config.to_dict()
    m = method.to_dict()
    a = d["allocation"]
    d["method"], a["name"] = m["name"], m["allocator"]
    for key in _LEGACY_OPTIONS:
        a[key] = m["options"].get(key, a.get(key))
    extra = {k: v for k, v in m["options"].items() if k not in _LEGACY_OPTIONS}
    if extra:
        a["options"] = extra
    defaults = FINGERPRINT_DEFAULTS
    if m.get("dynamic_sampling"):
        d["dynamic_sampling"] = True
        for key in DYNAMIC_SAMPLING_FIELDS:
            d[key] = config.get(key, FINGERPRINT_DEFAULTS[key])
        defaults = {k: v for k, v in defaults.items() if k not in DYNAMIC_SAMPLING_FIELDS}
    else:
        for key in DYNAMIC_SAMPLING_FIELDS:
            d.pop(key, None)
    a["multiplicity"], d["estimator"] = m["multiplicity"], m["estimator"]
    return trim_fields(d, FINGERPRINT_OMIT, defaults)


def method_overrides(config: ml_collections.ConfigDict) -> dict:
    """The user's overrides of the method preset (`allocation.*`, `estimator`; None = unset)."""
    a = config.allocation
    return {"allocator": a.name, "mode": a.mode, "rounding": a.rounding,
            "threshold": a.threshold, "multiplicity": a.multiplicity,
            "estimator": config.estimator}


def method(config: ml_collections.ConfigDict) -> methods_lib.Method:
    """The run's method, resolved once: `config.method`'s preset with the config's
    overrides (`allocation.*`, `estimator`) applied. ValueError naming the fields when it
    does not resolve (`validate` also checks that it fits the config: `check_trainable`)."""
    if config.method is None:
        raise ValueError("config.method is not set; choose one of "
                         f"{sorted(methods_lib.METHODS)}")
    try:
        m = methods_lib.resolve(config.method, method_overrides(config))
    except ValueError as e:
        fields = {"allocator": "allocation.name", "estimator": "estimator"}
        given = ", ".join(f"config.{fields.get(k, 'allocation.' + k)}={v!r}"
                          for k, v in method_overrides(config).items() if v is not None)
        raise ValueError(f"config.method={config.method!r}" + (f" with {given}" if given else "")
                         + f" is invalid: {e}") from None
    return m


_resolve = method  # `validate` takes a `method` argument, which shadows the function


def check_trainable(method: methods_lib.Method, config: ml_collections.ConfigDict) -> None:
    """ValueError unless the LM trainer can run `method` under `config`. Every registered
    method runs (stateful ones carry their allocator state in `TrainState.alloc_state`,
    two-stage ones draw an in-step pilot: `sera_jax.rl.collect`); a two-stage method's pilot
    of m rollouts per prompt must fit: max(n_min, m) <= N0 (the pilot is part of the budget
    B = P·N0) and m <= n_max."""
    m, a = method.pilot_size(config.allocation.n_min), config.allocation
    if m:
        check(max(a.n_min, m) <= config.rollouts_per_prompt and m <= a.n_max,
              "rollouts_per_prompt", config.rollouts_per_prompt,
              f"at least the pilot of method {method.name!r} (pilot={m} rollouts per prompt, "
              f"n_min={a.n_min}; the pilot is part of the budget), with pilot <= "
              f"allocation.n_max={a.n_max}")


def for_method(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """A copy of `config` with `method = name` (nothing else: the study resolves the method
    once, `method(...)`, and passes the `Method` on)."""
    c = ml_collections.ConfigDict(config.to_dict())
    c.method = name
    return c


def validate(config: ml_collections.ConfigDict, method: methods_lib.Method | None = None
             ) -> methods_lib.Method:
    """Raise ValueError naming the field for any invalid setting (host-side, before any
    work); returns the run's method.

    Numbers must be finite (an `inf` learning rate is refused, not trained with). Without
    `method`, the config's method is resolved here (`method(config)`, once); with it (a
    study that resolved it already), `config.method` must be unset or its name.
    """
    c = config
    a = c.allocation
    check(is_int(c.num_steps) and c.num_steps >= 0, "num_steps", c.num_steps,
           "an integer >= 0")
    check(is_int(c.seed), "seed", c.seed, "an integer")
    check(is_int(c.prompts_per_step) and c.prompts_per_step >= 1, "prompts_per_step",
           c.prompts_per_step, "an integer >= 1")
    check(is_int(c.rollouts_per_prompt) and c.rollouts_per_prompt >= 1, "rollouts_per_prompt",
           c.rollouts_per_prompt, "an integer >= 1")
    # The centered MaxRL factor 1-(1-p)^(N-1) is 0 at N=1: a group needs two rollouts.
    check(is_int(a.n_min) and is_int(a.n_max) and 2 <= a.n_min <= a.n_max, "allocation.n_min",
           a.n_min, f"an integer, 2 <= n_min <= n_max={a.n_max}")
    check(a.n_min <= c.rollouts_per_prompt <= a.n_max, "rollouts_per_prompt",
           c.rollouts_per_prompt, f"n_min={a.n_min} <= N0 <= n_max={a.n_max}")
    check(a.unseen in UNSEEN_POLICIES, "allocation.unseen", a.unseen,
           f"one of {UNSEEN_POLICIES}")
    if method is None:
        method = _resolve(c)
    else:
        check(c.method in (None, method.name), "method", c.method,
               f"unset or {method.name!r}, the method this run was given")
    check_trainable(method, c)
    check(c.aggregation in AGGREGATIONS, "aggregation", c.aggregation, f"one of {AGGREGATIONS}")
    check(is_int(c.loss_norm_length) and c.loss_norm_length >= 0, "loss_norm_length",
           c.loss_norm_length, "an integer >= 0")
    check(is_bool(c.get("shuffle_rewards", False)), "shuffle_rewards",
           c.get("shuffle_rewards"), "True or False")
    check(is_bool(c.get("skip_zero_advantage", False)), "skip_zero_advantage",
           c.get("skip_zero_advantage"), "True or False")
    check(is_bool(c.get("share_prompt_prefix", False)), "share_prompt_prefix",
           c.get("share_prompt_prefix"), "True or False")
    rounds = c.get("max_rounds", DEFAULT_MAX_ROUNDS)
    check(is_int(rounds) and rounds >= 1, "max_rounds", rounds, "an integer >= 1 (generation "
          "rounds per step of a dynamic-sampling method; 1 = filter only)")
    check(is_int(c.get("train_length_bucket", 0)) and c.get("train_length_bucket", 0) >= 0,
           "train_length_bucket", c.get("train_length_bucket"),
           "an integer >= 0 (0 = the static max_new_tokens width)")
    h = c.history
    check(is_number(h.alpha) and h.alpha > 0, "history.alpha", h.alpha, "a finite number > 0")
    check(is_number(h.beta) and h.beta > 0, "history.beta", h.beta, "a finite number > 0")
    check(is_number(h.gamma) and 0.0 <= h.gamma <= 1.0, "history.gamma", h.gamma, "[0, 1]")
    optim.validate(c.optimizer, c.num_steps)
    check(c.optimizer.get("schedule", "constant") == "constant", "optimizer.schedule",
           c.optimizer.get("schedule"), "'constant' (a resumed RL run may extend num_steps, "
           "which would move a cosine schedule)")
    budget = c.prompts_per_step * c.rollouts_per_prompt
    for field, size in (("micro_batch_size", c.micro_batch_size),
                        ("sampling.batch_size", c.sampling.batch_size)):
        check(is_int(size) and size >= 0 and (size == 0 or budget % size == 0), field, size,
               f"0 or a divisor of the budget P*N0={budget}")
    s = c.sampling
    check(is_number(s.temperature) and s.temperature >= 0, "sampling.temperature",
           s.temperature, "a finite number >= 0 (0 = greedy)")
    check(is_number(s.top_p) and 0 < s.top_p <= 1, "sampling.top_p", s.top_p, "(0, 1]")
    check(is_int(s.top_k) and s.top_k >= 0, "sampling.top_k", s.top_k, ">= 0 (0 = off)")
    kv = s.get("kv_cache_dtype", "")
    check(kv in CACHE_DTYPE_NAMES, "sampling.kv_cache_dtype", kv, CACHE_DTYPE_HELP)
    validate_mesh(c.mesh)
    check(is_int(c.checkpoint_every) and c.checkpoint_every >= 0, "checkpoint_every",
           c.checkpoint_every, ">= 0 (0 = off)")
    check(is_int(c.max_checkpoints_to_keep) and c.max_checkpoints_to_keep >= 1,
           "max_checkpoints_to_keep", c.max_checkpoints_to_keep, ">= 1")
    check(is_int(c.log_every) and c.log_every >= 1, "log_every", c.log_every, ">= 1")
    check(is_bool(c.get("async_checkpoint", False)), "async_checkpoint",
           c.get("async_checkpoint"), "True or False")
    return method


def validate_mesh(mesh: ml_collections.ConfigDict, prefix: str = "mesh") -> None:
    """`mesh.{data,fsdp,tensor}`: sizes >= 1 or -1 (fill with the remaining devices)."""
    for axis in ("data", "fsdp", "tensor"):
        size = mesh[axis]
        check(is_int(size) and (size == -1 or size >= 1), f"{prefix}.{axis}", size,
               ">= 1 or -1 (fill)")


def budget(config: ml_collections.ConfigDict) -> int:
    """Rollouts per step B = P * N0 (spent exactly by every allocator)."""
    return int(config.prompts_per_step * config.rollouts_per_prompt)
