r"""The maze study: SFT from scratch, then RL of each method x seed at matched rollout
budgets, then the comparison (SERA_SPEC §7).

Stages (each resumes or skips finished work, so re-running a killed command continues it):

* `sft`: supervised next-token training on BFS shortest paths (`sera_jax.sft` on the one
  loop), then the SFT model's evaluation on the held-out mazes (cached under the SFT
  fingerprint: a changed SFT or evaluation config recomputes it); it is also step 0 of
  every RL curve.
* `rl`: for each method (a name of `sera_jax.methods.METHODS`) and seed, RL from the SFT
  checkpoint on the one loop (`sera_jax.loop`); held-out pass@k every `eval.every` steps
  and at the end. Every method generates exactly `P·N0` rollouts per step.
* `eval`: aggregation over seeds -> `results/comparison.md|json`, `results/*.png`.
* `all` = sft + rl + eval; `compare` = rl + eval.

Workdir layout: `sft/` (checkpoints, train.jsonl, eval.json, config.json),
`rl/<method>/seed<s>/` (checkpoints, tensorboard, train.jsonl, eval.jsonl, config.json),
`results/`, `timings.jsonl`.

A run's fingerprint is the task, model, SFT, resolved RL and evaluation config plus the SFT
checkpoint it starts from; resuming under a change to any of them is refused, except the
fields in `RESUMABLE` (how long, how often).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from sera_jax import loop
from sera_jax import sft as sft_lib
from sera_jax import sharding as shd
from sera_jax.metrics import pass_at_k_curve
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.models.decoder import Decoder
from sera_jax.records import log_timing, read_json, read_jsonl, write_json
from sera_jax.rl import config as rl_config
from sera_jax.rl import evaluate as eval_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.studies import common
from sera_jax.tasks import maze as maze_lib

STAGES = ("sft", "rl", "eval", "all", "compare")
#: Fingerprint fields a resumed run may change (how long and how often, never what).
RESUMABLE = trainer_lib.RESUMABLE + sft_lib.RESUMABLE + ("eval.every", "eval.batch_size",
                                                         "compare")


# ----------------------------------------------------------------------------- building


def build_task(cfg: ml_collections.ConfigDict) -> maze_lib.MazeTask:
    """The maze task of `cfg.task` (splits train / eval / sft)."""
    return maze_lib.task_from_config(cfg.task)


def build_model(cfg: ml_collections.ConfigDict) -> Decoder:
    """A freshly initialised policy: the named preset `cfg.model.preset` with overrides."""
    overrides = dict(cfg.model.get("overrides", {}) or {})
    dcfg = get_model_config(cfg.model.preset, **overrides)
    if dcfg.vocab_size != maze_lib.VOCAB_SIZE:
        raise common.StudyError(f"config.model: vocab_size={dcfg.vocab_size}; the maze "
                                f"vocabulary has {maze_lib.VOCAB_SIZE} ids")
    return Decoder(dcfg, rngs=nnx.Rngs(int(cfg.model.seed)))


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def run_config(cfg: ml_collections.ConfigDict, method: str, seed: int
               ) -> ml_collections.ConfigDict:
    """The resolved trainer config of one run: `cfg.rl` for `method` (user overrides on top of
    the method preset take effect or raise), seed set."""
    rl = rl_config.with_method(cfg.rl, method)
    rl.seed = int(seed)
    return rl


def sft_width(task: maze_lib.MazeTask) -> int:
    """Static SFT row length: the prompt plus the longest answer the task can have."""
    return task.max_prompt_len + maze_lib.max_answer_length(task.size)


def eval_sampling(cfg: ml_collections.ConfigDict, task: maze_lib.MazeTask) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=task.max_new_tokens, temperature=cfg.eval.temperature,
                          stop_ids=tuple(task.stop_ids), pad_id=task.pad_id)


def sft_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What defines the SFT model: task (its splits), model and SFT config."""
    return {"task": cfg.task.to_dict(), "model": cfg.model.to_dict(), "sft": cfg.sft.to_dict()}


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict,
                   sft_step: int) -> dict[str, Any]:
    """What defines one RL run: the SFT model it starts from, the resolved RL config and the
    evaluation that its curve records."""
    return {**sft_fingerprint(cfg), "start": {"sft_step": int(sft_step)}, "rl": rl.to_dict(),
            "eval": cfg.eval.to_dict()}


# ----------------------------------------------------------------------------- validation


