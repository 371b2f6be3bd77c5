"""The paired comparison as data: its arms, runs, evaluation points and keys, and the pure
specs that the pre-registration hashes (comparison, primary endpoint, frontier, lr-matched arm,
norm-matched arm).

Everything here is a function of the config alone: no file is read and no model is built,
so `prereg`, `frontier`, `matched` and the stages all sit above this module. What a task
contributes (building, the start, the blind control) comes from its kind
(`sera_jax.studies.paired.kinds`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import ml_collections

from sera_jax import loop
from sera_jax import methods as methods_lib
from sera_jax import sft as sft_lib
from sera_jax import sharding as shd
from sera_jax.rl import config as rl_config
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.kinds.base import SPLIT_NAMES

STAGES = ("sft", "rl", "eval", "all", "compare", "regime", "frontier", "preregister",
          "amend", "matched", "norm_matched", "export")
#: The null-control arm: uniform with rewards permuted within each batch.
NULL = "null"
#: The A/A control arm: the baseline method again, RL seed `seed + compare.aa_seed_offset`,
#: evaluated with the same keys (paired with the baseline's seed `seed`).
AA = "aa"
#: Control arms (not method names): the null control and the A/A arm.
CONTROLS = (NULL, AA)
#: `compare.primary.split` values: held-out prompts, training prompts and the sealed test
#: split (a kind's `test_split`, scored only when `eval.test_prompts` > 0).
SPLITS = ("eval", "train", "test")
#: Fingerprint fields a resumed run may change (how long and how often, never what).
RESUMABLE = trainer_lib.RESUMABLE + sft_lib.RESUMABLE + ("eval.every", "eval.batch_size",
                                                         "compare", "regime")
#: Per-split fold of the evaluation key (each split's prompts get independent keys).
SPLIT_FOLD = {"eval": 0, "train": 1, "test": 2, "kl": 3}  # kl: `mechanism.measure`
ALLOC_RECORDS = "alloc.jsonl"
#: `eval.paired_noise`: also score each run's final policy with the noise key set
#: (the paired noise floor, `report.paired_floor`); off for configs that predate it.
#: `eval.test_prompts`: sealed test prompts scored at every point (0: none).
#: `eval.kl_prompts` x `eval.kl_samples`: KL(π_t ‖ π_start) at every point (`mechanism`).
EVAL_DEFAULTS = {"kv_cache_dtype": "", "paired_noise": False, "test_prompts": 0,
                 "kl_prompts": 32, "kl_samples": 8, "outcomes": False,
                 "start_temperatures": ()}


#: What every output of an exploratory run says (`compare.exploratory`).
EXPLORATORY = "exploratory (not pre-registered)"


def is_exploratory(cfg: ml_collections.ConfigDict) -> bool:
    """`compare.exploratory`: the RL stages run without a pre-registration, and every output
    says so (`EXPLORATORY`); export refuses such a study."""
    return bool(cfg.compare.get("exploratory", False))


# ----------------------------------------------------------------------------- building


def build_task(cfg: ml_collections.ConfigDict) -> Any:
    """The task of `cfg` (its kind's `build_task`)."""
    return get_kind(cfg).build_task(cfg)


def build_model(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None) -> Any:
    """The start's graph (its kind's `build_model`): a fresh policy to be SFT'd, or the
    pretrained policy with its weights."""
    return get_kind(cfg).build_model(cfg, mesh)


def eval_sampling(cfg: ml_collections.ConfigDict, task: Any) -> SamplingConfig:
    """The evaluation sampler (its kind's `eval_sampling`)."""
    return get_kind(cfg).eval_sampling(cfg, task)


def start_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the start (its kind's `start_fingerprint`)."""
    return get_kind(cfg).start_fingerprint(cfg)


def test_split(cfg: ml_collections.ConfigDict) -> dict[str, Any] | None:
    """The fields that define the task's sealed test split (its kind's `test_split`; None:
    the task has none)."""
    return get_kind(cfg).test_split(cfg)


def test_prompts(cfg: ml_collections.ConfigDict) -> int:
    """`eval.test_prompts` (0 when the config predates it)."""
    return int(cfg.eval.get("test_prompts", 0) or 0)


def eval_splits(cfg: ml_collections.ConfigDict) -> list[str]:
    """The splits every evaluation point scores: 'eval', 'train' when `eval.train_prompts`
    > 0, 'test' when `eval.test_prompts` > 0 (in `SPLITS` order)."""
    return (["eval"] + (["train"] if int(cfg.eval.train_prompts) > 0 else [])
            + (["test"] if test_prompts(cfg) > 0 else []))


def primary_split(cfg: ml_collections.ConfigDict) -> str:
    """`compare.primary.split` ('eval' without a primary endpoint)."""
    p = cfg.compare.get("primary")
    return "eval" if p is None else str(p.split)


def eval_fields(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What a run's evaluation measures: `config.eval` (`EVAL_DEFAULTS` trimmed) and, when
    sealed test prompts are scored, the test split's fields (`test_split`: the start's
    fingerprint leaves them out)."""
    out = loop.trim_fields(cfg.eval.to_dict(), defaults=EVAL_DEFAULTS)
    if test_prompts(cfg) > 0:
        out["test_split"] = test_split(cfg)
    return out


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


def arms(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int],
         method_seeds: Mapping[str, Sequence[int]] | None = None
         ) -> list[tuple[str, list[int]]]:
    """(arm, seeds) of a comparison: every method with `seeds` (or its own entry of
    `method_seeds`: the frontier's per-method seeds, `lr_arms`), then the null control (when
    `compare.null`) with `compare.null_seeds` and the A/A arm (when `compare.aa` and the
    baseline is among `methods`) with `compare.aa_seeds` (each: empty = `seeds`)."""
    per = method_seeds or {}
    out = [(m, list(per.get(m, seeds))) for m in methods]
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


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict,
                   sft_step: int, method: methods_lib.Method | None = None) -> dict[str, Any]:
    """What defines one RL run: the SFT model it starts from, the RL config with its method
    (`rl_config.fingerprint`; `method` default: resolved from `rl`) and the evaluation that
    its curve records."""
    method = method if method is not None else rl_config.method(rl)
    return {**start_fingerprint(cfg), "start": {"sft_step": int(sft_step)},
            "rl": rl_config.fingerprint(rl, method),
            "eval": eval_fields(cfg)}


def eval_steps(cfg: ml_collections.ConfigDict) -> list[int]:
    """The evaluation points of every run: 0 (the start), every `eval.every` steps, the end."""
    t, every = int(cfg.rl.num_steps), int(cfg.eval.every)
    steps = {0, t} | (set(range(every, t, every)) if every > 0 else set())
    return sorted(steps)


def eval_key(seed: int, step: int, split: str) -> jax.Array:
    """The key of evaluation point `step` on `split`: a function of (seed, step, split) only,
    so every policy scored at a point (every method, seed and the SFT start) sees the same
    random numbers (sample r of prompt q uses `fold_in(key, q·n + r)`, `rl.evaluate`)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(int(seed)), int(step)),
                              SPLIT_FOLD[split])


