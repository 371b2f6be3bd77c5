"""Maze study set-up: constants, task / model / mesh construction, per-run configs,
fingerprints, evaluation keys, and validation of every field the stages read."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from sera_jax import loop
from sera_jax import methods as methods_lib
from sera_jax import sft as sft_lib
from sera_jax import sharding as shd
from sera_jax.models.configs import (
    CACHE_DTYPE_HELP,
    CACHE_DTYPE_NAMES,
    DTYPE_NAMES,
    dtype_from_name,
)
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.models.decoder import Decoder
from sera_jax.rl import config as rl_config
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.studies.maze import lm
from sera_jax.tasks import maze as maze_lib

STAGES = ("sft", "rl", "eval", "all", "compare", "regime", "frontier", "preregister",
          "amend", "matched", "export")
#: The null-control arm: uniform with rewards permuted within each batch.
NULL = "null"
#: The A/A control arm: the baseline method again, RL seed `seed + compare.aa_seed_offset`,
#: evaluated with the same keys (paired with the baseline's seed `seed`).
AA = "aa"
#: Control arms (not method names): the null control and the A/A arm.
CONTROLS = (NULL, AA)
#: `compare.primary.split` values: held-out mazes and training mazes.
SPLITS = ("eval", "train")
#: Fingerprint fields a resumed run may change (how long and how often, never what).
RESUMABLE = trainer_lib.RESUMABLE + sft_lib.RESUMABLE + ("eval.every", "eval.batch_size",
                                                         "compare", "regime")
#: Per-split fold of the evaluation key (held-out and training mazes get independent keys).
SPLIT_FOLD = {"eval": 0, "train": 1}
ALLOC_RECORDS = "alloc.jsonl"
#: Precision options (added after the first runs) left out of fingerprints at their default,
#: so earlier runs resume and their cached evaluations stay valid (`loop.trim_fields`):
#: `model.dtype` (compute dtype; parameters and AdamW state stay float32) and
#: `eval.kv_cache_dtype` ('' = the compute dtype); `model.scan_layers` (the layout of the
#: layers' parameters: the same function, equal to float32 tolerance, not bitwise).
MODEL_DEFAULTS = {"dtype": "float32", "scan_layers": False}
#: `eval.paired_noise` (issue 37): also score each run's final policy with the noise key set
#: (the paired noise floor, `report.paired_floor`); off for configs that predate it.
EVAL_DEFAULTS = {"kv_cache_dtype": "", "paired_noise": False}
#: `task.generator` (added after the first runs) is left out at its default, "prim", so a
#: config that names it and one written before it share fingerprints; any other generator
#: is part of the fingerprint (its mazes are other mazes).
TASK_DEFAULTS = {"generator": "prim"}


# ----------------------------------------------------------------------------- building


def build_task(cfg: ml_collections.ConfigDict) -> Any:
    """The task of `cfg.task`: a maze task (splits train / eval / sft), or on a pretrained
    LM (`lm.is_lm`) the math task with that model's tokenizer (splits train / eval)."""
    if lm.is_lm(cfg):
        return lm.build_task(cfg)
    return maze_lib.task_from_config(cfg.task)


def build_model(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
                ) -> Decoder:
    """The start's graph. On a pretrained LM (`lm.is_lm`): that model with its weights (the
    start itself). Otherwise a freshly initialised policy: the named preset
    `cfg.model.preset` with overrides, the compute dtype `cfg.model.dtype` (float32
    parameters: the master weights of SFT/RL) and the layer layout `cfg.model.scan_layers`
    (stacked layers run by one scan)."""
    if lm.is_lm(cfg):
        return lm.build_model(cfg, mesh)
    overrides = dict(cfg.model.get("overrides", {}) or {})
    overrides["dtype"] = dtype_from_name(cfg.model.get("dtype", "float32"), "model.dtype")
    overrides["scan_layers"] = bool(cfg.model.get("scan_layers", False))  # ml_collections: a bool
    dcfg = get_model_config(cfg.model.preset, **overrides)
    if dcfg.vocab_size != maze_lib.VOCAB_SIZE:
        raise common.StudyError(f"config.model: vocab_size={dcfg.vocab_size}; the maze "
                                f"vocabulary has {maze_lib.VOCAB_SIZE} ids")
    return Decoder(dcfg, rngs=nnx.Rngs(int(cfg.model.seed)))


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def run_config(cfg: ml_collections.ConfigDict, method: str, seed: int
               ) -> ml_collections.ConfigDict:
    """The trainer config of one run: `cfg.rl` with `method` (a name: `rl_config.method`
    resolves it with the overrides, once) and `seed` set. `method == NULL` is the null control:
    uniform (the method overrides of `rl.allocation.*` / `rl.estimator` do not apply to it)
    with `shuffle_rewards = True`; `method == AA` is the A/A control: the baseline's config
    with RL seed `seed + compare.aa_seed_offset` (nothing else differs)."""
    if method == AA:
        return run_config(cfg, cfg.compare.baseline, int(seed) + int(cfg.compare.aa_seed_offset))
    base = cfg.rl
    if method == NULL:  # plain uniform MaxRL, whatever overrides the compared methods use
        base = ml_collections.ConfigDict(cfg.rl.to_dict())
        for key in ("name", "mode", "rounding", "threshold", "multiplicity"):
            base.allocation[key] = None
        base.estimator = None
    rl = rl_config.for_method(base, "uniform" if method == NULL else method)
    rl.seed = int(seed)
    if method == NULL:
        rl.shuffle_rewards = True
    return rl


