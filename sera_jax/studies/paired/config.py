"""The paired study's configuration, checked and resolved once at entry.

`resolve(cfg, stage, methods, seeds)` calls the validator of every block the stage reads --
the kind's task / model / start blocks (`Kind.validate`), the RL and optimizer blocks of every
arm (`rl.config.validate`), `eval`, `compare` (with its primary endpoint and validity gate),
`frontier`, `regime` and the norm-matched arm's fields -- before any data or model is built,
and returns a `Plan`: the methods and seeds, every arm's `Method` resolved once, and the RL
stage's run plan. Stages receive the plan and never validate again. Errors are one
`StudyError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import ml_collections
import numpy as np

from sera_jax import methods as methods_lib
from sera_jax.models.configs import CACHE_DTYPE_HELP, CACHE_DTYPE_NAMES
from sera_jax.rl import config as rl_config
from sera_jax.studies import common
from sera_jax.studies.paired.kinds import get_kind
from sera_jax.studies.paired.spec import (
    CONTROLS,
    EVAL_DEFAULTS,
    SPLITS,
    STAGES,
    arm_config,
    arms,
    cell_config,
    frontier_learning_rates,
    frontier_method_seeds,
    lr_arms,
    lr_config,
    matched_seeds,
    regime_cells,
    regime_methods,
    regime_seeds,
    regime_thresholds,
    rl_plan,
    run_config,
    test_split,
    uses_threshold,
)


def validate(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int],
             method_seeds: Mapping[str, Sequence[int]] | None = None
             ) -> dict[str, methods_lib.Method]:
    """Every field the stages read, checked before any data or model is built; returns each
    arm's `Method` (the method name with the `rl.allocation.*` overrides), resolved once here
    and passed down to its runs (`stage_rl(..., resolved=...)`). `method_seeds`: the
    frontier's per-method seeds at one lr (`spec.lr_arms`), checked already."""
    c = common.check
    t = cfg.task
    get_kind(cfg).validate(cfg)  # the task, model and start blocks
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the comparison sets it per run from --methods / config.compare.methods")
    for control in CONTROLS:
        c(control not in methods, "methods", control, "a control arm is config.compare.null / "
          "config.compare.aa, not a method name")
    validate_compare(cfg)
    resolved_arms = {}
    for method in [a for a, _ in arms(cfg, methods, seeds, method_seeds)]:
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
      " (0 = no training-prompt evaluation, so no realised κ)")
    validate_test_prompts(cfg)
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
    for field, low in (("kl_prompts", 0), ("kl_samples", 1)):  # mechanism.measure's KL
        v = e.get(field, EVAL_DEFAULTS[field])
        c(isinstance(v, int) and v >= low, f"eval.{field}", v, f"an integer >= {low}")
    if cfg.compare.get("primary") is not None:
        validate_primary(cfg)
    return resolved_arms


#: Where a sealed test split comes from (the errors' fix).
SEALED_HOW = ("a kind whose task has one: the maze's task.num_test > 0 with its own "
              "task.test_seed, or generated math problems with task.num_test > 0")


def validate_test_prompts(cfg: ml_collections.ConfigDict) -> None:
    """`eval.test_prompts` (absent = 0): an integer in [0, the sealed test split's size]; > 0
    only for a task with a sealed test split (its kind's `test_split`)."""
    n = cfg.eval.get("test_prompts", 0)
    common.check(isinstance(n, int) and not isinstance(n, bool) and n >= 0,
                 "eval.test_prompts", n, "an integer >= 0 (0 = no sealed test evaluation)")
    if n > 0:
        split = test_split(cfg)
        common.check(split is not None, "eval.test_prompts", n,
                     f"0: the {get_kind(cfg).name} task of this config has no sealed test "
                     f"split ({SEALED_HOW})")
        common.check(n <= split["num_test"], "eval.test_prompts", n,
                     f"<= task.num_test={split['num_test']}")


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
    c(isinstance(k.get("exploratory", False), bool), "compare.exploratory",
      k.get("exploratory"), "True (run without a pre-registration; every output says "
      "exploratory) or False")
    if k.get("aa", False):
        common.int_list(k.aa_seeds, "compare.aa_seeds")  # () = compare.seeds
        c(isinstance(k.aa_seed_offset, int) and k.aa_seed_offset > 0, "compare.aa_seed_offset",
          k.aa_seed_offset, "an integer > 0 (the A/A arm's RL seed is seed + offset)")
    validate_margin(k.get("margin"), "compare.margin", "the primary endpoint's", k.level)
    validate_validity(cfg)