# ----------------------------------------------------------------------------- validation


def run_dir(workdir: str, method: str, seed: int) -> str:
    return os.path.join(workdir, "rl", method, f"seed{seed}")


def primary_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The pre-registered analysis: primary endpoint, baseline, gate (JSON form)."""
    p = cfg.compare.primary
    return {"method": str(p.method), "baseline": str(cfg.compare.baseline),
            "split": str(p.split), "k": int(p.k), "window": int(p.window),
            "gate_floor_multiple": float(cfg.compare.gate_floor_multiple),
            "level": float(cfg.compare.level)}


SELECTION_RULE = ("selected lr: {base}'s best mean pass@{k} among the lrs whose gate passes "
                  "(baseline − null at held-out pass@1: CI above 0 and mean above "
                  "compare.gate_floor_multiple × the noise floor)")


DISTANCE_RULE = ("a method's distance above the baseline's frontier: its mean pass@{k} minus "
                 "the baseline's frontier at its mean pass@1, the frontier being the baseline's "
                 "mean (pass@1, pass@{k}) points over the lrs plus the SFT start (lr -> 0), "
                 "sorted by pass@1 and linearly interpolated (no extrapolation); CI: "
                 "bootstrap over seeds, each (lr, arm) resampled independently")


GAP_RULE = ("a method's frontier gap: its frontier minus the baseline's at matched pass@1 "
            "(each frontier: the method's mean (pass@1, pass@{k}) point at every lr plus the "
            "SFT start as the lr -> 0 point of both, sorted by pass@1, linear between "
            "points, no extrapolation), averaged over the overlap of the two pass@1 ranges "
            "and at 2 pass@1 levels inside it, for every method with points at >= 2 lrs; "
            "CI: {level:.0f} % percentile bootstrap over seed ids, every (lr, arm) group "
            "taking the drawn seeds it has; equivalent within ±margin when the {tost:.0f} % "
            "bootstrap interval lies inside it, better / worse when the {level:.0f} % one "
            "lies clear of 0, else inconclusive")


def gap_rule(cfg: ml_collections.ConfigDict) -> str:
    """`GAP_RULE` for the config's primary k and `compare.level`."""
    level = float(cfg.compare.level)
    return GAP_RULE.format(k=int(cfg.compare.primary.k), level=100 * level,
                           tost=100 * (2 * level - 1))