def validate(cfg: ml_collections.ConfigDict, methods: Sequence[str], seeds: Sequence[int]
             ) -> None:
    """Every field the stages read, checked before any data or model is built."""
    c = common.check
    t = cfg.task
    c(isinstance(t.size, int) and t.size >= 3 and t.size % 2 == 1, "task.size", t.size,
      "an odd integer >= 3")
    for field in ("num_train", "num_eval"):
        c(common.positive_int(t[field]), f"task.{field}", t[field], "an integer >= 1")
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
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the comparison sets it per run from --methods / config.compare.methods")
    for method in methods:
        try:
            rl_config.validate(run_config(cfg, method, 0))
        except ValueError as e:
            raise common.StudyError(f"method {method!r}: {e}") from None
    c(cfg.rl.prompts_per_step <= t.num_train, "rl.prompts_per_step", cfg.rl.prompts_per_step,
      f"<= task.num_train={t.num_train}")
    for seed in seeds:
        c(isinstance(seed, int) and seed >= 0, "compare.seeds", seed, "integers >= 0")
    e = cfg.eval
    for field in ("num_samples", "curve_samples", "num_prompts", "batch_size"):
        c(common.positive_int(e[field]), f"eval.{field}", e[field], "an integer >= 1")
    c(e.num_prompts <= t.num_eval, "eval.num_prompts", e.num_prompts,
      f"<= task.num_eval={t.num_eval}")
    c(isinstance(e.every, int) and e.every >= 0, "eval.every", e.every, ">= 0 (0 = final only)")
    c(isinstance(e.temperature, int | float) and np.isfinite(e.temperature) and
      e.temperature > 0, "eval.temperature", e.temperature, "a finite number > 0")
    c(isinstance(e.seed, int), "eval.seed", e.seed, "an integer")


# ----------------------------------------------------------------------------- evaluation


def evaluate_policy(model: Any, task: maze_lib.MazeTask, cfg: ml_collections.ConfigDict,
                    num_samples: int, step: int, mesh: jax.sharding.Mesh | None
                    ) -> dict[str, Any]:
    """Held-out evaluation: `num_samples` completions per maze at `eval.temperature`.

    The key depends on (eval.seed, step) only, so every method and seed is evaluated with
    the same random numbers at the same step (common random numbers). Returns a JSON-able
    record with the pass@k curve and the per-maze correct counts.
    """
    ids = np.arange(min(int(cfg.eval.num_prompts), task.split_size("eval")))
    batch = shd.round_up_to_shards(int(cfg.eval.batch_size), mesh)
    t0 = time.perf_counter()
    res = eval_lib.evaluate(
        model, task, "eval", num_samples=int(num_samples), sampling=eval_sampling(cfg, task),
        key=jax.random.fold_in(jax.random.key(int(cfg.eval.seed)), int(step)), prompt_ids=ids,
        batch_size=batch, mesh=mesh)
    ks, values = pass_at_k_curve(np.full(ids.size, res.num_samples), res.num_correct)
    return {"step": int(step), "num_samples": int(res.num_samples),
            "pass_at_k": {str(int(k)): float(v) for k, v in zip(ks, values)},
            "num_correct": res.num_correct.astype(int).tolist(),
            "maj": next((v for k, v in res.summary.items() if k.startswith("maj@")), None),
            "mean_length": res.summary["mean_length"], "seconds": time.perf_counter() - t0}


def pass1_distribution(num_correct: Sequence[int], num_samples: int) -> dict[str, Any]:
    """Summary of per-maze pass@1 = c/n: mean, quantiles, histogram over fixed bins."""
    p = np.asarray(num_correct, np.float64) / num_samples
    edges = [0.0, 1e-12, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0 - 1e-12, 1.0 + 1e-12]
    labels = ["0", "(0,.1)", "[.1,.3)", "[.3,.5)", "[.5,.7)", "[.7,.9)", "[.9,1)", "1"]
    hist, _ = np.histogram(p, bins=edges)
    return {"mean": float(p.mean()), "std": float(p.std()),
            "quantiles": {q: float(np.quantile(p, float(q))) for q in
                          ("0.1", "0.25", "0.5", "0.75", "0.9")},
            "histogram": dict(zip(labels, hist.astype(int).tolist())),
            "fraction_unsolved": float((p == 0).mean()), "fraction_always": float((p == 1).mean())}


# ----------------------------------------------------------------------------- stages


