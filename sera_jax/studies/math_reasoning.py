r"""The math study: RL of a pretrained LM (any methods of `sera_jax.methods`) on verified
answers, with pass@k before and after.

Stages (each resumes or skips finished work; re-running a killed command continues it):

* `eval`: the initial policy ("before", once) and every method's final checkpoint ("after",
  when present): `eval.num_samples` samples per held-out problem at `eval.temperature` /
  `eval.top_p`, unbiased pass@k for k = 1, 2, 4, ..., n, majority-vote accuracy maj@n;
  then the report `results/pass_at_k.md|json|png`. Evaluations are cached under the
  fingerprint of what they measure (a changed model, task, RL or eval config recomputes).
* `rl`: for each method of `compare.methods` (resolved once, with the `rl.allocation.*`
  overrides) and seed of `compare.seeds`, on-policy RL from the initial policy on the one
  loop (`sera_jax.loop`); per-step records in `rl/<run>/train.jsonl`, where a run is named
  by its method (seed 0) or `<method>_seed<k>`.
* `all` (default) = eval before, rl, eval after, report.

The policy comes from `config.model` (`sera_jax.models.policy.load_policy`), optionally
followed by the parameters of `model.init_checkpoint` (a checkpoints directory written by
this study with the same model and task config).

Workdir: `eval/initial.json`, `eval/<run>.json`, `rl/<run>/{checkpoints,tensorboard,
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

from sera_jax import loop, validation
from sera_jax import methods as methods_lib
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
from sera_jax.tasks.mathqa.data import FORMATS, PROMPT_TEMPLATES
from sera_jax.tasks.mathqa.problems import TEMPLATE_NAMES
from sera_jax.tasks.mathqa.task import SOURCES, MathTask, task_from_config

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
    if cfg.model.init_checkpoint:  # any method: only the state's layout is read
        uniform = methods_lib.get_method("uniform")
        model = restore_policy(run_config(cfg, uniform.name), uniform, task, model, mesh,
                               cfg.model.init_checkpoint)
    return model, task, mesh


def run_config(cfg: ml_collections.ConfigDict, method: str, seed: int = 0
               ) -> ml_collections.ConfigDict:
    """The trainer config of one run: `cfg.rl` with `method` (a name) and `seed` set."""
    rl = rl_config.for_method(cfg.rl, method)
    rl.seed = int(seed)
    return rl


def arm(method: str, seed: int) -> str:
    """A run's name (its directory under `rl/` and its `eval/` record): the method for seed 0
    (the layout of runs made before `compare.seeds`), `<method>_seed<k>` otherwise."""
    return method if seed == 0 else f"{method}_seed{seed}"


#: Model options left out of fingerprints at their default (added after the first runs):
#: the layers' layout computes the same function (to float32 tolerance).
MODEL_DEFAULTS = {"scan_layers": False}


def model_fingerprint(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    return loop.trim_fields(cfg.model.to_dict(), defaults=MODEL_DEFAULTS)


def rl_fingerprint(cfg: ml_collections.ConfigDict, rl: ml_collections.ConfigDict,
                   method: methods_lib.Method) -> dict[str, Any]:
    """What defines one RL run: the initial policy, the task, the RL config and its method."""
    return {"model": model_fingerprint(cfg), "task": cfg.task.to_dict(),
            "rl": rl_config.fingerprint(rl, method)}


def restore_policy(rl_cfg: ml_collections.ConfigDict, method: methods_lib.Method,
                   task: MathTask, model: Decoder, mesh, directory: str,
                   step: int | None = None) -> Decoder:
    """`model`'s graph with the parameters of a trainer checkpoint (latest step by default).

    The checkpoint must come from a run with the same model, task split sizes and optimiser
    (`rl_cfg`); otherwise `CheckpointError` lists the mismatching paths.
    """
    trainer = trainer_lib.Trainer(rl_cfg, task, model, mesh, method=method)
    with Checkpointer(directory) as ckpt:
        state, meta = ckpt.restore(trainer.abstract_state(trainer.init_state(model)), step)
    logging.info("policy parameters from %s (step %d)", directory, meta["step"])
    return trainer.model(state)


def validate(cfg: ml_collections.ConfigDict
             ) -> tuple[dict[str, methods_lib.Method], list[int]]:
    """Every field the stages read, checked before any model or data loads; returns the
    compared methods, each resolved once (`compare.methods` with the `rl.allocation.*` /
    `rl.estimator` overrides), and the seeds (`compare.seeds`)."""
    c = common.check
    validate_model(cfg)
    validate_task(cfg)
    c(cfg.rl.method is None, "rl.method", cfg.rl.method,
      "unset: the study sets it per run from config.compare.methods")
    c(cfg.rl.seed == 0, "rl.seed", cfg.rl.seed,
      "0 (unset): the study sets it per run from config.compare.seeds")
    names = common.method_names(cfg.compare.methods, "compare.methods")
    seeds = common.nonempty(common.int_list(cfg.compare.seeds, "compare.seeds"),
                            "compare.seeds")
    c(len(set(seeds)) == len(seeds), "compare.seeds", cfg.compare.seeds, "distinct seeds")
    methods = {}
    for name in names:
        rl = run_config(cfg, name)
        try:
            methods[name] = rl_config.method(rl)
            rl_config.validate(rl, methods[name])
        except ValueError as e:
            raise common.StudyError(f"method {name!r}: {e}") from None
    e = cfg.eval
    for field in ("num_samples", "num_prompts", "batch_size"):
        c(validation.is_positive_int(e[field]), f"eval.{field}", e[field], "an integer >= 1")
    c(validation.is_number(e.temperature) and e.temperature >= 0, "eval.temperature",
      e.temperature, "a finite number >= 0")
    c(validation.is_number(e.top_p) and 0 < e.top_p <= 1, "eval.top_p", e.top_p, "(0, 1]")
    c(validation.is_int(e.top_k) and e.top_k >= 0, "eval.top_k", e.top_k, ">= 0")
    c(validation.is_int(e.max_new_tokens) and e.max_new_tokens >= 0, "eval.max_new_tokens",
      e.max_new_tokens, ">= 0 (0 = the task's)")
    c(validation.is_int(e.seed), "eval.seed", e.seed, "an integer")
    c(e.get("kv_cache_dtype", "") in CACHE_DTYPE_NAMES, "eval.kv_cache_dtype",
      e.get("kv_cache_dtype"), CACHE_DTYPE_HELP)
    return methods, seeds


def validate_model(cfg: ml_collections.ConfigDict) -> None:
    """The `model` block of a pretrained policy: source, path, dtypes (StudyError naming the
    field); shared with the paired study on a pretrained LM (`maze.lm`)."""
    c, m = common.check, cfg.model
    c(m.source in MODEL_SOURCES, "model.source", m.source, f"one of {MODEL_SOURCES}")
    c(m.source == "embedded" or bool(m.path), "model.path", m.path,
      "a GGUF file (source 'gguf') or a Hugging Face directory (source 'hf')")
    for field in ("dtype", "param_dtype"):
        c(m[field] in DTYPE_NAMES, f"model.{field}", m[field], f"one of {DTYPE_NAMES}")


def validate_task(cfg: ml_collections.ConfigDict) -> None:
    """The `task` block (`mathqa.task.task_config`) and the batch it must fill: P =
    `rl.prompts_per_step` distinct training problems per step, so `task.num_train` (or
    `task.train_limit` for files) >= P. StudyError naming the field."""
    c = common.check
    t = cfg.task
    is_int, pos = validation.is_int, validation.is_positive_int
    c(t.source in SOURCES, "task.source", t.source, f"one of {SOURCES}")
    p = cfg.rl.prompts_per_step
    if t.source == "arithmetic":
        for field in ("num_train", "num_eval"):
            c(pos(t[field]), f"task.{field}", t[field], "an integer >= 1")
        c(is_int(t.seed), "task.seed", t.seed, "an integer")
        c(isinstance(t.steps, tuple | list) and len(t.steps) > 0 and all(
            pos(x) for x in t.steps), "task.steps", t.steps, "a tuple of integers >= 1")
        names = [x.strip() for x in str(t.templates or "").split(",") if x.strip()]
        c(isinstance(t.templates, str) and set(names) <= set(TEMPLATE_NAMES), "task.templates",
          t.templates, f"'' (all) or a comma-separated subset of {TEMPLATE_NAMES}")
        c(not pos(p) or p <= t.num_train, "task.num_train", t.num_train,
          f">= rl.prompts_per_step={p} (each step takes P distinct training problems)")
    else:
        for split in ("train", "eval"):
            path = t[f"{split}_path"]
            c(isinstance(path, str) and bool(path), f"task.{split}_path", path,
              "a GSM8K/MATH .jsonl/.parquet file or directory (source 'files')")
            c(is_int(t[f"{split}_limit"]) and t[f"{split}_limit"] >= 0, f"task.{split}_limit",
              t[f"{split}_limit"], "an integer >= 0 (0 = all)")
            levels = t[f"{split}_levels"]
            c(levels is None or (isinstance(levels, tuple | list) and all(
                is_int(x) for x in levels)), f"task.{split}_levels", levels,
              "None (all) or a tuple of integer levels")
        c(t.format in FORMATS, "task.format", t.format, f"one of {FORMATS}")
        c(not (pos(p) and t.train_limit) or p <= t.train_limit, "task.train_limit",
          t.train_limit, f"0 (all) or >= rl.prompts_per_step={p}")
    c(t.template in PROMPT_TEMPLATES, "task.template", t.template,
      f"one of {sorted(PROMPT_TEMPLATES)}")
    c(validation.is_bool(t.chat), "task.chat", t.chat, "True or False")
    c(validation.is_bool(t.get("stop_at_newline", False)), "task.stop_at_newline",
      t.get("stop_at_newline"), "True or False")
    c(t.system is None or isinstance(t.system, str), "task.system", t.system,
      "None (the model's default) or a string")
    c(pos(t.max_new_tokens), "task.max_new_tokens", t.max_new_tokens, "an integer >= 1")
    c(is_int(t.max_prompt_len) and t.max_prompt_len >= 0, "task.max_prompt_len",
      t.max_prompt_len, "an integer >= 0 (0 = no cap)")
    c(pos(t.grade_timeout_s), "task.grade_timeout_s", t.grade_timeout_s, "an integer >= 1")


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


def run_dir(workdir: str, name: str) -> str:
    """`rl/<name>` of a run (`arm(method, seed)`)."""
    return os.path.join(workdir, "rl", name)


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


def stage_rl(cfg, workdir: str, method: methods_lib.Method, seed: int, model: Decoder,
             task: MathTask, mesh, stop_after: int | None = None) -> loop.Result:
    """RL of one method and seed from the initial policy on the one loop; resumes its own
    checkpoint. `stop_after` (tests) stops after that many steps of this call, as a kill
    would."""
    rl = run_config(cfg, method.name, seed)
    name = arm(method.name, seed)
    out = run_dir(workdir, name)
    trainer = trainer_lib.Trainer(rl, task, model, mesh, method=method)
    counter = common.RolloutCounter(out, trainer.budget)
    result = loop.run(
        trainer_lib.RLProgram(trainer, model), out,
        fingerprint=rl_fingerprint(cfg, rl, method),
        resumable=trainer_lib.RESUMABLE,
        schedule=loop.Schedule(num_steps=rl.num_steps, checkpoint_every=rl.checkpoint_every,
                               max_to_keep=rl.max_checkpoints_to_keep, log_every=rl.log_every,
                               async_checkpoint=bool(rl.get("async_checkpoint", False))),
        hooks=loop.Hooks(on_start=counter.on_start, record=counter.record,
                         log_keys=("reward_mean", "mixed_fraction", "kappa_min", "loss",
                                   "tokens_per_s", "step_time")),
        stop_after=stop_after)
    log_timing(workdir, f"rl/{name}", result.seconds)
    return result


def stage_eval_after(cfg, workdir: str, method: methods_lib.Method, seed: int, model: Decoder,
                     task: MathTask, mesh) -> dict | None:
    """Evaluate a run's final checkpoint once (`eval/<arm>.json`); None if unfinished."""
    rl = run_config(cfg, method.name, seed)
    name = arm(method.name, seed)
    ckpt_dir = os.path.join(run_dir(workdir, name), "checkpoints")
    with Checkpointer(ckpt_dir) as ckpt:
        latest = ckpt.latest_step()
        meta = ckpt.restore_meta(latest) if latest is not None else {}
    if latest is None or latest < rl.num_steps:
        logging.warning("%s: RL not finished (latest checkpoint %s of %d steps); not evaluated",
                        name, latest, rl.num_steps)
        return None
    fingerprint = rl_fingerprint(cfg, rl, method)
    loop.check_fingerprint(meta.get("fingerprint"), fingerprint, trainer_lib.RESUMABLE, ckpt_dir)

    def compute() -> dict:
        policy = restore_policy(rl, method, task, model, mesh, ckpt_dir, rl.num_steps)
        record = evaluate_policy(policy, task, cfg, mesh)
        record["rl_steps"] = int(rl.num_steps)
        train = read_jsonl(os.path.join(run_dir(workdir, name), loop.TRAIN_RECORDS))
        if train:
            record["rollouts"], record["tokens"] = train[-1]["rollouts"], train[-1]["tokens"]
        log_timing(workdir, f"eval/{name}", record["seconds"])
        logging.info("%s after RL: pass@k %s maj@n %s", name, record["pass_at_k"],
                     record["maj_at_n"])
        return record

    return common.cached_json(os.path.join(workdir, "eval", f"{name}.json"),
                              {**fingerprint, "eval": eval_fingerprint(cfg)["eval"]}, compute)


# ----------------------------------------------------------------------------- report


def report(cfg, workdir: str, methods: Sequence[str]) -> dict[str, Any]:
    """`results/pass_at_k.{json,md,png}` from the finished evaluations and training logs of
    the runs `methods` (names `arm(method, seed)`)."""
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
    """Run a stage (see the module docstring) after validating everything (before any model
    or data loads); returns the report table after `eval`/`all`, with `summary` (the
    pass@k markdown)."""
    if stage not in STAGES:
        raise common.StudyError(f"stage={stage!r} is not one of {STAGES}")
    methods, seeds = validate(cfg)
    runs = [(m, seed) for m in methods.values() for seed in seeds]
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
        for method, seed in runs:
            stage_rl(cfg, workdir, method, seed, model, task, mesh)
    if stage in ("all", "eval"):
        for method, seed in runs:
            stage_eval_after(cfg, workdir, method, seed, model, task, mesh)
        table = report(cfg, workdir, [arm(m.name, seed) for m, seed in runs])
        with open(os.path.join(workdir, "results", "pass_at_k.md")) as f:
            summary = f.read()
        return {**table, "summary": summary}
    return None