def frontier_learning_rates(cfg: ml_collections.ConfigDict) -> list[float]:
    """`frontier.learning_rates`: a non-empty tuple of positive floats."""
    lrs = common.nonempty(common.float_list(cfg.frontier.learning_rates,
                                            "frontier.learning_rates"),
                          "frontier.learning_rates")
    common.check(all(lr > 0 for lr in lrs), "frontier.learning_rates",
                 cfg.frontier.learning_rates, "positive numbers")
    return lrs


def frontier_methods(cfg: ml_collections.ConfigDict) -> list[str]:
    """`frontier.methods`, which must include `compare.baseline`."""
    methods = common.method_names(cfg.frontier.methods, "frontier.methods")
    common.check(cfg.compare.baseline in methods, "frontier.methods", cfg.frontier.methods,
                 f"a tuple containing compare.baseline={cfg.compare.baseline!r}")
    return methods


def frontier_seeds(cfg: ml_collections.ConfigDict) -> list[int]:
    return common.nonempty(common.int_list(cfg.frontier.seeds, "frontier.seeds"),
                           "frontier.seeds")


def frontier_method_seeds(cfg: ml_collections.ConfigDict) -> dict[str, list[int]]:
    """`frontier.method_seeds` (absent, None or empty: {}): method -> the seeds it runs with
    at the frontier's lrs instead of `frontier.seeds` (e.g. SERA 6 seeds, its peers 4). A
    config file sets it as `ml_collections.ConfigDict({"sera": (0, 1, 2, 3, 4, 5)})`; every
    key must be a method of `frontier.methods`, every value a non-empty tuple of integers
    >= 0 (StudyError naming the field otherwise)."""
    raw = cfg.frontier.get("method_seeds")
    if raw is None:
        return {}
    if isinstance(raw, ml_collections.ConfigDict):
        raw = raw.to_dict()
    common.check(isinstance(raw, Mapping), "frontier.method_seeds", raw,
                 "a mapping method -> tuple of seeds, e.g. "
                 "ml_collections.ConfigDict({'sera': (0, 1, 2, 3, 4, 5)})")
    methods = frontier_methods(cfg)
    out = {}
    for name, seeds in raw.items():
        common.check(name in methods, "frontier.method_seeds", name,
                     f"a method of frontier.methods={tuple(methods)!r}")
        what = f"frontier.method_seeds.{name}"
        out[str(name)] = common.nonempty(common.int_list(seeds, what), what)
    return out


def frontier_margin(cfg: ml_collections.ConfigDict) -> float | None:
    """`frontier.margin`: the frontier gap's equivalence margin (pass@k units; None: none
    registered). Checked in `config.validate_frontier`."""
    m = cfg.frontier.get("margin")
    return None if m is None else float(m)


def is_config_lr(cfg: ml_collections.ConfigDict, lr: float) -> bool:
    """Whether `lr` is the config's own (the comparison's runs are that lr's point)."""
    return float(lr) == float(cfg.rl.optimizer.learning_rate)


def lr_config(cfg: ml_collections.ConfigDict, lr: float) -> ml_collections.ConfigDict:
    """`cfg` at learning rate `lr` with no A/A arm and, except at the config's own lr (the
    comparison's null runs), the frontier's null control."""
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.optimizer.learning_rate = float(lr)
    if not is_config_lr(cfg, lr):
        out.compare.null = bool(cfg.frontier.null)
        out.compare.null_seeds = tuple(cfg.frontier.null_seeds)
    out.compare.aa = False
    return out