def stage_sft(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
    """Train (or resume / skip) SFT and evaluate it on the held-out mazes (cached by the SFT
    and evaluation fingerprint)."""
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    sft_dir = os.path.join(workdir, "sft")
    model = build_model(cfg)
    program = sft_lib.SFTProgram(
        model, cfg.sft, lambda ids: task.sft_examples(cfg.sft.split, ids),
        task.split_size(cfg.sft.split), sft_width(task), task.pad_id, mesh=mesh)
    result = sft_lib.train(program, sft_dir, fingerprint=sft_fingerprint(cfg))
    if result.resumed_from != cfg.sft.num_steps:
        log_timing(workdir, "sft_train", result.seconds)

    def compute() -> dict[str, Any]:
        t0 = time.perf_counter()
        out = {"curve": evaluate_policy(program.model, task, cfg, cfg.eval.curve_samples, 0,
                                        mesh)}
        if cfg.eval.num_samples != cfg.eval.curve_samples:
            out["final"] = evaluate_policy(program.model, task, cfg, cfg.eval.num_samples, 0,
                                           mesh)
        else:
            out["final"] = out["curve"]
        out["pass1_distribution"] = pass1_distribution(out["final"]["num_correct"],
                                                       out["final"]["num_samples"])
        log_timing(workdir, "sft_eval", time.perf_counter() - t0)
        logging.info("SFT model: pass@1 distribution over held-out mazes %s",
                     out["pass1_distribution"])
        return out

    fingerprint = {**sft_fingerprint(cfg), "sft_step": result.step,
                   "eval": {k: cfg.eval[k] for k in ("num_samples", "curve_samples",
                                                     "num_prompts", "temperature", "seed")}}
    return common.cached_json(os.path.join(sft_dir, "eval.json"), fingerprint, compute)


def run_dir(workdir: str, method: str, seed: int) -> str:
    return os.path.join(workdir, "rl", method, f"seed{seed}")


def stage_rl(cfg: ml_collections.ConfigDict, workdir: str, method: str, seed: int, mesh=None,
             stop_after: int | None = None) -> loop.Result:
    """One RL run from the SFT checkpoint on the one loop; resumes from its own checkpoint.

    `stop_after` (tests) stops after that many steps of this call, as a kill would.
    """
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    rl = run_config(cfg, method, seed)
    out = run_dir(workdir, method, seed)
    sft_dir = os.path.join(workdir, "sft")
    sft_eval_path = os.path.join(sft_dir, "eval.json")
    if not os.path.exists(sft_eval_path):
        raise common.StudyError(f"no SFT evaluation at {sft_eval_path}: run --stage=sft first")
    model = build_model(cfg)
    sft_step = sft_lib.load_final_params(model, cfg.sft, sft_dir, mesh,
                                         fingerprint=sft_fingerprint(cfg))
    sft_eval = read_json(sft_eval_path)
    if sft_eval.get("fingerprint", {}).get("sft_step") != sft_step:
        raise common.StudyError(f"{sft_eval_path} does not evaluate the SFT checkpoint "
                                f"(step {sft_step}); run --stage=sft again")
    trainer = trainer_lib.Trainer(rl, task, model, mesh)
    counter = common.RolloutCounter(out, trainer.budget)

    def on_start(step: int, state: Any) -> None:
        counter.on_start(step, state)
        if step == 0 and not read_jsonl(os.path.join(out, loop.EVAL_RECORDS)):
            common.append_eval(out, {**sft_eval["curve"], "rollouts": 0, "tokens": 0})

    def evaluate(step: int, state: Any, final: bool) -> dict[str, float]:
        policy = trainer.model(state)
        n = cfg.eval.num_samples if final else cfg.eval.curve_samples
        ev = evaluate_policy(policy, task, cfg, n, step, mesh)
        where = {"rollouts": step * trainer.budget, "tokens": counter.tokens}
        if final and cfg.eval.curve_samples != cfg.eval.num_samples:
            # The curve keeps one sample size; the final point is also measured so.
            curve = evaluate_policy(policy, task, cfg, cfg.eval.curve_samples, step, mesh)
            common.append_eval(out, {**curve, **where, "curve": True})
            ev["final_only"] = True
        common.append_eval(out, {**ev, **where})
        logging.info("%s seed %d step %d: held-out pass@k %s", method, seed, step,
                     {k: round(v, 4) for k, v in ev["pass_at_k"].items()})
        return {f"pass@{k}": v for k, v in ev["pass_at_k"].items()}

    result = loop.run(
        trainer_lib.RLProgram(trainer, model), out,
        fingerprint=rl_fingerprint(cfg, rl, sft_step), resumable=RESUMABLE,
        schedule=loop.Schedule(num_steps=rl.num_steps, checkpoint_every=rl.checkpoint_every,
                               eval_every=int(cfg.eval.every),
                               max_to_keep=rl.max_checkpoints_to_keep, log_every=rl.log_every),
        hooks=loop.Hooks(on_start=on_start, record=counter.record, evaluate=evaluate,
                         log_keys=("reward_mean", "mixed_fraction", "rollouts_min",
                                   "rollouts_max", "kappa_min", "kappa_mean", "loss",
                                   "tokens_per_s", "step_time")),
        stop_after=stop_after)
    log_timing(workdir, f"rl/{method}/seed{seed}", result.seconds)
    return result


# ----------------------------------------------------------------------------- aggregation


def _final_eval(records: list[dict], num_steps: int, num_samples: int) -> dict | None:
    for r in records:
        if r["step"] == num_steps and r["num_samples"] == num_samples and not r.get("curve"):
            return r
    return None


def _mean_spread(values: Sequence[float]) -> tuple[float, float, float, float]:
    v = np.asarray(values, np.float64)
    return (float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, float(v.min()),
            float(v.max()))


def _fmt(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    mean, std, _, _ = _mean_spread(values)
    if len(values) == 1:
        return f"{scale * mean:.{digits}f}"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def aggregate(cfg: ml_collections.ConfigDict, workdir: str, methods: Sequence[str],
              seeds: Sequence[int]) -> dict[str, Any]:
    """Collect finished runs -> `results/comparison.{json,md}` and figures; returns the dict.

    Spread = sample standard deviation over seeds (and min / max in the JSON).
    """
    results_dir = os.path.join(workdir, "results")
    os.makedirs(results_dir, exist_ok=True)
    with open(os.path.join(workdir, "sft", "eval.json")) as f:
        sft_eval = json.load(f)
    num_steps = int(cfg.rl.num_steps)
    n = int(cfg.eval.num_samples)
    table: dict[str, Any] = {"sft": {"pass_at_k": sft_eval["final"]["pass_at_k"],
                                     "pass1_distribution": sft_eval["pass1_distribution"]},
                             "methods": {}, "num_samples": n, "num_steps": num_steps}
    curves: dict[str, list[list[dict]]] = {}
    for method in methods:
        runs = []
        curves[method] = []
        for seed in seeds:
            d = run_dir(workdir, method, seed)
            evals = read_jsonl(os.path.join(d, "eval.jsonl"))
            final = _final_eval(evals, num_steps, n)
            if final is None:
                logging.warning("%s seed %d has no final evaluation; left out", method, seed)
                continue
            train = read_jsonl(os.path.join(d, "train.jsonl"))
            runs.append({"seed": seed, "final": final, "rollouts": final["rollouts"],
                         "tokens": final["tokens"],
                         "reward_mean_last": float(np.mean([r["reward_mean"]
                                                            for r in train[-5:]]))})
            curves[method].append([r for r in evals if not r.get("final_only")])
        if not runs:
            continue
        ks = list(runs[0]["final"]["pass_at_k"])
        entry = {"seeds": [r["seed"] for r in runs], "pass_at_k": {}, "rollouts": {},
                 "tokens": {}}
        for k in ks:
            vals = [r["final"]["pass_at_k"][k] for r in runs]
            entry["pass_at_k"][k] = dict(zip(("mean", "std", "min", "max"), _mean_spread(vals)),
                                         values=vals)
        for field in ("rollouts", "tokens", "reward_mean_last"):
            vals = [r[field] for r in runs]
            entry[field] = dict(zip(("mean", "std", "min", "max"), _mean_spread(vals)),
                                values=vals)
        table["methods"][method] = entry
    write_json(os.path.join(results_dir, "comparison.json"), table)
    md = comparison_markdown(table)
    with open(os.path.join(results_dir, "comparison.md"), "w") as f:
        f.write(md)
    plot_comparison(table, curves, sft_eval, results_dir)
    return table


def comparison_markdown(table: dict[str, Any]) -> str:
    """The pass@k table (percent, mean ± std over seeds) with matched rollouts / tokens."""
    ks = list(table["sft"]["pass_at_k"])
    head = "| method | seeds | " + " | ".join(f"pass@{k}" for k in ks) + \
        " | generated rollouts | generated tokens |"
    lines = [head, "|" + "---|" * (len(ks) + 4)]
    lines.append("| SFT (start) | – | " + " | ".join(
        f"{100 * table['sft']['pass_at_k'][k]:.1f}" for k in ks) + " | 0 | 0 |")
    for method, e in table["methods"].items():
        cells = []
        for k in ks:
            if k in e["pass_at_k"]:
                v = e["pass_at_k"][k]
                cells.append(f"{100 * v['mean']:.1f} ± {100 * v['std']:.1f}")
            else:
                cells.append("–")
        lines.append(f"| {method} | {len(e['seeds'])} | " + " | ".join(cells) +
                     f" | {e['rollouts']['mean']:,.0f} | {e['tokens']['mean']:,.0f} ± "
                     f"{e['tokens']['std']:,.0f} |")
    lines.append("")
    lines.append(f"Held-out mazes, n = {table['num_samples']} samples per maze at the final "
                 f"step ({table['num_steps']} RL steps); mean ± sample std over seeds, percent.")
    return "\n".join(lines) + "\n"


def plot_comparison(table: dict, curves: dict, sft_eval: dict, results_dir: str) -> list[str]:
    """PNG figures: final pass@k vs k per method; pass@1 / pass@k_max vs training rollouts;
    the SFT model's per-maze pass@1 histogram. Returns the file paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    colors = {"uniform": "tab:blue", "sera": "tab:red", "grpo": "tab:gray"}
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ks = [int(k) for k in table["sft"]["pass_at_k"]]
    ax.plot(ks, [table["sft"]["pass_at_k"][str(k)] for k in ks], "k--", label="SFT start")
    for method, e in table["methods"].items():
        kk = [int(k) for k in e["pass_at_k"]]
        mean = np.array([e["pass_at_k"][str(k)]["mean"] for k in kk])
        lo = np.array([e["pass_at_k"][str(k)]["min"] for k in kk])
        hi = np.array([e["pass_at_k"][str(k)]["max"] for k in kk])
        c = colors.get(method)
        ax.plot(kk, mean, "o-", color=c, label=f"{method} ({len(e['seeds'])} seeds)")
        ax.fill_between(kk, lo, hi, color=c, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k")
    ax.set_title("pass@k after RL (band: min-max over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "pass_at_k.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    kmax = str(sft_eval["curve"]["num_samples"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, k in zip(axes, ("1", kmax)):
        for method, runs in curves.items():
            if not runs:
                continue
            c = colors.get(method)
            steps = sorted({r["rollouts"] for r in runs[0]})
            ys = np.array([[next((r["pass_at_k"][k] for r in run if r["rollouts"] == s),
                                 np.nan) for s in steps] for run in runs])
            ax.plot(steps, np.nanmean(ys, 0), "o-", color=c, label=f"{method}")
            ax.fill_between(steps, np.nanmin(ys, 0), np.nanmax(ys, 0), color=c, alpha=0.2)
        ax.set_xlabel("generated training rollouts")
        ax.set_ylabel(f"held-out pass@{k}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("held-out pass@k over RL training (mean, band min-max over seeds)")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "training_curves.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    p = np.asarray(sft_eval["final"]["num_correct"]) / sft_eval["final"]["num_samples"]
    ax.hist(p, bins=np.linspace(0, 1, 21), color="tab:purple")
    ax.set_xlabel("per-maze pass@1 of the SFT policy")
    ax.set_ylabel("held-out mazes")
    ax.set_title(f"SFT start: mean pass@1 {p.mean():.2f}")
    fig.tight_layout()
    paths.append(os.path.join(results_dir, "sft_pass1_hist.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


# ----------------------------------------------------------------------------- entry


def run(cfg: ml_collections.ConfigDict, workdir: str, stage: str = "all",
        methods: Sequence[str] | None = None, seeds: Sequence[int] | None = None
        ) -> dict[str, Any] | None:
    """Run one stage (see the module docstring) after validating everything; returns the
    aggregate for the eval stages. `methods` / `seeds` default to `config.compare`."""
    if stage not in STAGES:
        raise common.StudyError(f"stage={stage!r}; choose from {STAGES}")
    methods = common.parse_methods(",".join(methods) if methods is not None
                                   else cfg.compare.methods, "methods")
    seeds = (list(seeds) if seeds is not None
             else common.parse_list(cfg.compare.seeds, int, "compare.seeds"))
    validate(cfg, methods, seeds)
    workdir = common.prepare_workdir(workdir)
    trainer_lib.initialize_distributed(cfg.rl)
    logging.info("JAX process %d of %d, %d devices", jax.process_index(), jax.process_count(),
                 jax.device_count())
    t0 = time.perf_counter()
    mesh = make_mesh(cfg)
    table = None
    if stage in ("sft", "all"):
        stage_sft(cfg, workdir, mesh)
    if stage in ("rl", "all", "compare"):
        for seed in seeds:
            for method in methods:
                stage_rl(cfg, workdir, method, seed, mesh)
    if stage in ("eval", "all", "compare"):
        table = aggregate(cfg, workdir, methods, seeds)
        logging.info("\n%s", comparison_markdown(table))
    log_timing(workdir, f"stage_{stage}", time.perf_counter() - t0)
    return table