def arms(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int]
         ) -> list[tuple[str, list[int]]]:
    """(arm, seeds) of a comparison: every method with `seeds`, then the null control (when
    `compare.null`) with `compare.null_seeds` and the A/A arm (when `compare.aa` and the
    baseline is among `methods`) with `compare.aa_seeds` (each: empty = `seeds`)."""
    out = [(m, list(seeds)) for m in methods]
    if cfg.compare.null:
        null_seeds = common.int_list(cfg.compare.null_seeds, "compare.null_seeds")
        out.append((NULL, null_seeds or list(seeds)))
    if cfg.compare.get("aa", False) and cfg.compare.baseline in methods:
        aa_seeds = common.int_list(cfg.compare.aa_seeds, "compare.aa_seeds")
        out.append((AA, aa_seeds or list(seeds)))
    return out


def rl_plan(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int],
            only_these_seeds: bool = False, only_these_methods: bool = False
            ) -> list[tuple[str, list[int]]]:
    """The RL stage's (arm, seeds): `arms`, and with `only_these_seeds` (the binary's
    `--seeds`) every arm, the controls included, restricted to `seeds`, so processes with
    disjoint `--seeds` (one per core) never run the same run. With `only_these_methods`
    (the binary's `--methods`) the controls (null, A/A: the baseline's) run only in a
    process whose methods include `compare.baseline`, so processes with disjoint
    `--methods` never run the same run either."""
    plan = arms(cfg, methods, seeds)
    if only_these_methods and cfg.compare.baseline not in methods:
        plan = [(arm, ss) for arm, ss in plan if arm not in CONTROLS]
    if only_these_seeds:
        plan = [(arm, [s for s in ss if s in seeds]) for arm, ss in plan]
    return plan


def sft_width(task: maze_lib.MazeTask) -> int:
    """Static SFT row length: the prompt plus the longest answer the task can have."""
    return task.max_prompt_len + maze_lib.max_answer_length(task.size)


def eval_sampling(cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
    if lm.is_lm(cfg):
        return lm.eval_sampling(cfg, task)
    return SamplingConfig(max_new_tokens=task.max_new_tokens, temperature=cfg.eval.temperature,
                          stop_ids=tuple(task.stop_ids), pad_id=task.pad_id,
                          cache_dtype=cfg.eval.get("kv_cache_dtype", "") or None)


def sft_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the start: task (its splits), model and SFT config (on a pretrained LM:
    task and model; there is no SFT)."""
    if lm.is_lm(cfg):
        return {"task": cfg.task.to_dict(), "model": lm.model_fingerprint(cfg)}
    return {"task": loop.trim_fields(cfg.task.to_dict(), defaults=TASK_DEFAULTS),
            "model": loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS),
            "sft": sft_lib.config_fingerprint(cfg.sft)}


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict,
                   sft_step: int, method: methods_lib.Method | None = None) -> dict[str, Any]:
    """What defines one RL run: the SFT model it starts from, the RL config with its method
    (`rl_config.fingerprint`; `method` default: resolved from `rl`) and the evaluation that
    its curve records."""
    method = method if method is not None else rl_config.method(rl)
    return {**sft_fingerprint(cfg), "start": {"sft_step": int(sft_step)},
            "rl": rl_config.fingerprint(rl, method),
            "eval": loop.trim_fields(cfg.eval.to_dict(), defaults=EVAL_DEFAULTS)}


def eval_steps(cfg: ml_collections.ConfigDict) -> list[int]:
    """The evaluation points of every run: 0 (the start), every `eval.every` steps, the end."""
    t, every = int(cfg.rl.num_steps), int(cfg.eval.every)
    steps = {0, t} | (set(range(every, t, every)) if every > 0 else set())
    return sorted(steps)


def eval_key(seed: int, step: int, split: str) -> jax.Array:
    """The key of evaluation point `step` on `split`: a function of (seed, step, split) only,
    so every policy scored at a point (every method, seed and the SFT start) sees the same
    random numbers (sample r of maze q uses `fold_in(key, q·n + r)`, `rl.evaluate`)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(int(seed)), int(step)),
                              SPLIT_FOLD[split])