def lr_arms(cfg: ml_collections.ConfigDict, lr: float
            ) -> tuple[list[str], list[int], dict[str, list[int]]]:
    """(methods, seeds, method_seeds) at `lr`, as `arms` takes them: `frontier.methods` x
    `frontier.seeds`, the methods of `frontier.method_seeds` with their own seeds; at the
    config's own lr also `compare.methods`, every compared method with `compare.seeds` (the
    comparison's runs, already there) and a frontier method that is not compared with its
    `frontier.method_seeds` entry, else `compare.seeds`."""
    methods, seeds, per = frontier_methods(cfg), frontier_seeds(cfg), frontier_method_seeds(cfg)
    if not is_config_lr(cfg, lr):
        return methods, seeds, per
    compared = common.method_names(cfg.compare.methods, "compare.methods")
    return (methods + [m for m in compared if m not in methods],
            common.int_list(cfg.compare.seeds, "compare.seeds"),
            {m: s for m, s in per.items() if m not in compared})


def all_methods(cfg: ml_collections.ConfigDict) -> list[str]:
    """Every method with a point at some lr (`lr_arms` over the grid), baseline first."""
    out: list[str] = []
    for lr in frontier_learning_rates(cfg):
        out += [m for m in lr_arms(cfg, lr)[0] if m not in out]
    return out


MATCH_RULE = (
    "uniform's held-out pass@1 gain over the SFT start (window means, same keys) is taken as "
    "a function of lr: linear in lr between the SFT start (lr = 0, gain 0) and the smallest "
    "frontier lr, piecewise linear in log lr between the frontier's lrs (uniform's mean over "
    "seeds at each); the matched lr is the smallest lr where that function reaches SERA's "
    "mean gain at the config's lr (first crossing from lr = 0 up); none when SERA's gain is "
    "not positive or the function never reaches it on the grid (no extrapolation)")


def matched_seeds(cfg: ml_collections.ConfigDict) -> list[int]:
    """`frontier.matched_seeds`, the seeds of the lr- and the norm-matched arm (empty or
    absent, or no frontier section: `compare.seeds`)."""
    block = cfg.get("frontier")
    seeds = common.int_list(() if block is None else block.get("matched_seeds", ()),
                            "frontier.matched_seeds")
    return seeds or common.int_list(cfg.compare.seeds, "compare.seeds")