def validate_margin(margin: object, field: str, units: str, level: float) -> None:
    """An equivalence margin (`compare.margin`, `frontier.margin`): None (none registered)
    or a number in (0, 1) in the units of the metric (0.02 = 2 percentage points); its
    equivalence test runs at 2 · `compare.level` − 1 (90 % for 95 %), so the level must
    exceed 0.5."""
    if margin is None:
        return
    common.check(isinstance(margin, int | float) and not isinstance(margin, bool)
                 and bool(np.isfinite(margin)) and 0 < margin < 1, field, margin,
                 f"None (no margin registered) or a float in (0, 1): the equivalence margin "
                 f"in {units} units, e.g. 0.02 = 2 percentage points")
    common.check(float(level) > 0.5, "compare.level", level,
                 f"a float in (0.5, 1) with {field} set (its equivalence test runs at "
                 "2 · level − 1)")


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
          "'eval' (eval.train_prompts = 0: no training-prompt evaluation)")
    if p.split == "test":
        c(test_split(cfg) is not None, "compare.primary.split", p.split,
          f"'eval' or 'train': the {get_kind(cfg).name} task of this config has no sealed "
          f"test split ({SEALED_HOW}, and eval.test_prompts > 0)")
        c(int(cfg.eval.get("test_prompts", 0)) > 0, "compare.primary.split", p.split,
          "'eval' or 'train' (eval.test_prompts = 0: the sealed test split is not scored; "
          "set eval.test_prompts > 0 to read the primary endpoint on it)")
    c(common.positive_int(p.k) and p.k <= int(cfg.eval.curve_samples), "compare.primary.k",
      p.k, f"an integer in [1, eval.curve_samples={cfg.eval.curve_samples}]")
    # A run shorter than the window (e.g. a quick --config.rl.num_steps=100) averages the
    # points it has; the report records the window it used (curves.primary.window_used).
    c(common.positive_int(p.window), "compare.primary.window", p.window,
      "an integer >= 1 (evaluation points after step 0 to average)")
    c(isinstance(k.gate_floor_multiple, int | float) and k.gate_floor_multiple >= 0,
      "compare.gate_floor_multiple", k.gate_floor_multiple, "a number >= 0")


def validate_validity(cfg: ml_collections.ConfigDict) -> None:
    """The validity fields (when present): types and ranges."""
    c, k = common.check, cfg.compare
    c(isinstance(k.get("allow_blind_task", False), bool), "compare.allow_blind_task",
      k.get("allow_blind_task"), "True or False")
    r = k.get("validity_pass1_ratio", 2.0)
    c(isinstance(r, int | float) and np.isfinite(r) and r >= 1, "compare.validity_pass1_ratio",
      r, "a number >= 1 (the start's pass@1 / blind pass@1 it needs at least)")
    s = k.get("validity_blind_share", 0.5)
    c(isinstance(s, int | float) and 0 < s <= 1, "compare.validity_blind_share", s,
      "a number in (0, 1] (blind pass@k / the start's pass@k allowed at most)")
    vk = k.get("validity_k", 0)
    c(isinstance(vk, int) and 0 <= vk <= int(cfg.eval.num_samples), "compare.validity_k", vk,
      f"an integer in [0, eval.num_samples={cfg.eval.num_samples}] (0 = the primary's k)")


def validate_frontier(cfg: ml_collections.ConfigDict) -> None:
    """The frontier fields, and every lr's config as a comparison."""
    common.check("frontier" in cfg, "frontier", None,
                 "a frontier section (configs/maze/cpu.py has one)")
    common.check(isinstance(cfg.frontier.null, bool), "frontier.null", cfg.frontier.null,
                 "True or False (the null control gives each lr's gate)")
    common.int_list(cfg.frontier.null_seeds, "frontier.null_seeds")
    common.check(cfg.compare.get("primary") is not None, "compare.primary", None,
                 "set: the frontier's metric and window are the primary endpoint's")
    validate_margin(cfg.frontier.get("margin"), "frontier.margin", "pass@k",
                    cfg.compare.level)
    frontier_method_seeds(cfg)  # every key a frontier method, every value seeds
    for lr in frontier_learning_rates(cfg):
        try:
            validate(lr_config(cfg, lr), *lr_arms(cfg, lr))
        except common.StudyError as e:
            raise common.StudyError(f"frontier lr={lr:g}: {e}") from None


def validate_regime(cfg: ml_collections.ConfigDict) -> list[tuple[int, int, int]]:
    """The regime fields, and every cell's config as a comparison; returns the cells."""
    c = common.check
    c("regime" in cfg, "regime", None, "a regime section (configs/maze/regime_map.py)")
    r = cfg.regime
    c(common.positive_int(r.n_max_factor), "regime.n_max_factor", r.n_max_factor,
      "an integer >= 1")
    c(common.positive_int(r.n_max_cap), "regime.n_max_cap", r.n_max_cap, "an integer >= 1")
    cells = regime_cells(cfg)
    methods = regime_methods(cfg)
    seeds = regime_seeds(cfg)
    thetas = regime_thresholds(cfg)
    c(cfg.compare.baseline in methods, "regime.methods", r.methods,
      f"a list with compare.baseline={cfg.compare.baseline!r}")
    c(thetas == [None] or any(uses_threshold(m) for m in methods), "regime.thresholds",
      r.get("thresholds"), "empty: none of regime.methods has an active-set threshold")
    c(all(t is None or 0.0 <= t < 1.0 for t in thetas), "regime.thresholds",
      r.get("thresholds"), "values in [0, 1)")
    for cell in cells:
        for theta in thetas:
            try:
                for m in methods:
                    validate(arm_config(cell_config(cfg, cell), m, theta), [m], seeds)
            except common.StudyError as e:
                at = "" if theta is None else f" θ={theta:g}"
                raise common.StudyError(f"regime cell P={cell[0]} N0={cell[1]} "
                                        f"n_max={cell[2]}{at}: {e}") from None
    return cells


