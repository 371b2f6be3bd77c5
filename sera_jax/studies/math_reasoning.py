r"""The math study: RL of a pretrained LM (any methods of `sera_jax.methods`) on verified
answers, with pass@k before and after.

Stages (each resumes or skips finished work; re-running a killed command continues it):

* `eval`: the initial policy ("before", once) and every method's final checkpoint ("after",
  when present): `eval.num_samples` samples per held-out problem at `eval.temperature` /
  `eval.top_p`, unbiased pass@k for k = 1, 2, 4, ..., n, majority-vote accuracy maj@n;
  then the report `results/pass_at_k.md|json|png`. Evaluations are cached under the
  fingerprint of what they measure (a changed model, task, RL or eval config recomputes).
* `rl`: for each method of `compare.methods`, on-policy RL from the initial policy on the
  one loop (`sera_jax.loop`); per-step records in `rl/<method>/train.jsonl`.
* `all` (default) = eval before, rl, eval after, report.

The policy comes from `config.model` (`sera_jax.models.policy.load_policy`), optionally
followed by the parameters of `model.init_checkpoint` (a checkpoints directory written by
this study with the same model and task config).

Workdir: `eval/initial.json`, `eval/<method>.json`, `rl/<method>/{checkpoints,tensorboard,
train.jsonl,config.json}`, `results/`, `timings.jsonl`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from sera_jax import loop
from sera_jax import sharding as shd
from sera_jax.checkpoint import Checkpointer
from sera_jax.models.configs import CACHE_DTYPE_HELP, CACHE_DTYPE_NAMES, DTYPE_NAMES
from sera_jax.models.decoder import Decoder
from sera_jax.models.policy import MODEL_SOURCES, load_policy
from sera_jax.records import log_timing, read_json, read_jsonl, write_json
from sera_jax.rl import config as rl_config
from sera_jax.rl import evaluate as eval_lib
from sera_jax.rl import trainer as trainer_lib
from sera_jax.sampling import SamplingConfig, generate_rows, left_pad
from sera_jax.studies import common
from sera_jax.tasks.mathqa.task import MathTask, task_from_config

STAGES = ("all", "rl", "eval")
#: `eval.kv_cache_dtype` (added after the first runs) is left out of fingerprints at its
#: default '' (the compute dtype), so earlier runs and cached evaluations stay valid.
EVAL_DEFAULTS = {"kv_cache_dtype": ""}


# ----------------------------------------------------------------------------- building


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    return shd.make_mesh(dict(cfg.rl.mesh))


def build(cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None
          ) -> tuple[Decoder, MathTask, jax.sharding.Mesh]:
    """The initial policy, the task and the mesh of a config."""
    mesh = mesh if mesh is not None else make_mesh(cfg)
    model, tokenizer = load_policy(cfg.model, mesh)
    task = task_from_config(cfg.task, tokenizer)
    logging.info("task: %d train / %d eval problems, prompts <= %d tokens, completions <= %d",
                 task.split_size("train"), task.split_size("eval"), task.max_prompt_len,
                 task.max_new_tokens)
    if cfg.model.init_checkpoint:
        model = restore_policy(run_config(cfg, "uniform"), task, model, mesh,
                               cfg.model.init_checkpoint)
    return model, task, mesh


def run_config(cfg: ml_collections.ConfigDict, method: str) -> ml_collections.ConfigDict:
    """The resolved trainer config of one method (overrides take effect or raise)."""
    return rl_config.with_method(cfg.rl, method)


#: Model options left out of fingerprints at their default (added after the first runs):
#: the layers' layout computes the same function (to float32 tolerance).
MODEL_DEFAULTS = {"scan_layers": False}


def model_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    return loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS)


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict
                   ) -> dict[str, Any]:
    """What defines one RL run: the initial policy, the task and the resolved RL config."""
    return {"model": model_fingerprint(cfg), "task": cfg.task.to_dict(),
            "rl": rl_config.fingerprint(rl)}


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


def validate(cfg: ml_collections.ConfigDict, methods: Sequence[str]) -> None:
    """Every field the stages read, checked before the model loads."""
    c = common.check
    m = cfg.model
    c(m.source in MODEL_SOURCES, "model.source", m.source, f"one of {MODEL_SOURCES}")
    c(m.source == "embedded" or bool(m.path), "model.path", m.path,
      "a GGUF file (source 'gguf') or a Hugging Face directory (source 'hf')")
    for field in ("dtype", "param_dtype"):
        c(m[field] in DTYPE_NAMES, f"model.{field}", m[field], f"one of {DTYPE_NAMES}")
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the study sets it per run from config.compare.methods")
    for method in methods:
        try:
            rl_config.validate(run_config(cfg, method))
        except ValueError as e:
            raise common.StudyError(f"method {method!r}: {e}") from None
    e = cfg.eval
    for field in ("num_samples", "num_prompts", "batch_size"):
        c(common.positive_int(e[field]), f"eval.{field}", e[field], "an integer >= 1")
    c(isinstance(e.temperature, int | float) and np.isfinite(e.temperature) and
      e.temperature >= 0, "eval.temperature", e.temperature, "a finite number >= 0")
    c(isinstance(e.top_p, int | float) and 0 < e.top_p <= 1, "eval.top_p", e.top_p, "(0, 1]")
    c(isinstance(e.top_k, int) and e.top_k >= 0, "eval.top_k", e.top_k, ">= 0")
    c(isinstance(e.max_new_tokens, int) and e.max_new_tokens >= 0, "eval.max_new_tokens",
      e.max_new_tokens, ">= 0 (0 = the task's)")
    c(e.get("kv_cache_dtype", "") in CACHE_DTYPE_NAMES, "eval.kv_cache_dtype",
      e.get("kv_cache_dtype"), CACHE_DTYPE_HELP)


# ----------------------------------------------------------------------------- evaluation


def eval_sampling(cfg: ml_collections.ConfigDict, task: MathTask) -> SamplingConfig:
    """The evaluation sampler: `eval.temperature` / `eval.top_p` / `eval.top_k`, the task's
    length cap (`eval.max_new_tokens` when > 0), stop and pad ids."""
    e = cfg.eval
    return SamplingConfig(
        max_new_tokens=int(e.max_new_tokens) or task.max_new_tokens, temperature=e.temperature,
        top_p=e.top_p, top_k=e.top_k, greedy=e.temperature == 0,
        stop_ids=tuple(task.stop_ids), pad_id=task.pad_id,
        cache_dtype=e.get("kv_cache_dtype", "") or None)


def evaluate_policy(model: Decoder, task: MathTask, cfg: ml_collections.ConfigDict,
                    mesh: jax.sharding.Mesh | None, *, examples: int = 3) -> dict[str, Any]:
    """`eval.num_samples` completions of each of the first `eval.num_prompts` held-out
    problems -> pass@k (k = 1, 2, 4, ..., n), maj@n, per-problem correct counts and a few
    decoded example completions. The key depends on `eval.seed` only, so "before" and
    "after" see the same random numbers (common random numbers)."""
    e = cfg.eval
    ids = np.arange(min(int(e.num_prompts), task.split_size("eval")))
    batch = shd.round_up_to_shards(int(e.batch_size), mesh)
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
        width = shd.round_up_to_shards(min(batch, ids.size * int(e.num_samples)), mesh)
        record["examples"] = sample_examples(model, task, ids[:examples], sampling,
                                             int(e.seed) + 1, width, mesh,
                                             samples_per_prompt=int(e.num_samples),
                                             num_prompts=int(ids.size))
    return record


def sample_examples(model: Decoder, task: MathTask, ids: Sequence[int],
                    sampling: SamplingConfig, seed: int, width: int,
                    mesh: jax.sharding.Mesh | None, samples_per_prompt: int = 1,
                    num_prompts: int = 1) -> list[dict[str, Any]]:
    """One decoded completion (with its reward) per prompt id, for the report.

    Laid out as an evaluation chunk of `width` rows with `samples_per_prompt` rows per
    prompt (the ids repeated to fill it), so on one batch shard the evaluation's compiled
    sampler (same rows, the same `evaluate.prompt_slots` for an evaluation of `num_prompts`
    prompts) is reused; id i is reported from its first row, i * samples_per_prompt.
    """
    ids = [int(i) for i in ids]
    if not ids:
        return []
    n = max(1, min(int(samples_per_prompt), width // len(ids)))
    slots = -(-width // n)  # distinct prompts of an evaluation chunk of `width` rows
    toks, mask = left_pad(task.prompt_tokens("eval", [ids[j % len(ids)] for j in range(slots)]),
                          task.max_prompt_len, task.pad_id)
    row_prompt = np.arange(width) // n
    key = jax.random.key(seed)
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jax.numpy.arange(width,
                                                                         dtype=jax.numpy.uint32))
    out = generate_rows(model, toks, mask, row_prompt, keys, sampling, rows_per_call=width,
                        mesh=mesh,
                        prompt_slots=max(slots, eval_lib.prompt_slots(num_prompts, width, n)))
    first = np.arange(len(ids)) * n  # the first row of each id
    tokens, lengths, truncated = out.tokens[first], out.lengths[first], out.truncated[first]
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


def eval_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    return {"model": model_fingerprint(cfg), "task": cfg.task.to_dict(),
            "eval": loop.trim_fields(cfg.eval.to_dict(), defaults=EVAL_DEFAULTS)}


def stage_eval_initial(cfg, workdir: str, model: Decoder, task: MathTask, mesh) -> dict:
    """Evaluate the initial policy once (`eval/initial.json`, keyed by its fingerprint)."""
    os.makedirs(os.path.join(workdir, "eval"), exist_ok=True)

    def compute() -> dict:
        record = evaluate_policy(model, task, cfg, mesh)
        log_timing(workdir, "eval/initial", record["seconds"])
        logging.info("initial policy: pass@k %s maj@n %s", record["pass_at_k"],
                     record["maj_at_n"])
        return record

    return common.cached_json(os.path.join(workdir, "eval", "initial.json"),
                              eval_fingerprint(cfg), compute)


def stage_rl(cfg, workdir: str, method: str, model: Decoder, task: MathTask, mesh,
             stop_after: int | None = None) -> loop.Result:
    """RL of one method from the initial policy on the one loop; resumes its own checkpoint.

    `stop_after` (tests) stops after that many steps of this call, as a kill would.
    """
    rl = run_config(cfg, method)
    out = run_dir(workdir, method)
    trainer = trainer_lib.Trainer(rl, task, model, mesh)
    counter = common.RolloutCounter(out, trainer.budget)
    result = loop.run(
        trainer_lib.RLProgram(trainer, model), out, fingerprint=rl_fingerprint(cfg, rl),
        resumable=trainer_lib.RESUMABLE,
        schedule=loop.Schedule(num_steps=rl.num_steps, checkpoint_every=rl.checkpoint_every,
                               max_to_keep=rl.max_checkpoints_to_keep, log_every=rl.log_every,
                               async_checkpoint=bool(rl.get("async_checkpoint", False))),
        hooks=loop.Hooks(on_start=counter.on_start, record=counter.record,
                         log_keys=("reward_mean", "mixed_fraction", "kappa_min", "loss",
                                   "tokens_per_s", "step_time")),
        stop_after=stop_after)
    log_timing(workdir, f"rl/{method}", result.seconds)
    return result


def stage_eval_after(cfg, workdir: str, method: str, model: Decoder, task: MathTask,
                     mesh) -> dict | None:
    """Evaluate a method's final checkpoint once (`eval/<method>.json`); None if unfinished."""
    rl = run_config(cfg, method)
    ckpt_dir = os.path.join(run_dir(workdir, method), "checkpoints")
    with Checkpointer(ckpt_dir) as ckpt:
        latest = ckpt.latest_step()
        meta = ckpt.restore_meta(latest) if latest is not None else {}
    if latest is None or latest < rl.num_steps:
        logging.warning("%s: RL not finished (latest checkpoint %s of %d steps); not evaluated",
                        method, latest, rl.num_steps)
        return None
    loop.check_fingerprint(meta.get("fingerprint"), rl_fingerprint(cfg, rl),
                           trainer_lib.RESUMABLE, ckpt_dir)

    def compute() -> dict:
        policy = restore_policy(rl, task, model, mesh, ckpt_dir, rl.num_steps)
        record = evaluate_policy(policy, task, cfg, mesh)
        record["rl_steps"] = int(rl.num_steps)
        train = read_jsonl(os.path.join(run_dir(workdir, method), loop.TRAIN_RECORDS))
        if train:
            record["rollouts"], record["tokens"] = train[-1]["rollouts"], train[-1]["tokens"]
        log_timing(workdir, f"eval/{method}", record["seconds"])
        logging.info("%s after RL: pass@k %s maj@n %s", method, record["pass_at_k"],
                     record["maj_at_n"])
        return record

    fingerprint = {**rl_fingerprint(cfg, rl), "eval": eval_fingerprint(cfg)["eval"]}
    return common.cached_json(os.path.join(workdir, "eval", f"{method}.json"), fingerprint,
                              compute)


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


# ----------------------------------------------------------------------------- entry


def run(cfg: ml_collections.ConfigDict, workdir: str, stage: str = "all",
        mesh: jax.sharding.Mesh | None = None) -> dict[str, Any] | None:
    """Run a stage (see the module docstring) after validating everything; returns the
    report table after `eval`/`all`."""
    if stage not in STAGES:
        raise common.StudyError(f"stage={stage!r} is not one of {STAGES}")
    methods = common.parse_methods(cfg.compare.methods, "config.compare.methods")
    validate(cfg, methods)
    workdir = common.prepare_workdir(workdir)
    trainer_lib.initialize_distributed(cfg.rl)
    logging.info("JAX process %d of %d, %d devices", jax.process_index(), jax.process_count(),
                 jax.device_count())
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