def matched_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The pre-registered rule and endpoint of the lr-matched arm (prereg's `frontier`)."""
    p = cfg.compare.primary
    return {"rule": MATCH_RULE, "method": str(p.method), "baseline": str(cfg.compare.baseline),
            "method_lr": float(cfg.rl.optimizer.learning_rate), "seeds": matched_seeds(cfg),
            "endpoint": {"comparison": f"{p.method} − {cfg.compare.baseline}@matched lr",
                         "split": "eval", "k": int(p.k), "window": int(p.window),
                         "level": float(cfg.compare.level),
                         "interval": "seed-level Student t; two-level bootstrap beside it"}}


NORM_MATCH_RULE = (
    "per complete run of the comparison at the config's lr (rl/<method>/seed<s>/, "
    "compare.seeds; every step of rl.num_steps recorded), the mean over all its steps of "
    "train.jsonl's update_norm (‖θ_t − θ_(t−1)‖₂ of the applied update); per method "
    "the mean over its seeds; r = {base}'s mean / {method}'s mean; the norm-matched lr = the "
    "config's lr × r. With AdamW the update is lr × (the bias-corrected first moment over "
    "the root of the second, plus weight decay × θ), so "
    "at fixed gradient statistics its norm scales about linearly in lr: {method} at this lr "
    "takes {base}'s step size to first order (the achieved ratio, measured on the arm's own "
    "runs, checks it). The CI of r: percentile bootstrap over seed ids, each method taking "
    "the drawn ids it has (compare.bootstrap resamples, compare.bootstrap_seed); refused "
    "when the runs lack update_norm records or a method has fewer than 2 complete runs")


def norm_matched_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The norm-matched arm's rule and endpoint: the primary's method at the lr
    `NORM_MATCH_RULE` derives, with `matched_seeds`, against `compare.baseline` at the
    config's lr, on the primary's split, k and window (`compare.margin` when set). Written
    with the derived lr into the pre-registration's `norm_matched` section before the arm
    runs (`matched.NORM_MATCHED`)."""
    p, base = cfg.compare.primary, str(cfg.compare.baseline)
    margin = cfg.compare.get("margin")
    return {"rule": NORM_MATCH_RULE.format(base=base, method=str(p.method)),
            "method": str(p.method), "baseline": str(base),
            "baseline_lr": float(cfg.rl.optimizer.learning_rate), "seeds": matched_seeds(cfg),
            "endpoint": {"comparison": f"{p.method}@norm-matched lr − {base}",
                         "split": str(p.split), "k": int(p.k), "window": int(p.window),
                         "level": float(cfg.compare.level),
                         "interval": "seed-level Student t; two-level bootstrap beside it"},
            **({"margin": float(margin)} if margin is not None else {})}


#: Run-fingerprint fields that do not change what a run computes (cadence, layout, seed).
OMIT = ("start", "rl.seed", "rl.log_every", "rl.checkpoint_every", "rl.max_checkpoints_to_keep",
        "rl.multihost", "rl.async_checkpoint", "rl.mesh", "eval.batch_size")


#: `config.compare` fields that say where the record lives, why it was amended or whether a
#: run is exploratory, not what the comparison is.
COMPARE_OMIT = ("preregistration", "amendment", "exploratory")


def comparison_fields(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the comparison: each arm's run fingerprint (`rl_fingerprint` with
    `OMIT` left out) and `config.compare` (validity defaults filled, `COMPARE_OMIT` out, and
    a field set to None left out as unset: every paired config has the same `compare`
    fields, and one that is unused there -- `aa_seeds` without an A/A arm, `primary` of an
    exploration -- is None, so the configs that predate the field keep their hash)."""
    methods = common.method_names(cfg.compare.methods, "compare.methods")
    seeds = common.int_list(cfg.compare.seeds, "compare.seeds")
    compare = {**VALIDITY_DEFAULTS, **{k: v for k, v in loop.canonical(
        cfg.compare.to_dict()).items() if v is not None}}
    for key in COMPARE_OMIT:
        compare.pop(key, None)
    return {"arms": arm_fields(cfg, methods, seeds), "compare": compare}


def arm_fields(cfg: ml_collections.ConfigDict, methods: list[str], seeds: list[int],
               method_seeds: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """{arm: its run fingerprint without `OMIT`} for the arms of `methods` x `seeds`."""
    return {arm: loop.trim_fields(rl_fingerprint(cfg, run_config(cfg, arm, 0), 0), OMIT)
            for arm, _ in arms(cfg, methods, seeds, method_seeds)}


def fields_hash(fields: Any) -> str:
    """SHA-256 of the canonical JSON of `fields` (sorted keys)."""
    text = json.dumps(loop.canonical(fields), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def comparison_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `comparison` section: primary endpoint, config hash and the hashed fields."""
    fields = comparison_fields(cfg)
    return {"primary": primary_spec(cfg), "config_hash": fields_hash(fields), "fields": fields}


def frontier_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """The `frontier` section of the pre-registration (`prereg`'s docstring)."""
    p, base = cfg.compare.primary, cfg.compare.baseline
    lrs = frontier_learning_rates(cfg)
    methods, seeds = frontier_methods(cfg), frontier_seeds(cfg)
    fields = {f"{lr:g}": arm_fields(lr_config(cfg, lr), *lr_arms(cfg, lr)) for lr in lrs}
    own = float(cfg.rl.optimizer.learning_rate)
    per, margin = frontier_method_seeds(cfg), frontier_margin(cfg)
    at_own = dict(zip(("methods", "seeds", "method_seeds"), lr_arms(cfg, own)))
    if not at_own["method_seeds"]:
        del at_own["method_seeds"]
    # method_seeds and the margin (with the gap's rule) are registered only when set, so
    # the pre-registrations written before they existed still hold.
    return {"metric": f"{SPLIT_NAMES[str(p.split)]} pass@1 and pass@{int(p.k)}, per seed the "
                      f"mean over the last {int(p.window)} evaluation points", "k": int(p.k),
            "window": int(p.window), "learning_rates": lrs,
            "methods": methods, "seeds": seeds,
            **({"method_seeds": per} if per else {}),
            "at_config_lr": {"lr": own, **at_own} if own in lrs else None,
            "null": bool(cfg.frontier.null),
            "null_seeds": common.int_list(cfg.frontier.null_seeds, "frontier.null_seeds"),
            "selection_rule": SELECTION_RULE.format(base=base, k=int(p.k)),
            "distance_rule": DISTANCE_RULE.format(k=int(p.k)),
            **({"margin": margin, "gap_rule": gap_rule(cfg)} if margin is not None else {}),
            "matched": matched_spec(cfg),
            "config_hash": fields_hash(fields)}


#: The validity fields of `config.compare` with the values a config without them gets.
VALIDITY_DEFAULTS = {"allow_blind_task": False, "validity_pass1_ratio": 2.0,
                     "validity_blind_share": 0.5, "validity_k": 0}


def repo_root() -> str:
    """The repository holding this package (`results/` lives there)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


def repo_path(path: str) -> str:
    """`path` as outputs record it: relative to the repository when inside it (a committed
    file names no machine's folders), else absolute."""
    path, root = os.path.abspath(path), repo_root()
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else path


def results_dir(cfg: ml_collections.ConfigDict) -> str:
    """`<repo>/results/<kind>/<config.name>/`: where a study's pre-registration and export
    live (the kind's name: `maze`, `math`)."""
    return os.path.join(repo_root(), "results", get_kind(cfg).name, str(cfg.get("name", "")))


def regime_cells(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """(P, N0, n_max) of every cell of the regime map: `regime.prompts_per_step` x
    `regime.rollouts_per_prompt`, `n_max = min(regime.n_max_factor · N0, regime.n_max_cap)`."""
    r = cfg.regime
    ps, ns = (common.nonempty(common.int_list(r[f], f"regime.{f}", 1), f"regime.{f}")
              for f in ("prompts_per_step", "rollouts_per_prompt"))
    return [(p, n, min(int(r.n_max_factor) * n, int(r.n_max_cap))) for p in ps for n in ns]


def cell_config(cfg: ml_collections.ConfigDict, cell: tuple[int, int, int]
                ) -> ml_collections.ConfigDict:
    """`cfg` with one regime cell's batch shape (P, N0, n_max); no null or A/A control."""
    p, n0, n_max = cell
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.prompts_per_step, out.rl.rollouts_per_prompt = p, n0
    out.rl.allocation.n_max = n_max
    out.compare.null = False
    if "aa" in out.compare:
        out.compare.aa = False
    return out


def regime_thresholds(cfg: ml_collections.ConfigDict) -> list[float | None]:
    """The θ axis of the regime map: `regime.thresholds` (absent or () = one value, None:
    every method keeps its preset θ / the config's override)."""
    return common.float_list(cfg.regime.get("thresholds", ()), "regime.thresholds") or [None]


def regime_methods(cfg: ml_collections.ConfigDict) -> list[str]:
    """`regime.methods` (a tuple of names of `sera_jax.methods.METHODS`)."""
    return common.method_names(cfg.regime.methods, "regime.methods")


def regime_seeds(cfg: ml_collections.ConfigDict) -> list[int]:
    """`regime.seeds` (a non-empty tuple of integers >= 0)."""
    return common.nonempty(common.int_list(cfg.regime.seeds, "regime.seeds"), "regime.seeds")


def uses_threshold(method: str) -> bool:
    """Whether `method`'s preset has an active-set threshold θ (the regime's θ axis varies
    it for these methods only; the others' runs are shared by every θ of a cell)."""
    return "threshold" in methods_lib.get_method(method).options


def default_threshold(cfg: ml_collections.ConfigDict, methods: Sequence[str]) -> float | None:
    """The θ every θ-method of `methods` runs with when the regime does not set one (the
    config's override, else their common preset value; None if they differ). A regime θ
    equal to it reuses the θ-free cell's runs."""
    if cfg.rl.allocation.threshold is not None:
        return float(cfg.rl.allocation.threshold)
    presets = {float(methods_lib.get_method(m).options["threshold"])
               for m in methods if uses_threshold(m)}
    return presets.pop() if len(presets) == 1 else None


def arm_config(ccfg: ml_collections.ConfigDict, method: str, theta: float | None
               ) -> ml_collections.ConfigDict:
    """A regime cell's config for one method at θ (`rl.allocation.threshold = θ` for the
    methods that have one, `ccfg` unchanged for the others)."""
    if theta is None or not uses_threshold(method):
        return ccfg
    out = ml_collections.ConfigDict(ccfg.to_dict())
    out.rl.allocation.threshold = float(theta)
    return out