# ----------------------------------------------------------------------------- validation


def validate_maze(cfg: ml_collections.ConfigDict) -> None:
    """The maze task, policy and SFT blocks (StudyError naming the field)."""
    c = common.check
    t = cfg.task
    c(isinstance(t.size, int) and t.size >= 3 and t.size % 2 == 1, "task.size", t.size,
      "an odd integer >= 3")
    c(cfg.model.get("dtype", "float32") in DTYPE_NAMES, "model.dtype", cfg.model.get("dtype"),
      f"one of {DTYPE_NAMES} (the compute dtype; parameters stay float32)")
    for field in ("num_train", "num_eval"):
        c(common.positive_int(t[field]), f"task.{field}", t[field], "an integer >= 1")
    c(t.get("generator", "prim") in maze_lib.GENERATORS, "task.generator",
      t.get("generator"), f"one of {maze_lib.GENERATORS}")
    c(isinstance(t.num_sft, int) and t.num_sft >= 0, "task.num_sft", t.num_sft,
      "an integer >= 0")
    c(common.positive_int(t.max_new_tokens) and
      t.max_new_tokens >= maze_lib.max_answer_length(t.size), "task.max_new_tokens",
      t.max_new_tokens, f">= the longest answer of a {t.size}x{t.size} maze "
      f"({maze_lib.max_answer_length(t.size)})")
    try:
        sft_lib.validate(cfg.sft)
    except ValueError as e:
        raise common.StudyError(str(e)) from None
    if cfg.sft.split == "sft":
        c(t.num_sft >= 1, "task.num_sft", t.num_sft, ">= 1 (the SFT split is trained on)")


def validate(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int]
             ) -> dict[str, methods_lib.Method]:
    """Every field the stages read, checked before any data or model is built; returns each
    arm's `Method` (the method name with the `rl.allocation.*` overrides), resolved once here
    and passed down to its runs (`stage_rl(..., resolved=...)`)."""
    c = common.check
    t = cfg.task
    if lm.is_lm(cfg):
        lm.validate(cfg)
    else:
        validate_maze(cfg)
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the comparison sets it per run from --methods / config.compare.methods")
    for control in CONTROLS:
        c(control not in methods, "methods", control, "a control arm is config.compare.null / "
          "config.compare.aa, not a method name")
    validate_compare(cfg)
    resolved_arms = {}
    for method in [a for a, _ in arms(cfg, methods, seeds)]:
        try:
            resolved = resolved_arms[method] = rl_config.validate(run_config(cfg, method, 0))
        except ValueError as e:
            raise common.StudyError(f"method {method!r}: {e}") from None
        for opt, field in (("prior_alpha", "alpha"), ("prior_beta", "beta")):
            # An evidence cap reads p̂ through the history's prior: they must agree.
            if opt in resolved.options:
                c(float(resolved.options[opt]) == float(cfg.rl.history[field]),
                  f"rl.history.{field}", cfg.rl.history[field],
                  f"{resolved.options[opt]} (method {method!r} assumes {opt}="
                  f"{resolved.options[opt]}; set rl.history.{field} to it)")
    c(cfg.rl.prompts_per_step <= t.num_train, "rl.prompts_per_step", cfg.rl.prompts_per_step,
      f"<= task.num_train={t.num_train}")
    for seed in seeds:
        c(isinstance(seed, int) and seed >= 0, "compare.seeds", seed, "integers >= 0")
    e = cfg.eval
    for field in ("num_samples", "curve_samples", "num_prompts", "batch_size"):
        c(common.positive_int(e[field]), f"eval.{field}", e[field], "an integer >= 1")
    c(e.num_prompts <= t.num_eval, "eval.num_prompts", e.num_prompts,
      f"<= task.num_eval={t.num_eval}")
    c(isinstance(e.train_prompts, int) and 0 <= e.train_prompts <= t.num_train,
      "eval.train_prompts", e.train_prompts, f"an integer in [0, task.num_train={t.num_train}]"
      " (0 = no training-maze evaluation, so no realised κ)")
    c(isinstance(e.every, int) and e.every >= 0, "eval.every", e.every, ">= 0 (0 = final only)")
    c(isinstance(e.temperature, int | float) and np.isfinite(e.temperature) and
      e.temperature > 0, "eval.temperature", e.temperature, "a finite number > 0")
    c(isinstance(e.seed, int), "eval.seed", e.seed, "an integer")
    c(e.get("kv_cache_dtype", "") in CACHE_DTYPE_NAMES, "eval.kv_cache_dtype",
      e.get("kv_cache_dtype"), CACHE_DTYPE_HELP)
    c(isinstance(e.get("paired_noise", False), bool), "eval.paired_noise",
      e.get("paired_noise"), "True or False (score each final policy with the noise keys too)")
    c(isinstance(e.noise_seed, int) and e.noise_seed != e.seed, "eval.noise_seed",
      e.noise_seed, f"an integer other than eval.seed={e.seed} (the second key set)")
    if cfg.compare.get("primary") is not None:
        validate_primary(cfg)
    return resolved_arms