def validate_norm_matched(cfg: ml_collections.ConfigDict) -> None:
    """The norm-matched arm's fields: `compare.primary` (its method, split, k and window)
    and its seeds (`spec.matched_seeds`: `frontier.matched_seeds`, else `compare.seeds`)."""
    common.check(cfg.compare.get("primary") is not None, "compare.primary", None,
                 "set: the norm-matched arm's method, split, k and window are the primary "
                 "endpoint's")
    for seed in common.nonempty(matched_seeds(cfg), "frontier.matched_seeds"):
        common.check(seed >= 0, "frontier.matched_seeds", seed, "integers >= 0")


#: Stages that start RL runs: each needs a committed pre-registration unless exploratory.
RL_STAGES = ("rl", "all", "compare", "frontier", "matched", "norm_matched", "regime")
#: Stages that need the start stage's output in the workdir.
NEEDS_START = ("rl", "eval", "compare", "frontier", "matched", "norm_matched", "export")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A stage resolved once at entry (`resolve`): what it runs, with every arm's `Method`.

    `runs`: the RL stage's (arm, seeds), restricted to `--seeds` / `--methods` when given
    (`spec.rl_plan`); `only_seeds`: the seeds were given on the command line (the frontier
    and matched stages run this process's share of seeds only)."""

    stage: str
    methods: list[str]
    seeds: list[int]
    resolved: dict[str, methods_lib.Method]
    runs: list[tuple[str, list[int]]]
    only_seeds: bool
    exploratory: bool


def resolve(cfg: ml_collections.ConfigDict, stage: str,
            methods: Sequence[str | methods_lib.Method] | None = None,
            seeds: Sequence[int | str] | None = None) -> Plan:
    """Check everything `stage` reads (module docstring) and return its `Plan`.

    `methods` / `seeds`: the binary's `--methods` / `--seeds` (names or `Method` presets;
    integers or digit strings), defaulting to `compare.methods` / `compare.seeds`; errors
    name the flag or the field. Refused here, before any work: an unknown stage; an RL stage
    of a config that is neither pre-registrable (`compare.primary` set) nor
    `compare.exploratory`; `export`, `preregister` or `amend` of an exploratory config.
    """
    if stage not in STAGES:
        raise common.StudyError(f"stage={stage!r}; choose from {STAGES}")
    explicit_methods = methods is not None  # --methods: the controls run with the baseline
    names = (common.method_names(methods, "--methods") if methods is not None
             else common.method_names(cfg.compare.methods, "compare.methods"))
    only_seeds = seeds is not None  # --seeds restricts the control arms' seeds too
    what = "--seeds" if only_seeds else "compare.seeds"
    seed_list = common.nonempty(
        common.int_list(cfg.compare.seeds if seeds is None else seeds, what), what)
    resolved = validate(cfg, names, seed_list)
    exploratory = bool(cfg.compare.get("exploratory", False))
    if stage == "regime":
        validate_regime(cfg)
    if stage in ("frontier", "matched") or (stage == "preregister" and "frontier" in cfg):
        validate_frontier(cfg)
    if stage == "norm_matched":
        validate_norm_matched(cfg)
    if exploratory and stage in ("export", "preregister", "amend"):
        raise common.StudyError(
            f"--stage={stage} of an exploratory study (compare.exploratory=True): "
            + ("exploratory results are not exported as results" if stage == "export" else
               "an exploratory config is not pre-registered")
            + "; set --config.compare.exploratory=False and pre-register the config "
              "(--stage=preregister, committed) before its RL runs")
    if not exploratory and stage in RL_STAGES and cfg.compare.get("primary") is None:
        raise common.StudyError(
            f"--stage={stage}: compare.primary is None, so there is no endpoint to "
            "pre-register: set compare.primary, or run it as an exploration with "
            "--config.compare.exploratory=True (every output then says so)")
    return Plan(stage=stage, methods=names, seeds=seed_list, resolved=resolved,
                runs=rl_plan(cfg, names, seed_list, only_seeds, explicit_methods),
                only_seeds=only_seeds, exploratory=exploratory)
