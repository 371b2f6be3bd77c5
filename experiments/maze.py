r"""Maze navigation: SFT from scratch, then MaxRL (uniform) vs SERA at matched rollout budgets.

    python -m experiments.maze --config=configs/maze/cpu.py --workdir=/tmp/maze_cpu
    python -m experiments.maze --config=configs/maze/cpu.py --workdir=... --stage=rl \
        --methods=sera --seeds=0 --config.rl.num_steps=100

Stages (each resumes / skips finished work, so re-running a killed command continues it):

* `sft`: supervised next-token training on BFS shortest paths (`sera_jax.sft`), then the
  SFT model's evaluation on the held-out mazes (per-maze pass@1 distribution; it is also
  step 0 of every RL curve).
* `rl`: for each method (`config.methods[name]` = overrides of `config.rl`, e.g. the
  allocator) and seed, RL from the SFT checkpoint with the engine's `Trainer`; checkpoints
  every `rl.checkpoint_every` steps and at every evaluation; held-out pass@k every
  `eval.every` steps. Every method generates exactly `P·N0` rollouts per step, so equal
  steps = equal generated rollouts; generated tokens are counted and reported too.
* `eval`: aggregation over seeds -> `results/comparison.md|json`, `results/*.png`.
* `all` = sft + rl + eval; `compare` = rl + eval.

Workdir layout: `sft/` (checkpoints, metrics.jsonl, eval.json), `rl/<method>/seed<s>/`
(checkpoints, tensorboard, train.jsonl, eval.jsonl), `results/`, `timings.jsonl`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from flax import nnx
from ml_collections import config_flags

from sera_jax import sft as sft_lib
from sera_jax import sharding as shd
from sera_jax.checkpoint import Checkpointer
from sera_jax.metrics import pass_at_k_curve
from sera_jax.models.configs import get_config as get_model_config
from sera_jax.models.decoder import Decoder
from sera_jax.records import (
    append_jsonl,
    log_timing,
    read_jsonl,
    write_json,
    write_jsonl,
)
from sera_jax.rl import evaluate as eval_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.tasks import maze as maze_lib

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "maze", "cpu.py")
STAGES = ("sft", "rl", "eval", "all", "compare")


# ----------------------------------------------------------------------------- building


def build_task(cfg: ml_collections.ConfigDict) -> maze_lib.MazeTask:
    """The maze task of `cfg.task` (splits train / eval / sft)."""
    return maze_lib.task_from_config(cfg.task)


def build_model(cfg: ml_collections.ConfigDict) -> Decoder:
    """A freshly initialised policy: the named preset `cfg.model.preset` with overrides."""
    overrides = dict(cfg.model.get("overrides", {}) or {})
    dcfg = get_model_config(cfg.model.preset, **overrides)
    if dcfg.vocab_size != maze_lib.VOCAB_SIZE:
        raise ValueError(f"model vocab_size={dcfg.vocab_size}; the maze vocabulary has "
                         f"{maze_lib.VOCAB_SIZE} ids")
    return Decoder(dcfg, rngs=nnx.Rngs(int(cfg.model.seed)))


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def method_config(cfg: ml_collections.ConfigDict, method: str, seed: int
                  ) -> ml_collections.ConfigDict:
    """The trainer config of one run: `cfg.rl` updated by `cfg.methods[method]`, seed set."""
    if method not in cfg.methods:
        raise ValueError(f"method={method!r} is not in config.methods {sorted(cfg.methods)}")
    rl = copy.deepcopy(cfg.rl)
    rl.update(copy.deepcopy(cfg.methods[method]))
    rl.seed = int(seed)
    return rl


def sft_width(task: maze_lib.MazeTask) -> int:
    """Static SFT row length: the prompt plus the longest answer the task can have."""
    return task.max_prompt_len + maze_lib.max_answer_length(task.size)


def eval_sampling(cfg: ml_collections.ConfigDict, task: maze_lib.MazeTask) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=task.max_new_tokens, temperature=cfg.eval.temperature,
                          stop_ids=tuple(task.stop_ids), pad_id=task.pad_id)


# ----------------------------------------------------------------------------- small I/O


def _truncate_jsonl(path: str, max_step: int) -> None:
    """Keep only records with step <= max_step (work after the last checkpoint is redone)."""
    write_jsonl(path, [r for r in read_jsonl(path) if r["step"] <= max_step])


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
    batch = int(cfg.eval.batch_size)
    if mesh is not None:
        batch = -(-batch // shd.batch_divisor(mesh)) * shd.batch_divisor(mesh)
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
    """Train (or resume / skip) SFT and evaluate it on the held-out mazes."""
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    sft_dir = os.path.join(workdir, "sft")
    os.makedirs(sft_dir, exist_ok=True)
    model = build_model(cfg)
    trainer = sft_lib.SFTTrainer(
        model, cfg.sft, lambda ids: task.sft_examples(cfg.sft.split, ids),
        task.split_size(cfg.sft.split), sft_width(task), task.pad_id, mesh=mesh, workdir=sft_dir)
    if trainer.step < cfg.sft.num_steps:
        metrics_path = os.path.join(sft_dir, "metrics.jsonl")
        if os.path.exists(metrics_path):
            _truncate_jsonl(metrics_path, trainer.step)
        t0 = time.perf_counter()

        def log(step, m):
            logging.info("sft step %d | loss=%.4f grad_norm=%.3g rows/s=%.1f", step, m["loss"],
                         m["grad_norm"], m["rows_per_s"])
            append_jsonl(metrics_path, m)

        trainer.train(log=log)
        log_timing(workdir, "sft_train", time.perf_counter() - t0)
    trainer.ckpt.close()

    eval_path = os.path.join(sft_dir, "eval.json")
    if os.path.exists(eval_path):
        with open(eval_path) as f:
            return json.load(f)
    t0 = time.perf_counter()
    result = {"curve": evaluate_policy(model, task, cfg, cfg.eval.curve_samples, 0, mesh)}
    if cfg.eval.num_samples != cfg.eval.curve_samples:
        result["final"] = evaluate_policy(model, task, cfg, cfg.eval.num_samples, 0, mesh)
    else:
        result["final"] = result["curve"]
    result["pass1_distribution"] = pass1_distribution(result["final"]["num_correct"],
                                                      result["final"]["num_samples"])
    write_json(eval_path, result)
    log_timing(workdir, "sft_eval", time.perf_counter() - t0)
    logging.info("SFT model: pass@1 distribution over held-out mazes %s",
                 result["pass1_distribution"])
    return result


def run_dir(workdir: str, method: str, seed: int) -> str:
    return os.path.join(workdir, "rl", method, f"seed{seed}")


def stage_rl(cfg: ml_collections.ConfigDict, workdir: str, method: str, seed: int, mesh=None,
             stop_after: int | None = None) -> None:
    """One RL run from the SFT checkpoint; resumes from its own latest checkpoint.

    `stop_after` (tests) stops after that many steps of this call, as a kill would.
    """
    task = build_task(cfg)
    mesh = mesh if mesh is not None else make_mesh(cfg)
    rl_cfg = method_config(cfg, method, seed)
    out = run_dir(workdir, method, seed)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(rl_cfg.to_json(indent=1))
    sft_eval_path = os.path.join(workdir, "sft", "eval.json")
    if not os.path.exists(sft_eval_path):
        raise ValueError(f"no SFT evaluation at {sft_eval_path}: run --stage=sft first")

    model = build_model(cfg)
    sft_lib.load_final_params(model, cfg.sft, os.path.join(workdir, "sft"), mesh)
    trainer = trainer_lib.Trainer(rl_cfg, task, model, mesh)
    state = trainer.init_state(model)
    ckpt = Checkpointer(os.path.join(out, "checkpoints"),
                        max_to_keep=rl_cfg.max_checkpoints_to_keep)
    train_path, eval_path = os.path.join(out, "train.jsonl"), os.path.join(out, "eval.jsonl")
    step = 0
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(trainer.abstract_state(state))
        trainer_lib.check_resume_config(meta, rl_cfg, ckpt.directory)
        step = int(meta["step"])
        logging.info("%s seed %d: resumed at step %d", method, seed, step)
    for path in (train_path, eval_path):
        if os.path.exists(path):
            _truncate_jsonl(path, step)
    if step == 0 and not read_jsonl(eval_path):
        with open(sft_eval_path) as f:
            append_jsonl(eval_path, {**json.load(f)["curve"], "rollouts": 0, "tokens": 0})
    tokens = sum(r["generated_tokens"] for r in read_jsonl(train_path))
    writer = trainer_lib.MetricWriter(os.path.join(out, "tensorboard"), rl_cfg.log_every)
    t0, done_here = time.perf_counter(), 0
    every = int(cfg.eval.every)
    try:
        while step < rl_cfg.num_steps and (stop_after is None or done_here < stop_after):
            state, metrics = trainer.step(state)
            step += 1
            done_here += 1
            tokens += metrics["generated_tokens"]
            record = {"step": step, "rollouts": step * trainer.budget, "tokens": tokens,
                      **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                         for k, v in metrics.items()}}
            append_jsonl(train_path, record)
            writer.write(step, metrics)
            final = step == rl_cfg.num_steps
            if final or (every and step % every == 0):
                n = cfg.eval.num_samples if final else cfg.eval.curve_samples
                ev = evaluate_policy(trainer.model(state), task, cfg, n, step, mesh)
                if final and cfg.eval.curve_samples != cfg.eval.num_samples:
                    # The curve keeps one sample size; the final point is also measured so.
                    curve = evaluate_policy(trainer.model(state), task, cfg,
                                            cfg.eval.curve_samples, step, mesh)
                    append_jsonl(eval_path, {**curve, "rollouts": step * trainer.budget,
                                              "tokens": tokens, "curve": True})
                    ev["final_only"] = True
                append_jsonl(eval_path, {**ev, "rollouts": step * trainer.budget,
                                          "tokens": tokens})
                writer.write(step, {f"eval/pass@{k}": v for k, v in ev["pass_at_k"].items()})
                logging.info("%s seed %d step %d: held-out pass@k %s", method, seed, step,
                             {k: round(v, 4) for k, v in ev["pass_at_k"].items()})
            if final or (rl_cfg.checkpoint_every and step % rl_cfg.checkpoint_every == 0) or \
                    (every and step % every == 0):
                ckpt.save(step, state, trainer_lib.checkpoint_meta(rl_cfg, state))
    finally:
        ckpt.close()
        writer.close()
        log_timing(workdir, f"rl/{method}/seed{seed}", time.perf_counter() - t0)


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


# ----------------------------------------------------------------------------- main


def _parse_list(text: str, cast=str) -> list:
    return [cast(x.strip()) for x in str(text).split(",") if x.strip()]


def run_stage(cfg: ml_collections.ConfigDict, workdir: str, stage: str,
              methods: Sequence[str], seeds: Sequence[int]) -> dict[str, Any] | None:
    """Run one stage (see the module docstring); returns the aggregate for eval stages."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}; choose from {STAGES}")
    for m in methods:
        if m not in cfg.methods:
            raise ValueError(f"methods contains {m!r}; config.methods has {sorted(cfg.methods)}")
    if cfg.eval.num_prompts > cfg.task.num_eval:
        raise ValueError(f"config.eval.num_prompts={cfg.eval.num_prompts} exceeds "
                         f"task.num_eval={cfg.task.num_eval}")
    os.makedirs(workdir, exist_ok=True)
    mesh = make_mesh(cfg)
    if stage in ("sft", "all"):
        stage_sft(cfg, workdir, mesh)
    if stage in ("rl", "all", "compare"):
        for seed in seeds:
            for method in methods:
                stage_rl(cfg, workdir, method, seed, mesh)
    if stage in ("eval", "all", "compare"):
        table = aggregate(cfg, workdir, methods, seeds)
        logging.info("\n%s", comparison_markdown(table))
        return table
    return None


def define_flags() -> None:
    """The binary's flags; defined only when run as a program, so tests can import it."""
    config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Experiment config file.")
    flags.DEFINE_string("workdir", None, "Output directory (resumable).", required=True)
    flags.DEFINE_enum("stage", "all", STAGES, "Which stage(s) to run.")
    flags.DEFINE_string("methods", None, "Comma list of config.methods to run "
                        "(default: config.compare.methods).")
    flags.DEFINE_string("seeds", None, "Comma list of RL seeds (default: config.compare.seeds).")


def main(argv: Sequence[str]) -> None:
    del argv
    args = flags.FLAGS
    cfg = args.config
    methods = _parse_list(args.methods or cfg.compare.methods)
    seeds = _parse_list(args.seeds or cfg.compare.seeds, int)
    # Compiled programs persist across processes: a resumed or later stage skips compiles.
    jax.config.update("jax_compilation_cache_dir", os.path.join(args.workdir, ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    t0 = time.perf_counter()
    run_stage(cfg, args.workdir, args.stage, methods, seeds)
    log_timing(args.workdir, f"stage_{args.stage}", time.perf_counter() - t0)


if __name__ == "__main__":
    define_flags()
    app.run(main)