def validate_compare(cfg: ml_collections.ConfigDict) -> None:
    """`compare.*`: methods and seeds (tuples), baseline, null control, bootstrap."""
    c = common.check
    k = cfg.compare
    c(k.baseline in common.method_names(k.methods, "compare.methods"), "compare.baseline",
      k.baseline, f"one of compare.methods={k.methods!r}")
    common.int_list(k.seeds, "compare.seeds")
    c(isinstance(k.null, bool), "compare.null", k.null, "True or False")
    common.int_list(k.null_seeds, "compare.null_seeds")  # () = compare.seeds
    c(common.positive_int(k.bootstrap) and k.bootstrap >= 100, "compare.bootstrap",
      k.bootstrap, "an integer >= 100 (bootstrap resamples)")
    c(isinstance(k.level, float) and 0.5 <= k.level < 1, "compare.level", k.level,
      "a float in [0.5, 1)")
    c(isinstance(k.bootstrap_seed, int), "compare.bootstrap_seed", k.bootstrap_seed,
      "an integer")
    c(isinstance(k.get("aa", False), bool), "compare.aa", k.get("aa"), "True or False")
    c(isinstance(k.get("amendment", ""), str), "compare.amendment", k.get("amendment"),
      "a string: why the pre-registration is amended (--stage=amend)")
    if k.get("aa", False):
        common.int_list(k.aa_seeds, "compare.aa_seeds")  # () = compare.seeds
        c(isinstance(k.aa_seed_offset, int) and k.aa_seed_offset > 0, "compare.aa_seed_offset",
          k.aa_seed_offset, "an integer > 0 (the A/A arm's RL seed is seed + offset)")
    from sera_jax.studies.maze.validity import validate_validity  # imports this module

    validate_validity(cfg)


def validate_primary(cfg: ml_collections.ConfigDict) -> None:
    """`compare.primary` {method, split, k, window}: the one primary endpoint, fixed before
    the run: Δ = primary.method − compare.baseline on `split` pass@k, averaged over the last
    `window` evaluation points (curve size)."""
    c = common.check
    p, k = cfg.compare.primary, cfg.compare
    names = common.method_names(k.methods, "compare.methods")
    c(p.method in names and p.method != k.baseline, "compare.primary.method", p.method,
      f"one of compare.methods={names!r} other than the baseline {k.baseline!r}")
    c(p.split in SPLITS, "compare.primary.split", p.split, f"one of {SPLITS}")
    if p.split == "train":
        c(cfg.eval.train_prompts > 0, "compare.primary.split", p.split,
          "'eval' (eval.train_prompts = 0: no training-maze evaluation)")
    c(common.positive_int(p.k) and p.k <= int(cfg.eval.curve_samples), "compare.primary.k",
      p.k, f"an integer in [1, eval.curve_samples={cfg.eval.curve_samples}]")
    # A run shorter than the window (e.g. a quick --config.rl.num_steps=100) averages the
    # points it has; the report records the window it used (curves.primary.window_used).
    c(common.positive_int(p.window), "compare.primary.window", p.window,
      "an integer >= 1 (evaluation points after step 0 to average)")
    c(isinstance(k.gate_floor_multiple, int | float) and k.gate_floor_multiple >= 0,
      "compare.gate_floor_multiple", k.gate_floor_multiple, "a number >= 0")


def run_dir(workdir: str, method: str, seed: int) -> str:
    return os.path.join(workdir, "rl", method, f"seed{seed}")
