"""The matched arms: is SERA more than another step size? One implementation, two rules.

A rule (`Rule`, one stage each, `RULES`) derives a learning rate from finished runs; the lr
and the numbers it read are written into the pre-registration (the rule's own section)
before the arm runs; the arm runs with the matched seeds (`spec.matched_seeds`) from the
shared SFT start in `<stage>/lr<lr>/` and is compared with the runs at the config's lr
(same seeds, same evaluation keys) on its pre-registered endpoint: method − baseline on
pass@k over the primary's window, the seed-level t interval, the two-level bootstrap over
seeds and prompts, and the verdict (`compare.judge`: better / worse / equivalent within
±`compare.margin` / inconclusive, with the MDE at 80 % power). `stage_matched` runs either
rule; `results/<stage>.{json,md}`.

* `--stage=matched` (`LR_MATCHED`, section `lr_matched`): SERA at the config's lr moves
  held-out pass@1 by some gain over the SFT start; uniform at a smaller lr moves it less.
  The arm is uniform at the lr whose pass@1 gain equals SERA's, chosen by `MATCH_RULE`
  (`matched_lr`) from the frontier's results (`results/frontier.json`), compared with SERA
  at the config's lr on held-out pass@k. Gains are window means (the last `window`
  evaluation points, as every frontier point) of held-out pass@1 minus the SFT start's over
  the same points (same keys).
* `--stage=norm_matched` (`NORM_MATCHED`, section `norm_matched`): SERA at the config's
  lr × r, r = uniform's / SERA's mean update norm per step on the comparison's own runs at
  the config's lr (`NORM_MATCH_RULE`, `norm_lr`), compared with uniform at the config's lr
  on the primary's split, k and window. Its section carries the rule, the arm, the endpoint,
  the per-seed update norms, r with its seed-bootstrap CI and the lr, hashed; the arm runs
  only once the file holding it is committed in git. Beside the endpoint, `achieved`: the
  same ratio measured on the arm's own runs (uniform's / the arm's; 1 = matched). If SERA
  at uniform's step size beats uniform, SERA's direction helps; if not, its effect on this
  task is its step size.

An exploratory config (`compare.exploratory`) reports the choice and runs the arm without
writing it anywhere.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop
from sera_jax.records import read_json, read_jsonl, write_json
from sera_jax.studies import common
from sera_jax.studies import compare as cmp
from sera_jax.studies.paired.curves import curve_records, window_bootstrap
from sera_jax.studies.paired.kinds.base import SPLIT_NAMES
from sera_jax.studies.paired.prereg import (
    check_preregistration,
    git_committed,
    hashed_section,
    preregistration_path,
    read_preregistration,
    uncommitted_reason,
)
from sera_jax.studies.paired.spec import (
    MATCH_RULE,
    NORM_MATCH_RULE,
    eval_steps,
    is_exploratory,
    matched_spec,
    norm_matched_spec,
    run_dir,
)
from sera_jax.studies.paired.stages import run_plan
from sera_jax.studies.paired.tables import exploratory_banner, prereg_lines, verdict_sentence
from sera_jax.studies.paired.validity import require_readable


def matched_lr(points: Sequence[tuple[float, float]], target: float) -> dict[str, Any]:
    """`MATCH_RULE` on (lr, uniform gain) points (any order) and SERA's gain `target`:
    {"lr": float | None, "segment": [lr_lo, lr_hi] the crossing lies in, "reason"}."""
    pts = sorted((float(lr), float(g)) for lr, g in points)
    if not pts or any(lr <= 0 for lr, _ in pts):
        raise ValueError(f"need frontier points with lr > 0; got {pts}")
    if not target > 0:
        return {"lr": None, "segment": None,
                "reason": f"SERA's pass@1 gain {target:+.4f} is not positive: only lr -> 0 "
                          "(the SFT start itself) matches it"}
    lr1, g1 = pts[0]
    if g1 >= target:  # the first segment, linear in lr from (0, 0)
        return {"lr": lr1 * target / g1, "segment": [0.0, lr1], "reason": "crossing"}
    for (a, ga), (b, gb) in zip(pts, pts[1:]):
        if (ga - target) * (gb - target) <= 0 and ga != gb:
            t = (target - ga) / (gb - ga)
            return {"lr": math.exp(math.log(a) + t * (math.log(b) - math.log(a))),
                    "segment": [a, b], "reason": "crossing"}
    return {"lr": None, "segment": None,
            "reason": f"uniform's gain never reaches SERA's {target:+.4f} on the grid (max "
                      f"{max(g for _, g in pts):+.4f}): no extrapolation"}


def choose_matched_lr(frontier_out: dict[str, Any], method: str, base: str,
                      method_lr: float) -> dict[str, Any]:
    """`matched_lr` on a frontier's output: uniform's gains at every lr, SERA's at
    `method_lr` (gain = the point's pass@1 mean − the SFT start's, `frontier_out["sft"]`)."""
    # The rule reads held-out points: beside the primary's split's when that is another.
    sft = frontier_out.get("sft_eval", frontier_out.get("sft"))
    if not sft:
        raise common.StudyError("the frontier output has no SFT start point: re-run "
                                "--stage=frontier (it records it)")
    start = float(sft["pass@1"])
    lrs = [{**e, "points": e.get("points_eval", e["points"])}
           for e in frontier_out["lrs"].values()]
    gains = [(float(e["lr"]), e["points"][base]["pass@1"]["mean"] - start)
             for e in lrs if base in e["points"]]
    at = [e for e in lrs if float(e["lr"]) == float(method_lr) and method in e["points"]]
    if not at:
        raise common.StudyError(f"the frontier has no {method} point at lr {method_lr:g} (the "
                                f"config's): add {method!r} to frontier.methods and the lr to "
                                "frontier.learning_rates, then run --stage=frontier")
    target = at[0]["points"][method]["pass@1"]["mean"] - start
    choice = matched_lr(gains, target)
    return {**choice, "target_gain": target, "uniform_gains": {f"{lr:g}": g for lr, g in gains},
            "start_pass1": start}



# ----------------------------------------------------------------------------- the norm rule


def update_norm_means(root: str, arm: str, seeds: Sequence[int], num_steps: int
                      ) -> tuple[dict[str, float], list[str], list[str]]:
    """Per complete run of `arm` under `root` (`spec.run_dir`; complete: `train.jsonl` has
    every step 1..`num_steps`) the mean of its `update_norm` over those steps:
    ({str(seed): mean}, the incomplete runs' directories, the complete runs' directories
    whose records lack `update_norm` at some step)."""
    means, incomplete, lacking = {}, [], []
    for seed in seeds:
        d = run_dir(root, arm, int(seed))
        recs = {int(r["step"]): r for r in read_jsonl(os.path.join(d, loop.TRAIN_RECORDS))
                if "step" in r}
        steps = range(1, int(num_steps) + 1)
        if not all(t in recs for t in steps):
            incomplete.append(d)
            continue
        values = [recs[t].get("update_norm") for t in steps]
        if any(v is None for v in values):
            lacking.append(d)
            continue
        means[str(int(seed))] = float(np.mean(np.asarray(values, np.float64)))
    return means, incomplete, lacking


def _norms(means: Mapping[str, float]) -> dict[str, Any]:
    per = {str(s): float(means[s]) for s in sorted(means, key=int)}
    return {"per_seed": per, "mean": float(np.mean(list(per.values()))) if per else None}


def norm_ratio(numerator: Mapping[str, float], denominator: Mapping[str, float],
               cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """`compare.ratio_of_means` of per-seed mean update norms with the config's bootstrap
    (`compare.bootstrap` resamples, `compare.level`, `compare.bootstrap_seed`)."""
    return cmp.ratio_of_means(numerator, denominator, num_resamples=int(cfg.compare.bootstrap),
                              level=float(cfg.compare.level),
                              seed=int(cfg.compare.bootstrap_seed))


def norm_lr(means: Mapping[str, Mapping[str, float]], method: str, base: str,
            cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """`NORM_MATCH_RULE` on {arm: {str(seed): mean update norm}} at the config's lr:
    {lr: config lr × r, ratio: r = mean over `base`'s seeds / mean over `method`'s with its
    CI (`norm_ratio`), update_norms: {arm: {per_seed, mean}}}. StudyError when an arm has
    fewer than 2 seeds or `method`'s mean is not positive."""
    for arm in (base, method):
        if len(means.get(arm, {})) < 2:
            raise common.StudyError(
                f"--stage=norm_matched: {arm} has {len(means.get(arm, {}))} complete run(s) "
                "with update norms at the config's lr; the rule needs >= 2 per method: run "
                "the comparison first (--stage=rl or --stage=compare)")
    if not np.mean(list(means[method].values())) > 0:
        raise common.StudyError(f"--stage=norm_matched: {method}'s mean update norm is "
                                f"{np.mean(list(means[method].values()))!r}: no step to match")
    ratio = norm_ratio(means[base], means[method], cfg)
    return {"lr": float(cfg.rl.optimizer.learning_rate) * ratio["mean"], "ratio": ratio,
            "update_norms": {arm: _norms(means[arm]) for arm in (base, method)}}


def choose_norm_lr(cfg: ml_collections.ConfigDict, workdir: str, spec: dict[str, Any],
                   recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """`norm_lr` on the workdir's runs at the config's lr: the complete runs of
    `compare.seeds` (once recorded, the seeds the record read), with the inputs beside it.
    StudyError naming the runs when a complete run lacks `update_norm` records."""
    steps = int(cfg.rl.num_steps)
    base, method = spec["baseline"], spec["method"]
    seeds = (recorded["inputs"]["seeds"] if recorded else
             {arm: common.int_list(cfg.compare.seeds, "compare.seeds") for arm in (base, method)})
    means, lacking = {}, []
    for arm in (base, method):
        means[arm], incomplete, bad = update_norm_means(workdir, arm, seeds[arm], steps)
        lacking += bad
        if incomplete:
            logging.warning("--stage=norm_matched: %d run(s) of %s are not complete and are "
                            "not read: %s", len(incomplete), arm, ", ".join(incomplete))
    if lacking:
        raise common.StudyError(
            f"--stage=norm_matched reads every step's update_norm from train.jsonl, but "
            f"{', '.join(lacking)} lack(s) it (runs recorded before the trainer logged it): "
            "re-run the comparison in a fresh workdir")
    out = norm_lr(means, method, base, cfg)
    return {**out, "inputs": {"lr": float(cfg.rl.optimizer.learning_rate), "steps": steps,
                              "seeds": {arm: [int(s) for s in sorted(means[arm], key=int)]
                                        for arm in (base, method)}}}


def achieved_ratio(cfg: ml_collections.ConfigDict, workdir: str, arm_dir: str,
                   spec: dict[str, Any]) -> dict[str, Any]:
    """Did the matching work? The baseline's mean update norm at the config's lr over the
    arm's seeds, the method's on the arm's own runs at the derived lr (complete runs only),
    and their `norm_ratio` (1 = matched; None while either has no complete run)."""
    steps, base, method = int(cfg.rl.num_steps), spec["baseline"], spec["method"]
    a = update_norm_means(workdir, base, spec["seeds"], steps)[0]
    b = update_norm_means(arm_dir, method, spec["seeds"], steps)[0]
    return achieved_from(a, b, cfg)


def achieved_from(base_means: Mapping[str, float], arm_means: Mapping[str, float],
                  cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """`achieved_ratio` from the per-seed means (`recompute` rebuilds it from them)."""
    ok = bool(base_means) and bool(arm_means) and np.mean(list(arm_means.values())) > 0
    return {"update_norms": {"baseline": _norms(base_means), "arm": _norms(arm_means)},
            "ratio": norm_ratio(base_means, arm_means, cfg) if ok else None}


def rederive_norm(cfg: ml_collections.ConfigDict, out: dict[str, Any]) -> dict[str, Any]:
    """The norm rule's numbers that are not counts, rebuilt from the per-seed update norms
    its output records: {choice: `norm_lr`, achieved: `achieved_from`} (`recompute`)."""
    method, base = out["method"], out["baseline"]
    u = out["choice"]["update_norms"]
    got = {"choice": norm_lr({arm: u[arm]["per_seed"] for arm in (base, method)}, method,
                             base, cfg)}
    if out.get("achieved"):
        a = out["achieved"]["update_norms"]
        got["achieved"] = achieved_from(a["baseline"]["per_seed"], a["arm"]["per_seed"], cfg)
    return got


# ----------------------------------------------------------------------------- the rules


@dataclasses.dataclass(frozen=True)
class Rule:
    """One way to derive a matched arm's lr (module docstring). `stage`: its stage, results
    file stem and run folder; `section`: its pre-registration section (`prereg.DERIVED`);
    `runs`: the arm run at the derived lr ("baseline" or "method"; the other one runs at
    the config's lr); `reads`: the pre-registration section that must hold before it;
    `commit_first`: its runs wait for the section to be committed; `what`: its name in
    messages; `spec(cfg)`, `choose(cfg, workdir, spec, recorded)`, `record(spec, choice)`:
    its pre-registered spec, its choice and the section written; `after(cfg, workdir,
    arm_dir, spec)`: more results once the arm ran (or None); `rederive(cfg, out)`: those
    of its output's numbers that are not counts, rebuilt from the output (`recompute`)."""

    stage: str
    section: str
    runs: str
    reads: str
    commit_first: bool
    what: str
    spec: Callable[[ml_collections.ConfigDict], dict[str, Any]]
    choose: Callable[..., dict[str, Any]]
    record: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    after: Callable[..., dict[str, Any]] | None = None
    rederive: Callable[..., dict[str, Any]] | None = None

    def arms(self, spec: dict[str, Any]) -> tuple[str, str]:
        """(the arm at the derived lr, the arm at the config's lr)."""
        method, base = spec["method"], spec["baseline"]
        return (base, method) if self.runs == "baseline" else (method, base)


def _choose_lr_matched(cfg: ml_collections.ConfigDict, workdir: str, spec: dict[str, Any],
                       recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    path = os.path.join(workdir, "results", "frontier.json")
    if not os.path.exists(path):
        raise common.StudyError(f"--stage=matched reads {path}: run --stage=frontier first")
    return choose_matched_lr(read_json(path), spec["method"], spec["baseline"],
                             spec["method_lr"])


LR_KEYS = ("lr", "segment", "reason", "target_gain", "uniform_gains", "start_pass1")

LR_MATCHED = Rule(
    stage="matched", section="lr_matched", runs="baseline", reads="frontier",
    commit_first=False, what="matched", spec=matched_spec, choose=_choose_lr_matched,
    record=lambda spec, choice: {k: choice[k] for k in LR_KEYS})
NORM_MATCHED = Rule(
    stage="norm_matched", section="norm_matched", runs="method", reads="comparison",
    commit_first=True, what="norm-matched", spec=norm_matched_spec, choose=choose_norm_lr,
    record=lambda spec, choice: hashed_section({**spec, **choice}),
    after=lambda cfg, workdir, arm_dir, spec: {
        "achieved": achieved_ratio(cfg, workdir, arm_dir, spec)}, rederive=rederive_norm)
#: The rules by stage.
RULES = {r.stage: r for r in (LR_MATCHED, NORM_MATCHED)}


def record_choice(cfg: ml_collections.ConfigDict, choice: dict[str, Any],
                  rule: Rule = LR_MATCHED, spec: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Write the rule's section (`rule.record` of its spec and `choice`) into the
    pre-registration before the arm runs; a recorded section that differs (the numbers it
    read, or the config, changed after it) is refused: the choice is fixed once."""
    path = preregistration_path(cfg)
    saved = read_preregistration(path)
    rec = rule.record(spec if spec is not None else rule.spec(cfg), choice)
    if rule.section in saved:
        old = saved[rule.section]
        if loop.canonical(old) != loop.canonical(rec):
            changed = [c for c in loop.changed_fields(old, rec) if c != "config_hash"]
            raise common.StudyError(
                f"{path} already records the {rule.what} lr {old.get('lr')} from other numbers "
                f"or another config (changed: {', '.join(changed[:8])}); the rule's choice is "
                "fixed once, before the arm runs: use the runs and the config it was "
                "recorded from")
        return old
    saved[rule.section] = rec
    write_json(path, saved)
    logging.info("pre-registered the %s lr %s in %s (commit it)", rule.what, rec["lr"], path)
    return rec


def require_committed_section(cfg: ml_collections.ConfigDict, rule: Rule, lr: float) -> None:
    """Refuse the arm's runs until the pre-registration holding its section is committed."""
    path = preregistration_path(cfg)
    committed = git_committed(path)
    if not committed:
        raise common.StudyError(
            f"--stage={rule.stage}: {path} records the {rule.what} lr {lr:.6g} (section "
            f"{rule.section!r}), but {uncommitted_reason(committed)}: commit it (git add "
            f"<file> && git commit), then run --stage={rule.stage} again; the arm runs only "
            "from a committed registration")


def matched_config(cfg: ml_collections.ConfigDict, lr: float) -> ml_collections.ConfigDict:
    """`cfg` at `lr` with no null and no A/A arm (a matched arm only runs there)."""
    out = ml_collections.ConfigDict(cfg.to_dict())
    out.rl.optimizer.learning_rate = float(lr)
    out.compare.null = False
    out.compare.aa = False
    return out


def matched_endpoint(cfg: ml_collections.ConfigDict, method_dir: str, baseline_dir: str,
                     seeds: Sequence[int], split: str = "eval") -> dict[str, Any]:
    """The primary's method (runs in `method_dir`) − the baseline (in `baseline_dir`):
    `endpoint_from_curves` of the runs' curve records on `split`."""
    p, base = cfg.compare.primary, cfg.compare.baseline
    a = {s: r for s in seeds if (r := curve_records(cfg, method_dir, p.method, s))}
    b = {s: r for s in seeds if (r := curve_records(cfg, baseline_dir, base, s))}
    return endpoint_from_curves(cfg, a, b, seeds, split)


def endpoint_from_curves(cfg: ml_collections.ConfigDict, a: dict[int, Any],
                         b: dict[int, Any], seeds: Sequence[int], split: str = "eval"
                         ) -> dict[str, Any]:
    """The endpoint from {seed: {step: record}} of the method (`a`) and the baseline (`b`):
    pass@k on `split` over the primary's window, seed-level t (`compare.curve_difference`),
    the two-level bootstrap (`curves.window_bootstrap`) and the verdict (`compare.judge`
    against `compare.margin`)."""
    p = cfg.compare.primary
    steps = eval_steps(cfg)
    window = min(int(p.window), max(len(steps) - 1, 1))
    both = sorted(s for s in set(a) & set(b) if s in set(seeds) and a[s] and b[s])
    if not both:
        return {"ran": False, "seeds": []}
    n, k, level = int(cfg.eval.curve_samples), int(p.k), float(cfg.compare.level)

    def counts(r: dict[int, Any], t: int) -> Any:
        return (r[t] if split == "eval" else r[t][split])["num_correct"]

    ca = np.asarray([[counts(a[s], t) for t in steps] for s in both])
    cb = np.asarray([[counts(b[s], t) for t in steps] for s in both])
    d = cmp.curve_difference(ca, cb, n, [1, k], steps, level=level, window=window)
    boot = window_bootstrap(ca, cb, n, k, window, num_resamples=int(cfg.compare.bootstrap),
                            level=level, seed=int(cfg.compare.bootstrap_seed))
    estimate = d["window"][str(k)]
    return {"ran": True, "seeds": both, "window_used": window, "estimate": estimate,
            "pass1": d["window"]["1"], "two_level": boot,
            **cmp.judge(estimate, cfg.compare.get("margin"), None, level)}


def stage_matched(cfg: ml_collections.ConfigDict, workdir: str, mesh=None,
                  seeds: Sequence[int] | None = None, rule: Rule = LR_MATCHED
                  ) -> dict[str, Any]:
    """Derive the arm's lr by `rule`, pre-register it, run the arm (restricted to `seeds`
    when given: one process per core) and write `results/<rule.stage>.{json,md}`."""
    exploratory = is_exploratory(cfg)
    prereg = ({"found": False, "exploratory": True} if exploratory
              else check_preregistration(cfg, rule.reads))
    validity = require_readable(cfg, os.path.join(workdir, "sft"), f"--stage={rule.stage}")
    spec = rule.spec(cfg)
    saved = (None if exploratory else
             read_preregistration(preregistration_path(cfg)).get(rule.section))
    choice = rule.choose(cfg, workdir, spec, saved)
    # An exploratory run has no pre-registration to fix the choice in: it is only reported.
    recorded = choice if exploratory else record_choice(cfg, choice, rule, spec)
    out: dict[str, Any] = {"rule": spec["rule"], **spec, "stage": rule.stage,
                           "choice": recorded, "preregistration": prereg, "validity": validity,
                           **({"exploratory": True} if exploratory else {})}
    if recorded["lr"] is not None:
        lr = float(recorded["lr"])
        if rule.commit_first and not exploratory:
            require_committed_section(cfg, rule, lr)
        dcfg = matched_config(cfg, lr)
        ddir = os.path.join(workdir, rule.stage, f"lr{lr:.6g}")
        only = None if seeds is None else {int(s) for s in seeds}
        sft_dir = os.path.join(workdir, "sft")
        derived, fixed = rule.arms(spec)
        run_plan(dcfg, ddir, [(derived, spec["seeds"])], mesh, only=only, sft_dir=sft_dir)
        run_plan(cfg, workdir, [(fixed, spec["seeds"])], mesh, only=only,
                 sft_dir=sft_dir)  # the config's lr: the comparison's own runs
        out["dir"] = os.path.relpath(ddir, workdir)
        method_dir, base_dir = (ddir, workdir) if rule.runs == "method" else (workdir, ddir)
        out["result"] = matched_endpoint(dcfg, method_dir, base_dir, spec["seeds"],
                                         spec["endpoint"]["split"])
        if rule.after is not None:
            out.update(rule.after(cfg, workdir, ddir, spec))
    results = os.path.join(workdir, "results")
    os.makedirs(results, exist_ok=True)
    write_json(os.path.join(results, f"{rule.stage}.json"), out)
    with open(os.path.join(results, f"{rule.stage}.md"), "w") as f:
        f.write(matched_markdown(out))
    return out


# ----------------------------------------------------------------------------- reports


def _ratio(e: dict[str, Any] | None) -> str:
    if not e:
        return "not measured"
    band = "" if e.get("lo") is None else (
        f" [{e['lo']:.3f}, {e['hi']:.3f}] ({100 * e['level']:.0f} % seed bootstrap)")
    return f"{e['mean']:.3f}{band}"


def _per_seed(e: dict[str, Any]) -> str:
    return ", ".join(f"{s}: {v:.4g}" for s, v in e["per_seed"].items())


def _lr_lines(out: dict[str, Any]) -> list[str]:
    c = out["choice"]
    gains = ", ".join(f"{lr}: {100 * g:+.2f}" for lr, g in c["uniform_gains"].items())
    return [f"lr-matched arm. Rule: {out['rule']}.", "",
            f"Uniform's pass@1 gain over the SFT start by lr (pp): {gains}; {out['method']}'s "
            f"at lr {out['method_lr']:g}: {100 * c['target_gain']:+.2f} pp.",
            "Matched lr: " + (f"{c['lr']:.4g} (between {c['segment'][0]:g} and "
                              f"{c['segment'][1]:g})" if c["lr"] is not None
                              else f"none -- {c['reason']}") + "."]


def _norm_lines(out: dict[str, Any]) -> list[str]:
    c, base, method = out["choice"], out["baseline"], out["method"]
    u = c["update_norms"]
    return [f"Norm-matched arm. Rule: {out['rule']}.", "",
            f"Mean update norm per step at lr {out['baseline_lr']:g}, per seed: {base} "
            f"{_per_seed(u[base])} (mean {u[base]['mean']:.4g}); {method} "
            f"{_per_seed(u[method])} (mean {u[method]['mean']:.4g}).",
            f"r = {base} / {method} = {_ratio(c['ratio'])}; norm-matched lr: "
            f"{out['baseline_lr']:g} × {c['ratio']['mean']:.4g} = {c['lr']:.4g}."]


def _achieved_lines(out: dict[str, Any]) -> list[str]:
    a = out.get("achieved")
    if not a:
        return []
    return ["", f"Achieved update-norm ratio, {out['baseline']} at lr {out['baseline_lr']:g} / "
            f"{out['method']} at the norm-matched lr (1 = matched): {_ratio(a['ratio'])}."]


def matched_markdown(out: dict[str, Any]) -> str:
    """The rule, the chosen lr with its inputs, the endpoint with both intervals and its
    verdict, and (the norm rule) the achieved update-norm ratio."""
    lines = [exploratory_banner(), ""] if out.get("exploratory") else []
    norm = out.get("stage") == NORM_MATCHED.stage
    lines += _norm_lines(out) if norm else _lr_lines(out)
    r = out.get("result")
    if r and r.get("ran"):
        e, b, e1 = r["estimate"], r["two_level"], r["pass1"]
        k = out["endpoint"]["k"]
        where = SPLIT_NAMES.get(out["endpoint"].get("split", "eval"), "held-out")
        band = ("" if e["lo"] is None else
                f" [{100 * e['lo']:+.2f}, {100 * e['hi']:+.2f}] (seed-level t)")
        lines += ["", f"**{out['endpoint']['comparison']}** on {where} pass@{k}, mean of the "
                  f"last {r['window_used']} points, {len(r['seeds'])} seeds: "
                  f"{100 * e['mean']:+.2f}{band}; two-level bootstrap (seeds and prompts) "
                  f"[{100 * b['lo']:+.2f}, {100 * b['hi']:+.2f}]. Pass@1 difference"
                  f"{'' if norm else ' (the match check)'}: {100 * e1['mean']:+.2f} pp."
                  + verdict_sentence(r)]
    lines += _achieved_lines(out)
    v = out.get("validity")
    if v:
        lines += ["", f"Task validity: {v['line']}" + (" -- override." if v.get("override")
                                                      else ".")]
    lines += prereg_lines(out.get("preregistration"))
    return "\n".join(lines) + "\n"


__all__ = ["LR_MATCHED", "MATCH_RULE", "NORM_MATCHED", "NORM_MATCH_RULE", "RULES", "Rule",
           "achieved_from", "achieved_ratio", "choose_matched_lr", "choose_norm_lr",
           "endpoint_from_curves", "matched_config", "matched_endpoint", "matched_lr",
           "matched_markdown", "norm_lr", "norm_ratio", "record_choice", "rederive_norm",
           "require_committed_section", "stage_matched", "update_norm_means"]
